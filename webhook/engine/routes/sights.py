"""What the webhook's watches know that the GPU routes' checks read (:class:`Sights`):
which nodes carry GPUs, and the PriorityClasses; and how a node is known to carry GPUs,
for the node watch and for ``audit``'s nodes read once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from webhook.k8s.identity import ObjectId
from webhook.policy.compiled import CompiledPolicy

NodeLookup = Callable[[str], "bool | None"]  # True: has GPUs; False: known, none; None: unknown
PriorityLookup = Callable[[str], "tuple[int, str] | None"]  # class -> (value, preemption)


def no_nodes(name: str) -> bool | None:
    return None


def no_priorities(name: str) -> tuple[int, str] | None:
    return None


@dataclass(frozen=True, slots=True)
class Sights:
    """What the webhook's watches know that these rules read: which nodes carry GPUs,
    and the PriorityClasses. Offline (``review``), nothing: a node is not known to be
    without GPUs, and a class's value is the one the pod states, if any."""

    node_gpus: NodeLookup = no_nodes
    priority_class: PriorityLookup = no_priorities


no_sights = Sights()


def carries_gpus(policy: CompiledPolicy, node: dict[str, Any]) -> bool:
    """Whether a node carries GPUs: a GPU resource in its capacity or allocatable, the
    policy's product label, or one of its GPU taints (a node whose device plugin has not
    reported yet counts as one)."""
    status = node.get("status") or {}
    for field in ("capacity", "allocatable"):
        held_ = status.get(field) if isinstance(status, dict) else None
        if isinstance(held_, dict) and any(policy.is_gpu(str(r)) for r in held_):
            return True
    if policy.product_label in ObjectId.of(node).labels:
        return True
    keys = {t.get("key") for t in policy.tolerations}
    spec = node.get("spec") or {}
    taints = spec.get("taints") if isinstance(spec, dict) else None
    return any(isinstance(t, dict) and t.get("key") in keys for t in taints or ())


def node_lookup(policy: CompiledPolicy, nodes: Iterable[dict[str, Any]]) -> NodeLookup:
    """A NodeLookup of listed nodes (``audit``, read once)."""
    known = {ObjectId.of(n).name: carries_gpus(policy, n) for n in nodes}
    return known.get
