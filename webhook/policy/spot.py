"""Spot capacity in the engine's terms: which nodes are spot, how a pod says it is fault
tolerant, and where each tenant's GPU pods may go.

Compiled once per policy load from ``spec.spot`` and ``tenants[].spot``
(:mod:`webhook.policy.model`), so the engine reads plain tuples and sets.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.policy.model import SpotCapacity, SpotPlacement, TenantSpot


@dataclass(frozen=True, slots=True)
class SpotRules:
    """The policy's spot capacity (``spec.spot``)."""

    label: str  # the node label that marks spot nodes
    values: tuple[str, ...]  # its values on spot nodes
    tolerations: tuple[dict[str, object], ...]  # what a pod placed on spot gets
    keys: frozenset[str]  # taint keys (and the label key) that only spot pods may tolerate
    ft_label: str | None
    ft_annotation: str | None
    ft_priority_classes: frozenset[str]
    placement: SpotPlacement  # for pods of no tenant (unassignedNamespaces: allow)
    affinity: str
    preferred_weight: int
    deny_tolerations: bool  # podsToleratingSpot: deny (else strip)


@dataclass(frozen=True, slots=True)
class TenantSpotRules:
    """One tenant's spot placement, defaults of ``spec.spot`` filled in."""

    placement: SpotPlacement
    fault_tolerant: bool
    affinity: str  # "required" or "preferred"
    weight: float  # what a spot GPU-equivalent counts against the other GPU caps


def compile_spot(spot: SpotCapacity | None) -> SpotRules | None:
    if spot is None:
        return None
    label, values, tolerations = spot.resolved()
    keys = {str(t["key"]) for t in tolerations if t.get("key")} | {label}
    ft = spot.fault_tolerant
    return SpotRules(label, values, tolerations, frozenset(keys), ft.label, ft.annotation,
                     frozenset(ft.priority_classes), spot.placement, spot.affinity,
                     spot.preferred_weight, spot.pods_tolerating_spot == "deny")


def compile_tenant_spot(spot: SpotCapacity | None, mine: TenantSpot | None
                        ) -> TenantSpotRules | None:
    if spot is None:
        return None
    if mine is None:
        return TenantSpotRules(spot.placement, False, spot.affinity, 1.0)
    return TenantSpotRules(mine.placement or spot.placement, mine.fault_tolerant,
                           mine.affinity or spot.affinity, mine.weight)
