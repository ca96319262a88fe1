"""One tenant's rules in the form the engine runs on: :class:`TenantRules` and the records
it holds (quota caps, cohort, routes, priority, maximum runtime, resources per GPU,
routing), each compiled from the tenant's section over the policy's.

:func:`compile_tenant` turns one validated ``tenants[]`` entry into them, once per
(re)load (:func:`webhook.policy.compiled.compile_policy` compiles the whole policy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from webhook.k8s.quantity import parse as parse_quantity
from webhook.policy.budgets import BudgetRules, compile_budget
from webhook.policy.model import (
    BorrowedPriority,
    GPURoutes,
    MaxRuntime,
    Mode,
    OverQuota,
    PriorityLimits,
    QuotaLimits,
    ResourcesPerGPU,
    Routing,
    Spec,
    Tenant,
)
from webhook.policy.schedule import Schedule, Window, compile_schedule
from webhook.policy.spot import TenantSpotRules, compile_tenant_spot
from webhook.policy.users import UserLimits, compile_users


@dataclass(frozen=True, slots=True)
class Limits:
    """Quota caps in the engine's terms (None = no cap)."""

    gpus: float | None
    resources: Mapping[str, int]
    products: Mapping[str, float]
    pods: int | None
    spot: float | None = None  # GPU-equivalents on spot (tenants[].spot.gpus)
    shared: float | None = None  # GPU-equivalents held as shares (quota.sharedGpus)

    @classmethod
    def of(cls, q: QuotaLimits, spot: float | None = None) -> Limits:
        return cls(q.gpus, dict(q.resources), dict(q.products), q.pods, spot,
                   q.shared_gpus)

    def over(self, q: QuotaLimits) -> Limits:
        """These caps with the fields ``q`` sets (a quota window's) replacing them; in
        ``resources`` and ``products``, each name it gives."""
        given = q.model_fields_set
        return Limits(q.gpus if "gpus" in given else self.gpus,
                      {**self.resources, **q.resources}, {**self.products, **q.products},
                      q.pods if "pods" in given else self.pods, self.spot,
                      q.shared_gpus if "shared_gpus" in given else self.shared)


@dataclass(frozen=True, slots=True)
class CohortRules:
    """A tenant's place in its cohort (``tenants[].cohort``); None limits are unlimited."""

    name: str
    borrowing_limit: float | None
    lending_limit: float | None
    priority: BorrowedPriority
    # cohort.fairShare: the half-life of recent GPU time, in hours; None: no fair share.
    half_life: float | None = None


@dataclass(frozen=True, slots=True)
class RouteRules:
    """A tenant's choices for the routes to a GPU that skip the GPU request
    (``gpuRoutes``: the tenant's fields over the policy's, defaults filled in)."""

    visible_devices: str = "neutralize"  # neutralize | deny | allow
    privileged: bool = True  # refused (deny)
    device_host_paths: bool = True
    node_name: bool = True
    device_taint_tolerations: bool = True


@dataclass(frozen=True, slots=True)
class PriorityRules:
    """The PriorityClasses a tenant's pods may run at."""

    ceiling: int = 0
    allowed: frozenset[str] | None = None  # None: any class within the ceiling
    default: str | None = None


def compile_routes(spec: GPURoutes, mine: GPURoutes | None) -> RouteRules:
    def pick(name: str, default: str) -> str:
        own = getattr(mine, name) if mine is not None else None
        return str(own or getattr(spec, name) or default)

    return RouteRules(pick("visible_devices", "neutralize"),
                      pick("privileged", "deny") == "deny",
                      pick("device_host_paths", "deny") == "deny",
                      pick("node_name", "deny") == "deny",
                      pick("device_taint_tolerations", "deny") == "deny")


def compile_priority(spec: PriorityLimits, mine: PriorityLimits | None,
                     borrowed: str | None) -> PriorityRules:
    ceiling = (mine.ceiling if mine is not None and mine.ceiling is not None
               else spec.ceiling if spec.ceiling is not None else 0)
    allowed = None
    if mine is not None and mine.allowed_classes is not None:
        allowed = frozenset(mine.allowed_classes) | ({borrowed} if borrowed else set())
    return PriorityRules(ceiling, allowed, mine.default_class if mine is not None else None)


@dataclass(frozen=True, slots=True)
class RuntimeKindRules:
    """A kind of work with its own maximum runtime (``maxRuntime.kinds[]``)."""

    name: str
    seconds: int
    labels: tuple[tuple[str, str], ...]
    classes: frozenset[str]
    namespaces: frozenset[str]

    def matches(self, labels: Mapping[str, object], cls: object, namespace: str) -> bool:
        if self.labels and all(labels.get(k) == v for k, v in self.labels):
            return True
        return cls in self.classes or namespace in self.namespaces


