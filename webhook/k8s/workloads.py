"""Where the pod spec lives in each kind of object the webhook is sent.

A Pod carries its spec at ``/spec``; Deployments, ReplicaSets, StatefulSets, DaemonSets
and Jobs at ``/spec/template/spec``; CronJobs one level deeper. Checking the template
when the workload itself is applied is what lets ``kubectl apply`` show the developer
a problem that would otherwise only appear as an event on a ReplicaSet or Job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.k8s.objects import MalformedObject, child_map

# (API group, kind) -> path of the pod template (metadata + spec) inside the object,
# or () for a Pod, whose own metadata/spec are the "template".
TEMPLATE_PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "Pod"): (),
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}


@dataclass(slots=True)
class PodTemplate:
    """A pod's metadata and spec inside an object, with the JSON Pointers to them."""

    kind: str  # Pod, Deployment, ... (as sent)
    is_pod: bool
    holder: dict[str, Any]  # the mapping that holds "metadata" and "spec"
    pointer: str  # JSON Pointer of ``holder`` ("" for a Pod)
    spec: dict[str, Any]

    @property
    def spec_pointer(self) -> str:
        return self.pointer + "/spec"

    @property
    def metadata(self) -> dict[str, Any] | None:
        return child_map(self.holder, "metadata", self.pointer)


def pod_template(group: str, kind: str, obj: dict[str, Any]) -> PodTemplate | None:
    """The pod template of ``obj``, or None if the kind carries none or it is absent.

    Raises MalformedObject when a level on the way has the wrong JSON type.
    """
    path = TEMPLATE_PATHS.get((group, kind))
    if path is None:
        return None
    holder: dict[str, Any] = obj
    ptr = ""
    for key in path:
        nxt = child_map(holder, key, ptr)
        if nxt is None:
            return None
        holder, ptr = nxt, f"{ptr}/{key}"
    spec = child_map(holder, "spec", ptr)
    if spec is None:
        return None
    return PodTemplate(kind, path == (), holder, ptr, spec)


def replicas(group: str, kind: str, obj: dict[str, Any]) -> int:
    """How many pods of the template run at once (replicas, or a Job's parallelism)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return 1
    if kind == "CronJob":
        job = spec.get("jobTemplate", {}).get("spec", {}) if isinstance(
            spec.get("jobTemplate"), dict) else {}
        spec = job if isinstance(job, dict) else {}
    key = "parallelism" if kind in ("Job", "CronJob") else "replicas"
    value = spec.get(key, 1)
    if kind in ("Job", "CronJob") and isinstance(spec.get("completions"), int):
        # A Job never runs more pods at once than it has completions left.
        comp = spec["completions"]
        value = min(value, comp) if isinstance(value, int) else comp
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedObject(f"/spec/{key}", "a non-negative integer")
    return value
