"""Tolerations: which pod tolerations already cover the GPU taints, and which to add.

A toleration with no key and operator ``Exists`` tolerates every taint; one with no
effect tolerates every effect. A policy toleration is "covered" when the pod already has
a toleration that tolerates every taint the policy's toleration would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.k8s.objects import child_list
from webhook.k8s.patch import Patch


def covers(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Whether the pod toleration ``have`` tolerates everything ``want`` tolerates."""
    h_effect, w_effect = have.get("effect") or None, want.get("effect") or None
    if h_effect is not None and h_effect != w_effect:
        return False
    h_key = have.get("key") or None
    h_op = have.get("operator") or "Equal"
    if h_key is None:
        return h_op == "Exists"
    if h_key != want.get("key"):
        return False
    if h_op == "Exists":
        return True
    # Equal covers only an Equal toleration of the same value.
    return (want.get("operator") or "Equal") == "Equal" and have.get("value", "") == want.get(
        "value", "")


def missing(pod_tolerations: Iterable[Any], wanted: Iterable[Mapping[str, Any]]
            ) -> list[Mapping[str, Any]]:
    """The policy tolerations no pod toleration covers yet."""
    have = [t for t in pod_tolerations if isinstance(t, dict)]
    return [w for w in wanted if not any(covers(h, w) for h in have)]


def add_missing(spec: dict[str, Any], pointer: str, patch: Patch,
                wanted: Iterable[Mapping[str, Any]]) -> bool:
    """Append to the pod spec's tolerations those of ``wanted`` it lacks; whether it
    lacked any."""
    to_add = missing(child_list(spec, "tolerations", pointer) or [], wanted)
    for t in to_add:
        patch.append(spec, "tolerations", pointer, dict(t))
    return bool(to_add)


def tolerated_gpu_taints(spec: dict[str, Any], pointer: str,
                         policy_tolerations: Iterable[Mapping[str, Any]]
                         ) -> tuple[list[int], list[str]]:
    """A non-GPU pod's tolerations of the GPU nodes' taints: the indices of those naming
    a key of the policy's tolerations, and those keys (sorted, once)."""
    tolerations = child_list(spec, "tolerations", pointer) or []
    keys = frozenset(str(t["key"]) for t in policy_tolerations if t.get("key"))
    hits = gpu_taint_tolerations(tolerations, keys)
    return hits, sorted({str(tolerations[i]["key"]) for i in hits})


def gpu_taint_tolerations(pod_tolerations: list[Any], gpu_keys: frozenset[str]) -> list[int]:
    """Indices of tolerations naming a GPU taint key explicitly. Key-less "tolerate
    everything" tolerations (common on DaemonSets) are left alone on purpose: stripping
    them would change how the pod treats every other taint."""
    return [
        i for i, t in enumerate(pod_tolerations)
        if isinstance(t, dict) and isinstance(t.get("key"), str) and t["key"] in gpu_keys
    ]
