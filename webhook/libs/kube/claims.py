"""One DRA ResourceClaim or ResourceClaimTemplate read as a plain dict: what admission
reads when a pod names one the watch has not delivered yet (the two applied together,
as ``kubectl apply -f`` of one file does); and one PodGroup, whose gang a pod joins."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from webhook.libs.kube.api import NotFound, json_object, translated


class ResourceClaims:
    """Read one ResourceClaim or ResourceClaimTemplate (``resource.k8s.io/v1``).
    RBAC: get on resourceclaims and resourceclaimtemplates."""

    def __init__(self, api: client.ApiClient) -> None:
        resource = client.ResourceV1Api(api)
        self._read: dict[str, Callable[..., Any]] = {
            "ResourceClaim": resource.read_namespaced_resource_claim,
            "ResourceClaimTemplate": resource.read_namespaced_resource_claim_template,
        }

    def read(self, kind: str, namespace: str, name: str, timeout: float
             ) -> dict[str, Any] | None:
        """The object, or None when the API server has none of that name. Raises
        KubeError (Unreachable) when it cannot say within ``timeout``."""
        what = f"read {kind} {namespace}/{name}"
        try:
            with translated(what, timeout):
                resp: Any = self._read[kind](name, namespace, _preload_content=False,
                                             _request_timeout=timeout)
        except NotFound:
            return None
        return json_object(what, resp.data)


class PodGroups:
    """Read one PodGroup of the core gang API (``scheduling.k8s.io/v1beta1``): a gang's
    size, read at its first pod. RBAC: get on podgroups."""

    def __init__(self, api: client.ApiClient) -> None:
        self._read = client.SchedulingV1beta1Api(api).read_namespaced_pod_group

    def read(self, namespace: str, name: str, timeout: float) -> dict[str, Any] | None:
        """The PodGroup, or None when the API server has none of that name (or serves
        no PodGroups: the gate ``GenericWorkload`` is off)."""
        what = f"read PodGroup {namespace}/{name}"
        try:
            with translated(what, timeout):
                resp: Any = self._read(name, namespace, _preload_content=False,
                                       _request_timeout=timeout)
        except NotFound:
            return None
        return json_object(what, resp.data)