@dataclass(frozen=True, slots=True)
class RuntimeRules:
    """A tenant's ``maxRuntime``: the kinds in policy order, then the cap of the rest."""

    seconds: int | None
    deny_longer: bool
    kinds: tuple[RuntimeKindRules, ...]

    def cap(self, labels: Mapping[str, object], cls: object, namespace: str
            ) -> tuple[int, str | None] | None:
        """(seconds, kind name) of a pod, or None when nothing caps it."""
        for k in self.kinds:
            if k.matches(labels, cls, namespace):
                return k.seconds, k.name
        return (self.seconds, None) if self.seconds is not None else None


@dataclass(frozen=True, slots=True)
class PerGPURules:
    """CPU (cores) and memory (bytes) per GPU-equivalent; None: no cap."""

    cpu: float | None = None
    memory: float | None = None


@dataclass(frozen=True, slots=True)
class ResourceRatioRules:
    """A tenant's ``resourcesPerGpu`` over the policy's, per product, as numbers."""

    default: PerGPURules
    products: Mapping[str, PerGPURules]
    fill_cpu: float | None  # cores per GPU given to a pod asking none
    fill_memory: float | None
    # The policy's texts of the amounts, for messages ("128Gi", not 137438953472).
    shown: Mapping[float, str] = field(default_factory=dict)

    def caps(self, product: str | None) -> PerGPURules:
        return self.products.get(product, self.default) if product else self.default


@dataclass(frozen=True, slots=True)
class RoutingRules:
    """Where a tenant's GPU pods are sent (``routing``)."""

    scheduler_name: str | None
    labels: tuple[tuple[str, str], ...]  # (kueue / KAI queue label, queue)
    annotations: tuple[tuple[str, str], ...]  # (Volcano's queue annotation, queue)


# The names each queueing system reads (sources: policies/README.md, "routing").
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
KAI_QUEUE_LABEL = "kai.scheduler/queue"


def compile_runtime(m: MaxRuntime | None) -> RuntimeRules | None:
    if m is None:
        return None
    return RuntimeRules(m.seconds, m.on_longer == "deny", tuple(
        RuntimeKindRules(k.name, k.seconds, tuple(sorted(k.pod_labels.items())),
                         frozenset(k.priority_classes), frozenset(k.namespaces))
        for k in m.kinds))


def compile_ratios(spec: ResourcesPerGPU | None, mine: ResourcesPerGPU | None
                   ) -> ResourceRatioRules | None:
    """The tenant's caps over the policy's: per product, the tenant's product entry,
    then the tenant's own, then the policy's product entry, then the policy's."""
    if spec is None and mine is None:
        return None
    shown: dict[float, str] = {}

    def amount(v: object) -> float | None:
        if v is None:
            return None
        q = float(parse_quantity(v))
        shown[q] = str(v)
        return q

    def pick(attr: str, product: str | None) -> float | None:
        for source in (mine, spec):
            if source is None:
                continue
            entry = source.products.get(product) if product else None
            for layer in (entry, source):
                if layer is not None and getattr(layer, attr) is not None:
                    return amount(getattr(layer, attr))
        return None

    names = set(spec.products if spec else ()) | set(mine.products if mine else ())
    products = {p: PerGPURules(pick("cpu", p), pick("memory", p)) for p in sorted(names)}
    fill = mine if mine is not None and (mine.default_cpu or mine.default_memory) else spec
    return ResourceRatioRules(
        PerGPURules(pick("cpu", None), pick("memory", None)), products,
        amount(fill.default_cpu) if fill else None,
        amount(fill.default_memory) if fill else None, shown)


def compile_routing(r: Routing | None) -> RoutingRules | None:
    if r is None:
        return None
    labels = [(KUEUE_QUEUE_LABEL, r.kueue_queue), (KAI_QUEUE_LABEL, r.kai_queue)]
    return RoutingRules(r.scheduler_name,
                        tuple((k, v) for k, v in labels if v),
                        ((VOLCANO_QUEUE_ANNOTATION, r.volcano_queue),)
                        if r.volcano_queue else ())


