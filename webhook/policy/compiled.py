"""The policy in the form the engine runs on: lookups precomputed for the hot path.

``compile_policy`` turns the validated ``GPUPolicy`` into plain sets, dicts and tuples
once per (re)load, so deciding a review never walks pydantic models or re-evaluates
patterns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from webhook.k8s.objects import parse_pointer
from webhook.k8s.quantity import parse as parse_quantity
from webhook.k8s.workloads import KindPaths, RolePaths
from webhook.policy.model import (
    BorrowedPriority,
    DeviceClass,
    GPUCapabilities,
    GPUPolicy,
    GPURoutes,
    HAMi,
    KAIFractions,
    LabelSelector,
    MaxRuntime,
    Mode,
    OverQuota,
    PriorityLimits,
    QuotaLimits,
    ResourcesPerGPU,
    Routing,
    Rule,
    TolerationPolicy,
    WorkloadKind,
    pattern_regex,
)
from webhook.policy.schedule import Schedule, Window, compile_schedule
from webhook.policy.spot import SpotRules, TenantSpotRules, compile_spot, compile_tenant_spot
from webhook.policy.users import UserLimits, compile_users

# Every DeviceClass is also requestable as this prefix + its name (KEP-5004).
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"


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


@dataclass(frozen=True, slots=True)
class CapabilityRules:
    """``spec.gpuCapabilities``: where a pod asks, and where nodes and devices say."""

    memory_label: str | None
    memory_annotation: str | None
    compute_label: str | None
    compute_annotation: str | None
    node_memory: str
    node_major: str
    node_minor: str
    dra_memory: str
    dra_compute: str


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


def compile_capabilities(c: GPUCapabilities | None) -> CapabilityRules | None:
    if c is None:
        return None
    return CapabilityRules(c.memory.label, c.memory.annotation, c.compute_capability.label,
                           c.compute_capability.annotation, c.memory_label,
                           c.compute_major_label, c.compute_minor_label, c.memory_capacity,
                           c.compute_attribute)


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

    @property
    def has_quota(self) -> bool:
        """Whether any cap counts this tenant's GPUs (tenant-wide or in a namespace)."""
        return (self.quota is not None or bool(self.namespace_quota)
                or self.user_quota is not None or self.schedule is not None)

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


