"""Pods as the quota line's release touches them: a JSON Patch that removes one
scheduling gate (guarded by ``test`` ops), an Event on a waiting pod, the workload of a
gang (a Job, a training workload), the webhook's own identity (a SelfSubjectReview),
which pod holds a name now, and the leader's label on its own pod.

RBAC: ``patch`` and ``get`` on pods (the gate removal is a pod update, as is the leader's
label on its own pod; a create of a name the cache sees taken is checked against the pod
stored under it), ``create`` on events, ``get`` on jobs and on the training kinds whose
pods make gangs. A SelfSubjectReview is allowed to every authenticated user (the
``system:basic-user`` ClusterRole).
"""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client

from webhook.libs.kube.api import Conflict, NotFound, json_object, translated
from webhook.libs.kube.events import write_event


class Pods:
    def __init__(self, api: client.ApiClient, timeout: float = 5.0,
                 component: str = "gpu-webhook", instance: str = "") -> None:
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.timeout = timeout
        self.component, self.instance = component, instance

    def patch(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        """Apply a JSON Patch to a pod. A ``test`` that fails (the pod was replaced, or
        its gate is gone: HTTP 422) is a :class:`Conflict`; a pod gone, NotFound."""
        what = f"remove the quota gate of pod {namespace}/{name}"
        # A list body is sent as application/json-patch+json by the client.
        with translated(what, self.timeout, {422: Conflict}):
            self.core.patch_namespaced_pod(name, namespace, ops,
                                           _request_timeout=self.timeout)

    def label(self, namespace: str, name: str, key: str, value: str | None) -> None:
        """Set (or with None remove) one label of a pod: the leader replica marks its own
        pod, which a Service selecting that label then sends every review to."""
        what = f"label pod {namespace}/{name}"
        # A mapping body is sent as a merge patch: a null value removes the label.
        with translated(what, self.timeout):
            self.core.patch_namespaced_pod(name, namespace,
                                           {"metadata": {"labels": {key: value}}},
                                           _request_timeout=self.timeout)

    def holder(self, name: str) -> str | None:
        """The uid of the pod stored under ``name`` ("namespace/name") now; None when no
        pod holds it."""
        namespace, _, pod = name.partition("/")
        try:
            with translated(f"read pod {name}", self.timeout):
                got = self.core.read_namespaced_pod(pod, namespace,
                                                    _request_timeout=self.timeout)
        except NotFound:
            return None
        return str(got.metadata.uid) if got.metadata and got.metadata.uid else None

    def event(self, pod: dict[str, Any], reason: str, message: str,
              kind: str = "Normal") -> None:
        """A core/v1 Event on the pod (``kubectl describe pod`` lists it)."""
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        write_event(self.core, ns, {"apiVersion": "v1", "kind": "Pod", "namespace": ns,
                                    "name": name, "uid": meta.get("uid")},
                    reason, message, kind, component=self.component,
                    instance=self.instance, timeout=self.timeout)

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        """A batch/v1 Job as a plain dict (the size of a waiting gang)."""
        what = f"read job {namespace}/{name}"
        with translated(what, self.timeout):
            resp: Any = self.batch.read_namespaced_job(
                name, namespace, _preload_content=False, _request_timeout=self.timeout)
        return json_object(what, resp.data)

    def workload(self, group: str, version: str, resource: str, namespace: str,
                 name: str) -> dict[str, Any]:
        """A training workload (a custom object) as a plain dict (a waiting gang's size)."""
        what = f"read {resource.removesuffix('s')} {namespace}/{name}"
        with translated(what, self.timeout):
            resp: Any = self.custom.get_namespaced_custom_object(
                group, version, namespace, resource, name, _preload_content=False,
                _request_timeout=self.timeout)
        return json_object(what, resp.data)


def whoami(api: client.ApiClient, timeout: float = 5.0) -> str:
    """The username this client's requests are authenticated as (what the API server
    writes in an AdmissionReview's ``userInfo.username`` for them)."""
    auth = client.AuthenticationV1Api(api)
    with translated("ask the API server who the webhook is (SelfSubjectReview)", timeout):
        resp: Any = auth.create_self_subject_review(
            cast(Any, {"apiVersion": "authentication.k8s.io/v1",
                       "kind": "SelfSubjectReview"}),
            _preload_content=False, _request_timeout=timeout)
    body = json_object("SelfSubjectReview", resp.data)
    user = ((body.get("status") or {}).get("userInfo") or {}).get("username")
    return str(user or "")

