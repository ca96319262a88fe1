"""A pod waiting for GPU quota: the scheduling gate that holds it, and how it is read.

A tenant in ``overQuota: wait`` has its pods that do not fit now admitted with the gate
:data:`GATE` in ``spec.schedulingGates`` (only a CREATE can add a gate; an UPDATE can
only remove one), and the annotation :data:`REASON` saying why. The scheduler leaves a
gated pod alone (no FailedScheduling, no autoscaler), and quota does not charge it: the
cluster cache counts it as holding nothing (``webhook.engine.charge``), and the
validating webhook checks it only against the caps (can it *ever* fit?). The leader
replica commits its charge to the ledger and only then removes the gate
(``webhook.server.leading.release``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.k8s.identity import ObjectId
from webhook.k8s.patch import Patch

GATE = "gpu-webhook.dev/quota"
REASON = "gpu-webhook.dev/waiting"  # annotation: why the pod waits, in words


def gates(pod: Mapping[str, Any]) -> list[Any]:
    spec = pod.get("spec")
    found = spec.get("schedulingGates") if isinstance(spec, dict) else None
    return found if isinstance(found, list) else []


def gate_index(pod: Mapping[str, Any]) -> int | None:
    """Where our gate is in ``spec.schedulingGates``, or None when the pod has none."""
    for i, g in enumerate(gates(pod)):
        if isinstance(g, dict) and g.get("name") == GATE:
            return i
    return None


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod waits behind our gate (a gate of someone else's does not count)."""
    return gate_index(pod) is not None


def gate(pod: dict[str, Any], reason: str, patch: Patch) -> None:
    """Add our gate and the reason annotation, recording the patch; a pod gated already
    (a reinvocation of the mutating webhook) is left as it is."""
    if is_gated(pod):
        return
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return  # not a pod the engine could read; it was refused before this
    patch.append(spec, "schedulingGates", "/spec", {"name": GATE})
    patch.put(pod, "", ("metadata", "annotations", REASON), reason)


def ungated(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy of the pod without our gate: what it is once released (for its
    charge), the original untouched."""
    out = dict(pod)
    spec = pod.get("spec")
    if isinstance(spec, dict):
        rest = [g for g in gates(pod) if not (isinstance(g, dict) and g.get("name") == GATE)]
        out["spec"] = {**spec, "schedulingGates": rest} if rest else {
            k: v for k, v in spec.items() if k != "schedulingGates"}
    return out


def ungate_ops(pod: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The JSON Patch that removes our gate alone, guarded by ``test`` ops (the pod's uid,
    and our gate at that index): if the pod was replaced, or its gates moved, the API
    server refuses the patch instead of removing someone else's gate. None: not gated."""
    i = gate_index(pod)
    uid = ObjectId.of(pod).uid
    if i is None or not uid:
        return None
    path = f"/spec/schedulingGates/{i}"
    return [{"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": path, "value": {"name": GATE}},
            {"op": "remove", "path": path}]
