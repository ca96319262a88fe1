"""The policy in the form the engine runs on: lookups precomputed for the hot path.

``compile_policy`` turns the validated ``GPUPolicy`` into plain sets, dicts and tuples
once per (re)load, so deciding a review never walks pydantic models or re-evaluates
patterns. This module holds the policy-wide part (:class:`CompiledPolicy`: resources,
products, exemptions, the tenants' lookups, workload kinds, GPU capabilities); each
tenant's rules are :mod:`webhook.policy.tenantrules`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from webhook.k8s.objects import parse_pointer
from webhook.k8s.workloads import KindPaths, RolePaths
from webhook.policy.budgets import AccountingRules, compile_accounting
from webhook.policy.model import (
    DeviceClass,
    Exemptions,
    GPUCapabilities,
    GPUPolicy,
    HAMi,
    KAIFractions,
    LabelSelector,
    Mode,
    Rule,
    Spec,
    TolerationPolicy,
    WorkloadKind,
    pattern_regex,
)
from webhook.policy.spot import SpotRules, compile_spot
from webhook.policy.tenantrules import TenantRules, compile_tenant

# Every DeviceClass is also requestable as this prefix + its name (KEP-5004).
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"


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


def compile_capabilities(c: GPUCapabilities | None) -> CapabilityRules | None:
    if c is None:
        return None
    return CapabilityRules(c.memory.label, c.memory.annotation, c.compute_capability.label,
                           c.compute_capability.annotation, c.memory_label,
                           c.compute_major_label, c.compute_minor_label, c.memory_capacity,
                           c.compute_attribute)


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
    waiting: bool = False  # some tenant has overQuota: wait, or waits for GPU-hours
    # GPU time (spec.accounting, showback; tenants' budgets): None when nothing asks it.
    accounting: AccountingRules | None = None
    capabilities: CapabilityRules | None = None  # spec.gpuCapabilities
    # gpuResources.timeSlicing: resource -> the device plugin's replicas per GPU.
    time_sliced: Mapping[str, int] = field(default_factory=dict)
    hami: HAMi | None = None  # gpuResources.hami: None when HAMi shares no GPU resource
    kai: KAIFractions | None = None  # gpuResources.kai: None when KAI fractions are off
    # The document it was compiled from: the leader renders the webhook configurations
    # from it (webhook.policy.apiserver).
    model: GPUPolicy | None = field(default=None, compare=False, repr=False)

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
    tenants, by_ns, by_sel = _tenants(spec)
    aliases = spec.products.aliases
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
        product_alias=_product_alias(aliases),
        product_request_label=spec.products.request.label,
        product_request_annotation=spec.products.request.annotation,
        exempt_namespaces=frozenset(spec.exemptions.namespaces),
        exempt_users=frozenset(_exempt_users(spec.exemptions)),
        exempt_groups=frozenset(spec.exemptions.groups),
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
        waiting=any(t.waits or (t.budget is not None and t.budget.waits) for t in tenants),
        accounting=compile_accounting(spec),
        capabilities=compile_capabilities(spec.gpu_capabilities),
        time_sliced=dict(spec.gpu_resources.time_slicing),
        hami=spec.gpu_resources.hami,
        kai=spec.gpu_resources.kai,
        model=policy,
    )


def _tenants(spec: Spec) -> tuple[list[TenantRules], dict[str, TenantRules],
                                  list[tuple[_Selector, TenantRules]]]:
    """The tenants' rules in policy order, and the lookups by namespace name and by
    namespace selector."""
    tenants: list[TenantRules] = []
    by_ns: dict[str, TenantRules] = {}
    by_sel: list[tuple[_Selector, TenantRules]] = []
    for t in spec.tenants:
        rules = compile_tenant(spec, t)
        tenants.append(rules)
        for ns in t.namespaces:
            by_ns[ns] = rules
        if t.namespace_selector is not None:
            by_sel.append((_Selector.of(t.namespace_selector), rules))
    return tenants, by_ns, by_sel


def _product_alias(aliases: Mapping[str, str]) -> dict[str, str]:
    """Node label value (and short name) -> short name."""
    product_alias = {v: k for k, v in aliases.items()}
    product_alias.update({k: k for k in aliases})
    return product_alias


def _exempt_users(ex: Exemptions) -> set[str]:
    """The exempt users, with the exempt service accounts as the users they are."""
    return set(ex.users) | {
        "system:serviceaccount:" + sa.replace("/", ":", 1) for sa in ex.service_accounts
    }


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
