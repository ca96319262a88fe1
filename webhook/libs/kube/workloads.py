"""Workloads and pods read as plain dicts: the workload of a scale request, and the
lists the audit and the status command read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from webhook.libs.kube.api import KubeError, json_object, translated


class Workloads:
    """Read one apps/v1 workload (for a scale request: its pod template) as a plain dict.
    RBAC: get on deployments, statefulsets and replicasets."""

    def __init__(self, api: client.ApiClient) -> None:
        apps = client.AppsV1Api(api)
        self._read: dict[str, Callable[..., Any]] = {
            "deployments": apps.read_namespaced_deployment,
            "statefulsets": apps.read_namespaced_stateful_set,
            "replicasets": apps.read_namespaced_replica_set,
        }

    def read(self, resource: str, namespace: str, name: str, timeout: float
             ) -> dict[str, Any]:
        what = f"read {resource.removesuffix('s')} {namespace}/{name}"
        fn = self._read.get(resource)
        if fn is None:
            raise KubeError(what, "not an apps/v1 workload this webhook reads")
        with translated(what, timeout):
            resp: Any = fn(name, namespace, _preload_content=False, _request_timeout=timeout)
        return json_object(what, resp.data)


def list_objects(api: client.ApiClient, kind: str, namespace: str | None = None,
                 label_selector: str = "", timeout: float = 15.0) -> list[dict[str, Any]]:
    """One list of pods, namespaces, nodes, configmaps, deployments, statefulsets or jobs (in
    ``namespace``, or every namespace), as plain dicts: for the one-shot tools
    (``gpu-webhook status``, ``audit``), not the watches."""
    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    calls: dict[str, tuple[Callable[..., Any], Callable[..., Any] | None]] = {
        "pods": (core.list_pod_for_all_namespaces, core.list_namespaced_pod),
        "deployments": (apps.list_deployment_for_all_namespaces, apps.list_namespaced_deployment),
        "statefulsets": (apps.list_stateful_set_for_all_namespaces,
                         apps.list_namespaced_stateful_set),
        "jobs": (batch.list_job_for_all_namespaces, batch.list_namespaced_job),
        "configmaps": (core.list_config_map_for_all_namespaces,
                       core.list_namespaced_config_map),
        "namespaces": (core.list_namespace, None),
        "nodes": (core.list_node, None),
    }
    every, one = calls[kind]
    where = f"{kind} in {namespace}" if namespace else f"{kind} in all namespaces"
    kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": timeout}
    if label_selector:
        kw["label_selector"] = label_selector
    with translated(f"list {where}", timeout):
        resp = one(namespace, **kw) if namespace and one else every(**kw)
        body = json_object(f"list {where}", resp.data)
    return list(body.get("items") or ())


AUDITED_WORKLOADS = ("deployments", "statefulsets", "jobs")


_TYPES = {"pods": ("v1", "Pod"), "deployments": ("apps/v1", "Deployment"),
          "statefulsets": ("apps/v1", "StatefulSet"), "jobs": ("batch/v1", "Job")}


def list_typed(api: client.ApiClient, kind: str, namespace: str | None = None,
               timeout: float = 30.0) -> list[dict[str, Any]]:
    """:func:`list_objects` of pods or a workload kind, each item with the apiVersion
    and kind a list leaves out (what the audit hands the admission pipeline)."""
    api_version, typ = _TYPES[kind]
    items = list_objects(api, kind, namespace, timeout=timeout)
    for item in items:
        item["apiVersion"], item["kind"] = api_version, typ
    return items