@dataclass(frozen=True, slots=True)
class _Selector:
    labels: tuple[tuple[str, str], ...]
    expressions: tuple[tuple[str, str, frozenset[str]], ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.labels:
            if labels.get(k) != v:
                return False
        for key, op, values in self.expressions:
            present = key in labels
            if op == "In" and not (present and labels[key] in values):
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True

    @classmethod
    def of(cls, s: LabelSelector) -> _Selector:
        return cls(
            tuple(sorted(s.match_labels.items())),
            tuple((e.key, e.operator, frozenset(e.values)) for e in s.match_expressions),
        )


@dataclass(slots=True)
class CompiledPolicy:
    """Everything the engine asks of the policy, precomputed."""

    name: str
    mode: Mode
    rule_modes: Mapping[Rule, Mode]
    gpu_names: frozenset[str]
    gpu_patterns: tuple[re.Pattern[str], ...]
    weights: Mapping[str, float]
    tolerations: tuple[dict[str, object], ...]
    non_gpu_tolerations: TolerationPolicy
    unassigned_allowed: bool
    product_label: str
    product_value: Mapping[str, str]  # short name -> node label value
    product_alias: Mapping[str, str]  # node label value (and short name) -> short name
    product_request_label: str | None
    product_request_annotation: str | None
    exempt_namespaces: frozenset[str]
    exempt_users: frozenset[str]
    exempt_groups: frozenset[str]
    tenants: tuple[TenantRules, ...]
    quota_fail_open: bool
    reservation_ttl: float
    by_name: Mapping[str, TenantRules]
    _by_namespace: Mapping[str, TenantRules]
    _by_selector: tuple[tuple[_Selector, TenantRules], ...]
    device_classes: Mapping[str, DeviceClass] = field(default_factory=dict)
    _is_gpu: dict[str, bool] = field(default_factory=dict)
    # Workload kinds the policy adds to the built-in ones: (group, kind) -> paths.
    workload_kinds: Mapping[tuple[str, str], KindPaths] = field(default_factory=dict)
    spot: SpotRules | None = None  # spec.spot: None when the policy names no spot nodes
    # Cohort name -> its tenants, in policy order (tenants[].cohort).
    cohorts: Mapping[str, tuple[TenantRules, ...]] = field(default_factory=dict)
    waiting: bool = False  # some tenant has overQuota: wait
    capabilities: CapabilityRules | None = None  # spec.gpuCapabilities
    # gpuResources.timeSlicing: resource -> the device plugin's replicas per GPU.
    time_sliced: Mapping[str, int] = field(default_factory=dict)
    hami: HAMi | None = None  # gpuResources.hami: None when HAMi shares no GPU resource
    kai: KAIFractions | None = None  # gpuResources.kai: None when KAI fractions are off

    def is_gpu(self, resource: str) -> bool:
        """Whether an extended resource name counts as a GPU (memoised: names are few). A
        GPU DeviceClass's implicit extended resource
        (``deviceclass.resource.kubernetes.io/gpu.nvidia.com``) is one."""
        hit = self._is_gpu.get(resource)
        if hit is None:
            hit = (resource in self.gpu_names or resource in self.time_sliced
                   or any(p.match(resource) for p in self.gpu_patterns)
                   or self.implicit_class(resource) is not None)
            if len(self._is_gpu) < 4096:  # bound the memo against hostile resource names
                self._is_gpu[resource] = hit
        return hit

    def weight(self, resource: str) -> float:
        replicas = self.time_sliced.get(resource)
        if replicas is not None:
            # A time-sliced unit is one of ``replicas`` shares of a device of the
            # resource: a time-sliced MIG slice weighs its slice's weight over replicas.
            return self.weights.get(resource, 1.0) / replicas
        w = self.weights.get(resource)
        if w is not None:
            return w
        cls = self.implicit_class(resource)
        return self.device_classes[cls].gpus if cls is not None else 1.0

    def implicit_class(self, resource: str) -> str | None:
        """The GPU DeviceClass a ``deviceclass.resource.kubernetes.io/<class>`` request
        names (KEP-5004: every class is requestable so), else None."""
        if resource.startswith(IMPLICIT_PREFIX):
            cls = resource[len(IMPLICIT_PREFIX):]
            if cls in self.device_classes:
                return cls
        return None

    def tenant_for(
        self, namespace: str, labels: Mapping[str, str] | None = None
    ) -> TenantRules | None:
        """The tenant owning ``namespace``: by name first, then by label selector."""
        t = self._by_namespace.get(namespace)
        if t is not None or not self._by_selector:
            return t
        for selector, tenant in self._by_selector:
            if selector.matches(labels or {}):
                return tenant
        return None

    def selector_tenants(self) -> list[str]:
        """The tenants chosen by namespace labels (``namespaceSelector``)."""
        return [t.name for _, t in self._by_selector]

    def labels_selecting(self, tenant: str) -> dict[str, str] | None:
        """Namespace labels that the tenant's selector matches (its matchLabels, and the
        first value of each ``In``), or None when it has none or they are not enough:
        for a tool told the tenant of a namespace whose labels it cannot read."""
        for selector, t in self._by_selector:
            if t.name != tenant:
                continue
            labels = dict(selector.labels)
            for key, op, values in selector.expressions:
                if op == "In" and values:
                    labels[key] = sorted(values)[0]
            if selector.matches(labels) and self.tenant_for("", labels) is t:
                return labels
        return None

    def named_namespaces(self) -> frozenset[str]:
        """The namespaces the policy gives a tenant by name (not by label selector)."""
        return frozenset(self._by_namespace)

    def mode_for(self, rule: Rule, tenant: TenantRules | None) -> Mode:
        """A rule's own mode wins; then the tenant's; then the policy's."""
        m = self.rule_modes.get(rule)
        if m is not None:
            return m
        if tenant is not None and tenant.mode is not None:
            return tenant.mode
        return self.mode

    def is_exempt(self, namespace: str, username: str, groups: list[str]) -> bool:
        # Service accounts are users named system:serviceaccount:<ns>:<name>, so they live
        # in exempt_users after compilation.
        if namespace in self.exempt_namespaces or username in self.exempt_users:
            return True
        return bool(self.exempt_groups) and any(g in self.exempt_groups for g in groups)

    def product_name(self, value: str) -> str | None:
        """The short name for a product given as short name or node label value."""
        return self.product_alias.get(value)


def compile_policy(policy: GPUPolicy) -> CompiledPolicy:
    spec = policy.spec
    tenants: list[TenantRules] = []
    by_ns: dict[str, TenantRules] = {}
    by_sel: list[tuple[_Selector, TenantRules]] = []
    for t in spec.tenants:
        spot_cap = t.spot.gpus if t.spot else None
        quota = (Limits.of(t.quota, spot_cap) if t.quota else
                 Limits(None, {}, {}, None, spot_cap) if spot_cap is not None else None)
        namespace_quota = ({ns: Limits.of(q) for ns, q in t.quota.namespaces.items()}
                           if t.quota else {})
        capped = set(quota.products) if quota is not None else set()
        for limits in namespace_quota.values():
            capped.update(limits.products)
        rules = TenantRules(
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
                               t.cohort.lending_limit, t.cohort.borrowed_priority_class)
            if t.cohort else None,
            routes=compile_routes(spec.gpu_routes, t.gpu_routes),
            priority=compile_priority(spec.priority, t.priority,
                                      t.cohort.borrowed_priority_class.name
                                      if t.cohort else None),
            waits=t.over_quota is OverQuota.WAIT,
            runtime=compile_runtime(t.max_runtime),
            ratios=compile_ratios(spec.resources_per_gpu, t.resources_per_gpu),
            routing=compile_routing(t.routing),
            user_quota=compile_users(t.user_quota),
            schedule=compile_schedule(t.quota_schedule),
        )
        tenants.append(rules)
        for ns in t.namespaces:
            by_ns[ns] = rules
        if t.namespace_selector is not None:
            by_sel.append((_Selector.of(t.namespace_selector), rules))
    aliases = spec.products.aliases
    product_alias = {v: k for k, v in aliases.items()}
    product_alias.update({k: k for k in aliases})
    ex = spec.exemptions
    users = set(ex.users) | {
        "system:serviceaccount:" + sa.replace("/", ":", 1) for sa in ex.service_accounts
    }
    return CompiledPolicy(
        name=policy.metadata.name,
        mode=spec.mode,
        rule_modes={r: s.mode for r, s in spec.rules.items()},
        gpu_names=frozenset(spec.gpu_resources.names),
        gpu_patterns=tuple(pattern_regex(p) for p in spec.gpu_resources.patterns),
        weights=dict(spec.gpu_resources.weights),
        tolerations=tuple(t.as_pod_toleration() for t in spec.tolerations),
        non_gpu_tolerations=spec.non_gpu_pods_tolerating_gpu_taints,
        unassigned_allowed=spec.unassigned_namespaces == "allow",
        product_label=spec.products.node_label,
        product_value=dict(aliases),
        product_alias=product_alias,
        product_request_label=spec.products.request.label,
        product_request_annotation=spec.products.request.annotation,
        exempt_namespaces=frozenset(ex.namespaces),
        exempt_users=frozenset(users),
        exempt_groups=frozenset(ex.groups),
        tenants=tuple(tenants),
        quota_fail_open=spec.quota_ledger.on_unavailable == "allow",
        reservation_ttl=float(spec.quota_ledger.reservation_ttl_seconds),
        by_name={t.name: t for t in tenants},
        _by_namespace=by_ns,
        _by_selector=tuple(by_sel),
        device_classes=dict(spec.device_classes),
        workload_kinds={(w.group, w.kind): kind_paths(w) for w in spec.workload_kinds},
        spot=compile_spot(spec.spot),
        cohorts=_cohorts(tenants),
        waiting=any(t.waits for t in tenants),
        capabilities=compile_capabilities(spec.gpu_capabilities),
        time_sliced=dict(spec.gpu_resources.time_slicing),
        hami=spec.gpu_resources.hami,
        kai=spec.gpu_resources.kai,
    )


def _cohorts(tenants: list[TenantRules]) -> dict[str, tuple[TenantRules, ...]]:
    out: dict[str, list[TenantRules]] = {}
    for t in tenants:
        if t.cohort is not None:
            out.setdefault(t.cohort.name, []).append(t)
    return {name: tuple(members) for name, members in out.items()}


def kind_paths(w: WorkloadKind) -> KindPaths:
    """A configured workload kind as the pointer paths the workload reader walks."""
    roles = tuple(
        RolePaths(parse_pointer(r.template),
                  parse_pointer(r.replicas) if r.replicas else None,
                  parse_pointer(r.name) if r.name else None,
                  r.default_replicas)
        for r in w.roles)
    return KindPaths(w.kind, roles,
                     parse_pointer(w.gang_minimum) if w.gang_minimum else None,
                     w.gang == "all")
