"""One DRA ResourceClaim or ResourceClaimTemplate read as a plain dict: what admission
reads when a pod names one the watch has not delivered yet (the two applied together,
as ``kubectl apply -f`` of one file does), or the PodGroup a pod joins."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from webhook.libs.kube.api import NotFound, json_object, translated


class ResourceClaims:
    """Read one ResourceClaim or ResourceClaimTemplate (``resource.k8s.io/v1``), or the
    PodGroup (``scheduling.k8s.io/v1beta1``) whose claims and gang a pod joins and the
    CompositePodGroups (``v1alpha3``) above it. RBAC: get on resourceclaims,
    resourceclaimtemplates, podgroups and compositepodgroups."""

    def __init__(self, api: client.ApiClient) -> None:
        resource = client.ResourceV1Api(api)
        self._read: dict[str, Callable[..., Any]] = {
            "ResourceClaim": resource.read_namespaced_resource_claim,
            "ResourceClaimTemplate": resource.read_namespaced_resource_claim_template,
            "PodGroup": client.SchedulingV1beta1Api(api).read_namespaced_pod_group,
            "CompositePodGroup":
                client.SchedulingV1alpha3Api(api).read_namespaced_composite_pod_group,
        }

    def read(self, kind: str, namespace: str, name: str, timeout: float
             ) -> dict[str, Any] | None:
        """The object, or None when the API server has none of that name (or does not
        serve the kind: PodGroups need the gate ``GenericWorkload``). Raises KubeError
        (Unreachable) when it cannot say within ``timeout``."""
        what = f"read {kind} {namespace}/{name}"
        try:
            with translated(what, timeout):
                resp: Any = self._read[kind](name, namespace, _preload_content=False,
                                             _request_timeout=timeout)
        except NotFound:
            return None
        return json_object(what, resp.data)

