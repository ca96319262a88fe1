"""Routes to a GPU that skip the GPU request (docs/security.md), the PriorityClasses pods
may run at, and the cohorts whose tenants borrow each other's idle quota."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from webhook.policy.model.core import _DNS_LABEL, _SUBDOMAIN, _Strict
from webhook.policy.model.quota import Equivalents

# --- routes to a GPU that skip the GPU request (docs/security.md) ----------------------

VisibleDevicesChoice = Literal["neutralize", "deny", "allow"]
RouteChoice = Literal["deny", "allow"]


class GPURoutes(_Strict):
    """How a tenant's pods are kept from GPUs they do not ask for (and so are not charged
    for). In ``spec.gpuRoutes`` the defaults; in ``tenants[].gpuRoutes`` a tenant's own
    choices, each field unset there taking the policy's."""

    visible_devices: VisibleDevicesChoice | None = None
    """``NVIDIA_VISIBLE_DEVICES``, the variable NVIDIA's container runtime hands GPUs by.
    ``neutralize`` (default): a container given no GPU (by the device plugin or a DRA claim
    it names) gets ``NVIDIA_VISIBLE_DEVICES=void``, over its image's default and any
    ``envFrom``, and a container given GPUs loses its own value of the variable (which
    would replace the device plugin's); ``deny``: a container that sets the variable
    itself is refused (the others still get ``void``: an image's default cannot be
    seen); ``allow``: the variable is left alone (rule gpu-visible-devices)."""
    privileged: RouteChoice | None = None
    """A privileged container, or one that adds ``SYS_ADMIN`` (or ``ALL``), in a pod that
    can reach GPU nodes: it sees every device of the node. ``deny`` (default) or
    ``allow`` (rule privileged-on-gpu-nodes)."""
    device_host_paths: RouteChoice | None = None
    """A hostPath volume of ``/``, ``/dev`` or a path under it, in a pod that can reach
    GPU nodes: ``deny`` (default) or ``allow`` (rule device-host-paths)."""
    node_name: RouteChoice | None = None
    """A pod created with ``spec.nodeName`` skips the scheduler, so no NoSchedule taint
    keeps it off a GPU node: ``deny`` (default; a node the webhook's node watch knows to
    carry no GPU passes) or ``allow`` (rule node-name)."""
    @field_validator("visible_devices", mode="before")
    @classmethod
    def _not_off(cls, value: object) -> object:
        if value is False or value == "off":
            # YAML 1.1 (PyYAML, kubectl) reads an unquoted off as false.
            raise ValueError("to leave the variable alone write `allow` (an unquoted off "
                             "is read by YAML as false); the choices are neutralize, deny, "
                             "allow")
        return value

    device_taint_tolerations: RouteChoice | None = None
    """A ResourceClaim (or template) of a GPU class whose requests tolerate device taints
    (the DRA driver taints GPUs it finds unhealthy): ``deny`` (default) or ``allow``
    (rule device-taint-tolerations)."""


class PriorityLimits(_Strict):
    """Which PriorityClasses pods may run at (rule priority-class). The scheduler
    preempts any pod of lower priority, whatever its namespace: a tenant's pod above
    another tenant's in-quota pod could take its GPUs."""

    ceiling: Annotated[int, Field(ge=-2_147_483_648, le=1_000_000_000)] | None = None
    """The highest PriorityClass value a pod may run at (``spec.priority``: default 0,
    the value of a pod that names no class on a cluster without a global default).
    A tenant's ``priority.ceiling`` overrides it."""
    allowed_classes: list[Annotated[str, Field(pattern=_SUBDOMAIN, max_length=253)]] | None = (
        Field(default=None, max_length=256))
    """The PriorityClasses a tenant's pods may name (tenants only; default: any within
    the ceiling). The tenant's borrowed class is always allowed."""
    default_class: Annotated[str, Field(pattern=_SUBDOMAIN, max_length=253)] | None = None
    """The class a tenant's pod that names none is given (tenants only)."""


class BorrowedPriority(_Strict):
    """The PriorityClass a pod admitted on borrowed GPUs is given, as the cluster defines
    it. The API server's Priority admission plugin checks, after the mutating webhooks,
    that a pod's ``priority`` and ``preemptionPolicy`` are the ones its class names, so
    the webhook writes all three and they must match the PriorityClass object."""

    name: Annotated[str, Field(pattern=_SUBDOMAIN, max_length=253)] = "gpu-webhook-borrowed"
    """The PriorityClass's name (``deploy/base/priority-borrowed.yaml`` ships the default)."""
    value: Annotated[int, Field(ge=-2_147_483_648, le=1_000_000_000)] = -100
    """The class's ``value``; lower than the lenders' pods, so the scheduler preempts the
    borrowed pods to make room for them."""
    preemption_policy: Literal["Never", "PreemptLowerPriority"] = "Never"
    """The class's ``preemptionPolicy``: ``Never`` keeps a borrowed pod from preempting
    anyone itself."""


class FairShare(_Strict):
    """Fair share by recent use in a cohort (``tenants[].cohort.fairShare``)."""

    half_life_hours: Annotated[float, Field(gt=0, le=8784)] = 168.0
    """How fast past GPU time stops counting: an hour used this long ago counts half
    (default a week)."""


class Cohort(_Strict):
    """Tenants that share the quota they leave unused (rule quota). A tenant whose own
    ``quota.gpus`` is full may run pods on GPUs the others of its cohort leave idle; such
    a pod is labelled ``gpu-webhook.dev/borrowed: "true"``, given the borrowed
    PriorityClass, and preempted by the scheduler when the lender needs its GPUs back."""

    name: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]
    """The cohort this tenant belongs to; tenants naming the same cohort share."""
    borrowing_limit: Equivalents | None = None
    """GPU-equivalents this tenant may borrow at once, beyond its own quota (default: as
    many as the cohort leaves idle; 0: it only lends)."""
    lending_limit: Equivalents | None = None
    """GPU-equivalents of its unused quota that others may borrow (default: all of it;
    0: it only borrows)."""
    borrowed_priority_class: BorrowedPriority = Field(default_factory=BorrowedPriority)
    """The PriorityClass this tenant's borrowed pods run at."""
    fair_share: FairShare | None = None
    """Pods waiting for GPUs to borrow are released in order of how far each tenant is
    below its share of the cohort's recent GPU time, then priority, then arrival (default:
    priority, then arrival). Every tenant of the cohort must say the same."""
