"""The top of the policy: the settings of the rules, the exemptions, the quota ledger,
``spec`` with its cross-field checks, and the whole ``GPUPolicy``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from webhook.policy.model.budget import Accounting, Showback
from webhook.policy.model.core import (
    _QUALIFIED,
    _SERVICE_ACCOUNT,
    FieldProblem,
    Metadata,
    Mode,
    Rule,
    TolerationPolicy,
    _Strict,
)
from webhook.policy.model.holding import GPUCapabilities, ResourcesPerGPU
from webhook.policy.model.kinds import BUILT_IN_KINDS, WorkloadKind
from webhook.policy.model.resources import (
    DeviceClass,
    GPUResources,
    Products,
    Toleration,
    _default_device_classes,
)
from webhook.policy.model.routes import GPURoutes, PriorityLimits
from webhook.policy.model.spot import SpotCapacity
from webhook.policy.model.tenant import Tenant


class RuleSettings(_Strict):
    mode: Mode
    """What the rule does when it finds a violation."""


class Exemptions(_Strict):
    """Requests the webhook passes untouched."""

    namespaces: list[str] = Field(default_factory=list, max_length=4096)
    users: list[str] = Field(default_factory=list, max_length=4096)
    groups: list[str] = Field(default_factory=list, max_length=4096)
    service_accounts: list[Annotated[str, Field(pattern=_SERVICE_ACCOUNT)]] = Field(
        default_factory=list, max_length=4096
    )
    """``namespace/name`` of service accounts."""


class QuotaLedger(_Strict):
    """How quota reservations are committed and what happens when that is impossible."""

    on_unavailable: Literal["deny", "allow"] = "deny"
    """A GPU pod whose reservation cannot be committed (API server unreachable, budget
    spent on conflicts): ``deny`` (fail closed) or ``allow`` (admit uncounted, warn)."""
    # Spelled as Kubernetes spells acronyms in field names (``podIP``, ``clusterIP``: all
    # letters of an acronym share one case), not as to_camel would (``reservationTtl...``).
    reservation_ttl_seconds: Annotated[int, Field(ge=5, le=3600,
                                                  alias="reservationTTLSeconds")] = 60
    """How long a reservation counts while its pod has not been seen; longer than the
    watch lag of every replica, short enough that a refused pod's GPUs come back soon."""



