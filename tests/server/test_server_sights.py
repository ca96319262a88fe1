"""What the node and PriorityClass watches tell the GPU routes' checks
(``webhook.server.cluster.SightCache``): a node carries GPUs by its capacity, its
product label or a GPU taint; a PriorityClass's value and preemption policy; a relist
starts from nothing, and nothing is known before the first list (a ``nodeName`` is then
refused, never let through)."""

from __future__ import annotations

from typing import Any

from kit import policy_yaml

from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text
from webhook.server.cluster import SightCache

POLICY = compile_policy(load_text(policy_yaml("sights", """\
  products: {nodeLabel: nvidia.com/gpu.product}
"""), "sights.yaml"))


def node(name: str, capacity: dict[str, str] | None = None,
         labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None
         ) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or []}, "status": {"capacity": capacity or {}}}


def test_nodes_carrying_gpus_and_classes_are_known_from_their_events() -> None:
    seen = SightCache(lambda: POLICY)
    sights = seen.sights()
    assert sights.node_gpus("gpu-0") is None  # before the first list: unknown
    seen.node_event("ADDED", node("gpu-0", {"nvidia.com/gpu": "8", "cpu": "96"}))
    seen.node_event("ADDED", node("gfd-1", labels={"nvidia.com/gpu.product": "NVIDIA-L4"}))
    seen.node_event("ADDED", node("new-2", taints=[{"key": "nvidia.com/gpu",
                                                    "effect": "NoSchedule"}]))
    seen.node_event("ADDED", node("cpu-3", {"cpu": "64"}))
    assert [sights.node_gpus(n) for n in ("gpu-0", "gfd-1", "new-2", "cpu-3")] == [
        True, True, True, False]
    seen.node_event("MODIFIED", node("cpu-3", {"cpu": "64", "nvidia.com/gpu": "1"}))
    assert sights.node_gpus("cpu-3") is True
    seen.node_event("DELETED", node("gpu-0"))
    assert sights.node_gpus("gpu-0") is None
    seen.class_event("ADDED", {"metadata": {"name": "high"}, "value": 1000})
    seen.class_event("ADDED", {"metadata": {"name": "calm"}, "value": 5,
                               "preemptionPolicy": "Never"})
    assert sights.priority_class("high") == (1000, "PreemptLowerPriority")
    assert sights.priority_class("calm") == (5, "Never")
    seen.node_event("RESET", {})
    seen.class_event("RESET", {})
    assert sights.node_gpus("gfd-1") is None and sights.priority_class("high") is None