@dataclass(frozen=True, slots=True)
class TenantRules:
    """One tenant's rules, ready for the engine."""

    name: str
    allowed_resources: frozenset[str] | None
    allowed_products: tuple[str, ...] | None  # short names, policy order
    default_product: str | None
    max_per_container: float | None
    max_per_pod: float | None
    allowed_device_classes: frozenset[str] | None
    topology_label: str | None
    topology_values: tuple[str, ...]
    quota: Limits | None
    namespace_quota: Mapping[str, Limits]
    mode: Mode | None
    # Products any of the tenant's caps (tenant-wide or per namespace) count GPUs for. A
    # pod is charged to a product only when it can land on that one alone, so such a
    # tenant's GPU pods are pinned to exactly one product.
    capped_products: tuple[str, ...] = ()
    spot: TenantSpotRules | None = None  # None: the policy has no spot capacity
    cohort: CohortRules | None = None
    routes: RouteRules = field(default_factory=RouteRules)
    priority: PriorityRules = field(default_factory=PriorityRules)
    waits: bool = False  # overQuota: wait (see webhook.quota.waiting)
    runtime: RuntimeRules | None = None  # maxRuntime
    ratios: ResourceRatioRules | None = None  # resourcesPerGpu (the tenant's or policy's)
    routing: RoutingRules | None = None
    user_quota: UserLimits | None = None  # tenants[].userQuota
    schedule: Schedule | None = None  # tenants[].quotaSchedule
    window: Window | None = None  # the window whose caps these are (see at())
    budget: BudgetRules | None = None  # tenants[].budget: GPU-hours over a period

    @property
    def has_quota(self) -> bool:
        """Whether any cap counts this tenant's GPUs (tenant-wide or in a namespace), or
        a budget of GPU-hours."""
        return (self.quota is not None or bool(self.namespace_quota)
                or self.user_quota is not None or self.schedule is not None
                or self.budget is not None)

    def at(self, now: float) -> TenantRules:
        """The tenant's rules with the caps of the quota window open at unix time
        ``now`` (itself when it has no schedule or no window is open)."""
        if self.schedule is None:
            return self
        w = self.schedule.open_at(now)
        if w is None:
            return self
        base = self.quota or Limits(None, {}, {}, None)
        users = self.user_quota
        if w.user_quota is not None:
            users = (users or UserLimits(None, None, frozenset())).over(w.user_quota)
        return replace(self, quota=base.over(w.quota), user_quota=users, window=w)


def compile_tenant(spec: Spec, t: Tenant) -> TenantRules:
    """One tenant's rules: its sections, over the policy's where both give one."""
    spot_cap = t.spot.gpus if t.spot else None
    quota = (Limits.of(t.quota, spot_cap) if t.quota else
             Limits(None, {}, {}, None, spot_cap) if spot_cap is not None else None)
    namespace_quota = ({ns: Limits.of(q) for ns, q in t.quota.namespaces.items()}
                       if t.quota else {})
    capped = set(quota.products) if quota is not None else set()
    for limits in namespace_quota.values():
        capped.update(limits.products)
    return TenantRules(
        name=t.name,
        allowed_resources=frozenset(t.allowed_resources)
        if t.allowed_resources is not None
        else None,
        allowed_products=tuple(t.allowed_products) if t.allowed_products is not None else None,
        default_product=t.default_product,
        max_per_container=t.max_gpus_per_container,
        max_per_pod=t.max_gpus_per_pod,
        allowed_device_classes=frozenset(t.allowed_device_classes)
        if t.allowed_device_classes is not None else None,
        topology_label=t.topology.node_label if t.topology else None,
        topology_values=tuple(t.topology.values) if t.topology else (),
        quota=quota,
        namespace_quota=namespace_quota,
        mode=t.mode,
        capped_products=tuple(sorted(capped)),
        spot=compile_tenant_spot(spec.spot, t.spot),
        cohort=CohortRules(t.cohort.name, t.cohort.borrowing_limit,
                           t.cohort.lending_limit, t.cohort.borrowed_priority_class,
                           t.cohort.fair_share.half_life_hours
                           if t.cohort.fair_share else None)
        if t.cohort else None,
        routes=compile_routes(spec.gpu_routes, t.gpu_routes),
        priority=compile_priority(spec.priority, t.priority,
                                  t.cohort.borrowed_priority_class.name
                                  if t.cohort else None),
        waits=t.over_quota is OverQuota.WAIT,
        runtime=compile_runtime(t.max_runtime),
        ratios=compile_ratios(spec.resources_per_gpu, t.resources_per_gpu),
        routing=compile_routing(t.routing),
        # A budget per user needs to know each pod's user, as per-user caps do: the
        # creator is recorded (gpu-webhook.dev/requested-by) with no cap of its own.
        user_quota=compile_users(t.user_quota) or (
            UserLimits(None, None, frozenset())
            if t.budget is not None and t.budget.per_user_gpu_hours is not None else None),
        schedule=compile_schedule(t.quota_schedule),
        budget=compile_budget(t.budget),
    )
