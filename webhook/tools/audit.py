"""``gpu-webhook audit``: what the current (or a candidate) policy would refuse or change
among the GPU pods and workloads already running, read once through the kubeconfig.

The deciding is :mod:`webhook.admission.audit` (the admission pipeline itself, as the server's
periodic audit runs it); this module reads the cluster for it.
"""

from __future__ import annotations

from typing import Any

from webhook.admission.audit import Finding, audit
from webhook.engine.routes.sights import node_lookup
from webhook.libs import kube

__all__ = ["Finding", "audit", "node_lookup", "read", "read_all"]

def read(api: Any, namespace: str | None) -> tuple[list[dict[str, Any]],
                                                   list[dict[str, Any]],
                                                   dict[str, dict[str, str]]]:
    """Pods, workloads (kind and apiVersion set, as a list omits them) and namespace
    labels, from the cluster."""
    pods, workloads, labels, _ = read_all(api, namespace)
    return pods, workloads, labels


def read_all(api: Any, namespace: str | None) -> tuple[list[dict[str, Any]],
                                                       list[dict[str, Any]],
                                                       dict[str, dict[str, str]],
                                                       list[dict[str, Any]]]:
    """As :func:`read`, and the nodes (which carry GPUs: the routes pods hold)."""
    pods = kube.list_typed(api, "pods", namespace)
    workloads = [w for resource in kube.AUDITED_WORKLOADS
                 for w in kube.list_typed(api, resource, namespace)]
    labels = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {})
              for n in kube.list_objects(api, "namespaces")}
    nodes = kube.list_objects(api, "nodes")
    return pods, workloads, labels, nodes