class Spec(_Strict):
    mode: Mode = Mode.ENFORCE
    """Mode of every rule that has no mode of its own or from its tenant."""
    rules: dict[Rule, RuleSettings] = Field(default_factory=dict)
    """Per-rule mode, by rule name; wins over tenant and policy modes."""
    gpu_resources: GPUResources = Field(default_factory=GPUResources)
    """Which extended resources are GPUs and what each is worth."""
    device_classes: dict[
        Annotated[str, Field(pattern=_QUALIFIED, max_length=253)], DeviceClass
    ] = Field(default_factory=_default_device_classes, max_length=256)
    """DeviceClasses whose devices are GPUs (DRA), by name; default: NVIDIA's
    ``gpu.nvidia.com`` and ``mig.nvidia.com``."""
    products: Products = Field(default_factory=Products)
    """GPU products and how a pod asks for one."""
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [
            Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
        ],
        max_length=64,
    )
    """Added to every GPU pod that does not already tolerate them."""
    non_gpu_pods_tolerating_gpu_taints: TolerationPolicy = TolerationPolicy.ALLOW
    """A pod that requests no GPU but tolerates a GPU taint: ``strip`` the tolerations,
    ``deny`` the pod, or ``allow`` it."""
    unassigned_namespaces: Literal["deny", "allow"] = "deny"
    """GPU pods in a namespace that belongs to no tenant: ``deny`` (rule tenant-required)
    or ``allow`` (no tenant rules apply; tolerations are still added)."""
    exemptions: Exemptions = Field(default_factory=Exemptions)
    """Requests the webhook passes untouched."""
    quota_ledger: QuotaLedger = Field(default_factory=QuotaLedger)
    """How quota reservations are committed across replicas."""
    workload_kinds: list[WorkloadKind] = Field(default_factory=list, max_length=256)
    """Other workload kinds to check at apply (the training kinds are built in)."""
    tenants: list[Tenant] = Field(default_factory=list, max_length=4096)
    """The teams, their namespaces and limits."""
    spot: SpotCapacity | None = None
    """Spot (preemptible) GPU nodes: which they are, and which pods may land there."""
    gpu_routes: GPURoutes = Field(default_factory=GPURoutes)
    """Routes to a GPU that skip the GPU request (the NVIDIA runtime's variable,
    privilege, device mounts, ``nodeName``, device-taint tolerations): closed by default
    in tenants' namespaces; each tenant may choose otherwise (``tenants[].gpuRoutes``)."""
    priority: PriorityLimits = Field(default_factory=PriorityLimits)
    """The PriorityClass ceiling of tenants' pods (``ceiling`` only; classes and defaults
    are per tenant)."""
    resources_per_gpu: ResourcesPerGPU | None = None
    """The most CPU and memory per GPU for every tenant's GPU pods, per product (a
    tenant's ``resourcesPerGpu`` wins; rule resources-per-gpu)."""
    gpu_capabilities: GPUCapabilities | None = None
    """How a pod asks for GPUs by what they can do (memory, compute capability) instead
    of by product, and the node labels and DRA attributes that say it (rule
    gpu-capability)."""
    accounting: Accounting | None = None
    """How GPU time is accounted (on whenever a tenant has a ``budget`` or ``showback``
    is set; these are its settings)."""
    showback: Showback | None = None
    """The rate card ``gpu-webhook usage`` prices GPU-hours with."""

    @model_validator(mode="after")
    def _fair_share_agreed(self) -> Spec:
        said: dict[str, tuple[str, float | None]] = {}
        for i, t in enumerate(self.tenants):
            if t.cohort is None:
                continue
            mine = t.cohort.fair_share.half_life_hours if t.cohort.fair_share else None
            first = said.setdefault(t.cohort.name, (t.name, mine))
            if first[1] != mine:
                raise FieldProblem(("tenants", i, "cohort", "fairShare"),
                    f"tenant {t.name}: cohort {t.cohort.name}'s fairShare differs from "
                    f"tenant {first[0]}'s: every tenant of a cohort gives the same (or none)")
        return self

    @model_validator(mode="after")
    def _weighed_products(self) -> Spec:
        aliases = self.products.aliases
        named = [(("accounting", "productWeights", p), p)
                 for p in (self.accounting.product_weights if self.accounting else {})]
        named += [(("showback", "rates", p), p)
                  for p in (self.showback.rates if self.showback else {}) if p != "default"]
        for loc, p in named:
            if p not in aliases:
                raise FieldProblem(loc,
                    f"product {p!r} is not defined; add it under spec.products.aliases "
                    f"(defined: {', '.join(sorted(aliases)) or 'none'})")
        return self

    @property
    def accounts_gpu_time(self) -> bool:
        """Whether GPU time is accounted: some tenant has a budget or a cohort with fair
        share, or showback is set."""
        return (self.accounting is not None or self.showback is not None
                or any(t.budget is not None or (t.cohort is not None
                                                and t.cohort.fair_share is not None)
                       for t in self.tenants))

    @model_validator(mode="after")
    def _priority_is_a_ceiling(self) -> Spec:
        if self.priority.allowed_classes is not None or self.priority.default_class:
            field_name = ("allowedClasses" if self.priority.allowed_classes is not None
                          else "defaultClass")
            raise FieldProblem(("priority", field_name),
                f"spec.priority.{field_name} is a tenant's: move it to "
                f"tenants[].priority.{field_name}")
        return self

    @model_validator(mode="after")
    def _spot_declared(self) -> Spec:
        if self.spot is not None:
            label, _, spot_tolerations = self.spot.resolved()
            spot_keys = {label} | {str(t["key"]) for t in spot_tolerations if t.get("key")}
            for i, tol in enumerate(self.tolerations):
                if tol.key in spot_keys:
                    # Every GPU pod gets these; spot's are for some pods only.
                    raise FieldProblem(("tolerations", i, "key"),
                        f"toleration key {tol.key!r} is a spot key (spec.spot): GPU pods not "
                        "allowed on spot would get it and lose it again; move it to "
                        "spec.spot.tolerations")
        for i, t in enumerate(self.tenants):
            if t.spot is not None and self.spot is None:
                raise FieldProblem(("tenants", i, "spot"),
                    f"tenant {t.name}: spot settings need spec.spot, which says which "
                    "nodes are spot capacity (e.g. `spot: {provider: karpenter}`)")
        return self

    @field_validator("rules", mode="before")
    @classmethod
    def _known_rule(cls, value: object) -> object:
        if isinstance(value, dict):
            known = {r.value for r in Rule}
            for key in value:
                if key not in known:
                    raise FieldProblem((key,),
                        f"unknown rule {key!r}; the rules are: {', '.join(sorted(known))}"
                    )
        return value

    @model_validator(mode="after")
    def _hami_tenants_exist(self) -> Spec:
        hami = self.gpu_resources.hami
        names = {t.name for t in self.tenants}
        for i, name in enumerate(hami.tenants or () if hami is not None else ()):
            if name not in names:
                raise FieldProblem(("gpuResources", "hami", "tenants", i),
                    f"tenant {name!r} is not defined in spec.tenants")
        return self

    @model_validator(mode="after")
    def _per_gpu_products(self) -> Spec:
        for p in self.resources_per_gpu.products if self.resources_per_gpu else {}:
            if p not in self.products.aliases:
                raise FieldProblem(("resourcesPerGpu", "products", p),
                    f"product {p!r} is not defined; add it under spec.products.aliases "
                    f"(defined: {', '.join(sorted(self.products.aliases)) or 'none'})")
        return self

    @model_validator(mode="after")
    def _workload_kinds_unique(self) -> Spec:
        seen: set[tuple[str, str]] = set()
        for i, w in enumerate(self.workload_kinds):
            key = (w.group, w.kind)
            if key in BUILT_IN_KINDS:
                raise FieldProblem(("workloadKinds", i, "kind"),
                    f"{w.kind}.{w.group} is built in: remove it from workloadKinds")
            if key in seen:
                raise FieldProblem(("workloadKinds", i, "kind"),
                    f"{w.kind}.{w.group} is configured twice: keep one entry")
            seen.add(key)
        return self

    @model_validator(mode="after")
    def _cross_references(self) -> Spec:
        names: set[str] = set()
        owner: dict[str, str] = {}
        for i, t in enumerate(self.tenants):
            here: tuple[str | int, ...] = ("tenants", i)
            if t.name in names:
                raise FieldProblem((*here, "name"), f"tenant name {t.name!r} is used twice")
            names.add(t.name)
            for k, ns in enumerate(t.namespaces):
                if ns in owner:
                    raise FieldProblem(
                        (*here, "namespaces", k),
                        f"namespace {ns!r} already belongs to tenant {owner[ns]!r}; "
                        "a namespace has one tenant")
                owner[ns] = t.name
            self._tenant_references(here, t)
        return self

    def _tenant_references(self, here: tuple[str | int, ...], t: Tenant) -> None:
        """What one tenant names exists: its device classes, its products, the namespaces
        of its per-namespace quota; and a per-product quota has a product for every pod."""
        aliases = self.products.aliases
        for k, cls in enumerate(t.allowed_device_classes or []):
            if cls not in self.device_classes:
                raise FieldProblem(
                    (*here, "allowedDeviceClasses", k),
                    f"tenant {t.name}: device class {cls!r} is not a GPU class; add it "
                    f"under spec.deviceClasses (defined: "
                    f"{', '.join(sorted(self.device_classes)) or 'none'})")
        for loc, p in _named_products(t):
            if p not in aliases:
                raise FieldProblem(
                    (*here, *loc),
                    f"tenant {t.name}: product {p!r} is not defined; add it under "
                    f"spec.products.aliases (defined: {', '.join(sorted(aliases)) or 'none'})")
        for ns in t.quota.namespaces if t.quota else {}:
            if t.namespace_selector is None and ns not in t.namespaces:
                raise FieldProblem(
                    (*here, "quota", "namespaces", ns),
                    f"tenant {t.name}: quota for namespace {ns!r}, which is not one of "
                    "the tenant's namespaces")
        if (
            t.quota
            and t.quota.products
            and t.default_product is None
            and len(t.allowed_products or aliases) > 1
        ):
            raise FieldProblem(
                (*here, "quota", "products"),
                f"tenant {t.name}: per-product quota needs every GPU pod pinned to one "
                "product: set defaultProduct for pods that do not ask for one")


def _named_products(t: Tenant) -> list[tuple[tuple[str | int, ...], str]]:
    """Every place a tenant names a product, with the field that names it."""
    products: list[tuple[tuple[str | int, ...], str]] = [
        (("allowedProducts", k), p) for k, p in enumerate(t.allowed_products or [])]
    if t.default_product:
        products.append((("defaultProduct",), t.default_product))
    if t.quota:
        products.extend((("quota", "products", p), p) for p in t.quota.products)
        for ns, limits in t.quota.namespaces.items():
            products.extend((("quota", "namespaces", ns, "products", p), p)
                            for p in limits.products)
    if t.resources_per_gpu:
        products.extend((("resourcesPerGpu", "products", p), p)
                        for p in t.resources_per_gpu.products)
    for i, w in enumerate(t.quota_schedule.windows if t.quota_schedule else ()):
        products.extend((("quotaSchedule", "windows", i, "quota", "products", p), p)
                        for p in w.quota.products)
    return products


class GPUPolicy(_Strict):
    """The whole policy file."""

    api_version: Literal["gpu-webhook.dev/v1alpha1"]
    kind: Literal["GPUPolicy"]
    metadata: Metadata
    spec: Spec = Field(default_factory=Spec)
