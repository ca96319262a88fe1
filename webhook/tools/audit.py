"""``gpu-webhook audit``: what the current (or a candidate) policy would refuse or change
among the GPU pods and workloads already running, read once through the kubeconfig.

Each object goes through the admission pipeline itself (:func:`through_both`: mutating,
the patch applied, validating with quota), so it is decided exactly as the webhook
would decide its creation today. Pods are admitted oldest first into one usage store:
after a cap is lowered, the pods beyond it (the newest) are the ones listed as over it.
Workloads (Deployments, StatefulSets, Jobs) are checked on their own, so only what can
never fit, or breaks a rule, is reported for them; their pods are counted as pods.
Audit asks as a plain developer: exemptions by user or group are not known afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.engine.charge import TERMINAL_PHASES
from webhook.engine.target import NamespaceLabels
from webhook.k8s.review import request_review
from webhook.libs import kube
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.store import MemoryStore
from webhook.tools.offline import Outcome, through_both

WORKLOADS = ("deployments", "statefulsets", "jobs")
_KIND = {"deployments": ("apps/v1", "Deployment"), "statefulsets": ("apps/v1", "StatefulSet"),
         "jobs": ("batch/v1", "Job")}


@dataclass(frozen=True, slots=True)
class Finding:
    subject: str  # "pod team-a/trainer-0", "deployment team-a/web"
    verdict: str  # "refused" or "changed" (admitted, with a patch or warnings)
    detail: str  # the denial, or the changes and warnings


def audit(policy: CompiledPolicy, pods: Iterable[dict[str, Any]],
          workloads: Iterable[dict[str, Any]], labels: NamespaceLabels) -> list[Finding]:
    """Every object the policy would refuse (or admit changed), in the order decided."""
    out: list[Finding] = []
    store = MemoryStore(ttl=1e9)  # reservations stand for the pods: they never expire here
    live = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL_PHASES]
    live.sort(key=lambda p: (str(p["metadata"].get("creationTimestamp") or ""),
                             str(p["metadata"].get("namespace")), str(p["metadata"]["name"])))
    for pod in live:
        out += _decided(pod, policy, labels, store)
    for obj in workloads:
        out += _decided(obj, policy, labels, MemoryStore())
    return out


def _decided(obj: dict[str, Any], policy: CompiledPolicy, labels: NamespaceLabels,
             store: MemoryStore) -> list[Finding]:
    meta = obj["metadata"]
    subject = f"{str(obj['kind']).lower()} {meta.get('namespace')}/{meta['name']}"
    stripped = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "spec": obj.get("spec"),
                "metadata": {k: meta[k] for k in ("name", "namespace", "labels",
                                                   "annotations", "ownerReferences")
                             if k in meta}}
    body = orjson.dumps(request_review(stripped, uid=str(meta.get("uid") or subject)))
    o: Outcome = through_both(body, policy, labels, store)
    if not o.allowed:
        return [Finding(subject, "refused", o.message)]
    changes = o.mutating.mutations
    if changes or o.warnings:
        detail = "; ".join(([f"would change: {', '.join(changes)}"] if changes else [])
                           + o.warnings)
        return [Finding(subject, "changed", detail)]
    return []


def read(api: Any, namespace: str | None) -> tuple[list[dict[str, Any]],
                                                   list[dict[str, Any]],
                                                   dict[str, dict[str, str]]]:
    """Pods, workloads (kind and apiVersion set, as a list omits them) and namespace
    labels, from the cluster."""
    pods = kube.list_objects(api, "pods", namespace)
    for p in pods:
        p.setdefault("apiVersion", "v1")
        p.setdefault("kind", "Pod")
    workloads = []
    for resource in WORKLOADS:
        api_version, kind = _KIND[resource]
        for w in kube.list_objects(api, resource, namespace):
            w["apiVersion"], w["kind"] = api_version, kind
            workloads.append(w)
    labels = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {})
              for n in kube.list_objects(api, "namespaces")}
    return pods, workloads, labels
