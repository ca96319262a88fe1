"""A tenant: the namespaces a team owns and what its GPU pods may use."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from webhook.policy.model.budget import Budget
from webhook.policy.model.core import _DNS_LABEL, FieldProblem, Mode, OverQuota, _Strict
from webhook.policy.model.holding import MaxRuntime, ResourcesPerGPU, Routing
from webhook.policy.model.quota import Equivalents, Quota, QuotaSchedule, UserQuota
from webhook.policy.model.resources import LabelSelector, Topology
from webhook.policy.model.routes import Cohort, GPURoutes, PriorityLimits
from webhook.policy.model.spot import TenantSpot


class Tenant(_Strict):
    """A team: the namespaces it owns and what its GPU pods may use."""

    name: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]
    """Shown in messages (``[rule ..., tenant NAME]``) and metrics; unique."""
    namespaces: list[Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]] = Field(
        default_factory=list, max_length=4096
    )
    """Namespaces the tenant owns, by name."""
    namespace_selector: LabelSelector | None = None
    """Namespaces the tenant owns, by label; a namespace named in some tenant's
    ``namespaces`` wins over selectors, and the first matching selector among them."""
    allowed_resources: list[str] | None = Field(default=None, max_length=256)
    """GPU resource names this tenant may request (default: every GPU resource)."""
    allowed_products: list[str] | None = Field(default=None, max_length=256)
    """Product short names this tenant may use (default: any; no product pinning)."""
    allowed_device_classes: list[str] | None = Field(default=None, max_length=256)
    """GPU DeviceClasses (of ``spec.deviceClasses``) this tenant's claims may ask (default:
    every one)."""
    default_product: str | None = None
    """The product of pods that do not ask for one; must be in ``allowedProducts``."""
    max_gpus_per_container: Equivalents | None = None
    """GPU-equivalents one container may ask (rule max-gpus-per-container)."""
    max_gpus_per_pod: Equivalents | None = None
    """GPU-equivalents one pod may ask, on its effective request (rule max-gpus-per-pod)."""
    topology: Topology | None = None
    """Rack / NVLink domain pinning (rule topology)."""
    quota: Quota | None = None
    """What the tenant may hold at once (rule quota)."""
    cohort: Cohort | None = None
    """Borrowing idle GPUs from (and lending to) the other tenants of a cohort."""
    mode: Mode | None = None
    """Enforcement mode for this tenant's rules when a rule has no mode of its own."""
    spot: TenantSpot | None = None
    """Whether the tenant's GPU pods may (or must) run on spot capacity, and how spot
    GPUs count against its quota (needs ``spec.spot``)."""
    gpu_routes: GPURoutes | None = None
    """The tenant's own choices of ``spec.gpuRoutes`` (fields unset here take the
    policy's)."""
    priority: PriorityLimits | None = None
    """The PriorityClasses the tenant's pods may name, their default, and the tenant's
    ceiling (over ``spec.priority.ceiling``)."""
    over_quota: OverQuota = OverQuota.DENY
    """A pod over the tenant's quota (or its cohort's room to borrow) now: ``deny``
    refuses it; ``wait`` admits it behind the scheduling gate ``gpu-webhook.dev/quota``,
    uncharged, and the leader replica releases it, charged, when it fits, in order of
    priority then arrival, a gang only whole. A pod that can never fit is refused in
    both."""
    max_runtime: MaxRuntime | None = None
    """How long the tenant's GPU pods may hold their GPUs (``activeDeadlineSeconds``),
    per kind of work (rule max-runtime)."""
    resources_per_gpu: ResourcesPerGPU | None = None
    """The most CPU and memory a GPU pod may ask per GPU, and what a pod asking none is
    given (over ``spec.resourcesPerGpu``; rule resources-per-gpu)."""
    routing: Routing | None = None
    """The scheduler and queue every GPU pod of the tenant is sent to (rule
    queue-routing)."""
    user_quota: UserQuota | None = None
    """What each user of the tenant may hold at once (rule quota); the user is the one
    who created the workload or the bare pod."""
    quota_schedule: QuotaSchedule | None = None
    """Caps that apply in time windows, for pods admitted while a window is open."""
    budget: Budget | None = None
    """GPU-hours the tenant's pods (and each of its users') may use over a period, and
    what happens to new GPU pods once they are spent (rule quota)."""

    @model_validator(mode="after")
    def _selects_something(self) -> Tenant:
        if not self.namespaces and self.namespace_selector is None:
            raise ValueError(f"tenant {self.name!r} selects no namespace: give `namespaces` "
                             "or `namespaceSelector`")
        if self.cohort is not None and (self.quota is None or self.quota.gpus is None):
            raise FieldProblem(("cohort",),
                f"tenant {self.name!r}: a cohort shares quota.gpus, and this tenant has "
                "none: set quota.gpus (0 to only borrow)")
        if self.cohort is not None and self.quota_schedule is not None:
            # What a cohort lends and borrows is computed from each member's quota.gpus;
            # a window changing it is not part of that arithmetic.
            raise FieldProblem(("quotaSchedule",),
                f"tenant {self.name!r}: a tenant in a cohort cannot have a quotaSchedule: "
                "remove one of them")
        p = self.priority
        if (p is not None and p.default_class is not None and p.allowed_classes is not None
                and p.default_class not in p.allowed_classes):
            raise FieldProblem(("priority", "defaultClass"),
                f"tenant {self.name!r}: priority.defaultClass {p.default_class!r} is not in "
                f"priority.allowedClasses {p.allowed_classes}: add it there")
        if (
            self.default_product is not None
            and self.allowed_products is not None
            and self.default_product not in self.allowed_products
        ):
            raise FieldProblem(("defaultProduct",),
                f"defaultProduct {self.default_product!r} is not in allowedProducts "
                f"{self.allowed_products}: add it there or pick one of them"
            )
        return self
