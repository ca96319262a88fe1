"""Spot (preemptible) capacity: the providers' presets, how a pod says it is fault
tolerant, which nodes are spot and how pods are placed there, a tenant's use of spot."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from webhook.policy.model.core import _QUALIFIED, _Strict
from webhook.policy.model.quota import Equivalents
from webhook.policy.model.resources import Toleration

# --- spot / preemptible capacity -------------------------------------------------------

# What each provider puts on its spot GPU nodes (sources: policies/README.md, "Spot"):
# the node label and its spot values, and the toleration for the taint its spot nodes
# carry (AKS taints every spot node; GKE Standard node pools and Karpenter or EKS
# managed node groups add no taint unless the platform team does).
SPOT_PRESETS: dict[str, tuple[str, tuple[str, ...], tuple[dict[str, str], ...]]] = {
    "gke": ("cloud.google.com/gke-spot", ("true",),
            ({"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
              "effect": "NoSchedule"},)),
    "karpenter": ("karpenter.sh/capacity-type", ("spot",), ()),
    "eks": ("eks.amazonaws.com/capacityType", ("SPOT",), ()),
    "aks": ("kubernetes.azure.com/scalesetpriority", ("spot",),
            ({"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal",
              "value": "spot", "effect": "NoSchedule"},)),
}

SpotPlacement = Literal["never", "allowed", "required"]
SpotAffinity = Literal["required", "preferred"]


class FaultTolerance(_Strict):
    """How a pod says it is fault tolerant (may run on spot capacity)."""

    label: Annotated[str, Field(pattern=_QUALIFIED, max_length=317)] | None = (
        "gpu-webhook.dev/fault-tolerant")
    """A pod label: ``"true"`` says the pod is fault tolerant, ``"false"`` that it is not
    (which wins over a priority class and the tenant's default)."""
    annotation: Annotated[str, Field(pattern=_QUALIFIED, max_length=317)] | None = None
    """A pod annotation read like ``label`` (the label wins when both are set)."""
    priority_classes: list[Annotated[str, Field(pattern=_QUALIFIED, max_length=253)]] = (
        Field(default_factory=list, max_length=256))
    """Pods of these PriorityClasses (``spec.priorityClassName``) are fault tolerant."""


class SpotCapacity(_Strict):
    """Which nodes are spot (preemptible) capacity and how pods are placed on them."""

    provider: Literal["gke", "karpenter", "eks", "aks"] | None = None
    """A preset for ``nodeLabel``, ``values`` and ``tolerations``: ``gke``
    (``cloud.google.com/gke-spot: "true"``), ``karpenter``
    (``karpenter.sh/capacity-type: spot``), ``eks``
    (``eks.amazonaws.com/capacityType: SPOT``), ``aks``
    (``kubernetes.azure.com/scalesetpriority: spot``, tainted)."""
    node_label: Annotated[str, Field(pattern=_QUALIFIED, max_length=317)] | None = None
    """The node label that marks spot nodes (default: the provider's)."""
    values: list[Annotated[str, Field(min_length=1, max_length=63)]] | None = Field(
        default=None, min_length=1, max_length=16)
    """The label's values on spot nodes (default: the provider's)."""
    tolerations: list[Toleration] | None = Field(default=None, max_length=16)
    """Added to pods placed on spot, for the spot nodes' taints (default: the
    provider's). A GPU pod not allowed on spot that tolerates one of these taint keys
    (or the node label's key) is handled as ``podsToleratingSpot`` says."""
    fault_tolerant: FaultTolerance = Field(default_factory=FaultTolerance)
    """How a pod says it may run on spot."""
    placement: SpotPlacement = "never"
    """For tenants that do not say: ``never`` (no GPU pod on spot), ``allowed``
    (fault-tolerant pods on spot), ``required`` (every GPU pod on spot)."""
    affinity: SpotAffinity = "required"
    """How a fault-tolerant pod of an ``allowed`` tenant is sent to spot: ``required``
    (spot nodes only) or ``preferred`` (spot first, other nodes when spot is full)."""
    preferred_weight: Annotated[int, Field(ge=1, le=100)] = 100
    """The weight of the preferred node-affinity term (``affinity: preferred``)."""
    pods_tolerating_spot: Literal["strip", "deny"] = "strip"
    """A GPU pod that tolerates a spot taint without being allowed on spot: ``strip``
    those tolerations or ``deny`` the pod."""

    @model_validator(mode="after")
    def _marks_nodes(self) -> SpotCapacity:
        if self.provider is None and (self.node_label is None or self.values is None):
            raise ValueError("spot needs the node label that marks spot nodes: give "
                             "`provider` (gke, karpenter, eks, aks) or `nodeLabel` and "
                             "`values`")
        return self

    def resolved(self) -> tuple[str, tuple[str, ...], tuple[dict[str, object], ...]]:
        """The node label, its spot values and the tolerations: given, else the preset's."""
        preset = SPOT_PRESETS[self.provider] if self.provider else None
        label = self.node_label or (preset[0] if preset else "")
        values = tuple(self.values) if self.values is not None else (
            preset[1] if preset else ())
        if self.tolerations is not None:
            tolerations = tuple(t.as_pod_toleration() for t in self.tolerations)
        else:
            tolerations = tuple(dict(t) for t in preset[2]) if preset else ()
        return label, values, tolerations


class TenantSpot(_Strict):
    """A tenant's use of spot capacity and how its spot GPUs count."""

    placement: SpotPlacement | None = None
    """``never``, ``allowed`` (fault-tolerant pods) or ``required`` (every GPU pod);
    default: ``spec.spot.placement``."""
    fault_tolerant: bool = False
    """Every GPU pod of the tenant is fault tolerant unless it says otherwise."""
    affinity: SpotAffinity | None = None
    """``required`` or ``preferred`` (default: ``spec.spot.affinity``); a ``required``
    placement always pins by required affinity."""
    gpus: Equivalents | None = None
    """Cap on the GPU-equivalents the tenant's pods pinned to spot hold at once."""
    weight: Annotated[float, Field(gt=0, le=1)] = 1.0
    """What one GPU-equivalent on spot counts against the tenant's other GPU caps
    (``quota.gpus``, per product); 0.5 counts spot GPUs half."""
