"""Prometheus metrics: what the webhook decides, how fast, and with which policy.

Labels stay low-cardinality (webhook, operation, kind, decision, rule, mode, tenant):
never pod names, and users only on the GPU-seconds counter (showback per user needs
them; a tenant's users are few). Quota usage, reservation counters and cache state are read
from the usage store at scrape time (:class:`StateCollector`), never on the hot path.
The full list, with the dashboard and alerts built on it: deploy/monitoring/README.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, GCCollector, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # types only: metrics must stay importable from every layer
    from webhook.policy.compiled import CompiledPolicy
    from webhook.policy.tenantrules import Limits
    from webhook.quota.check import UsageView
    from webhook.quota.usage import Totals

REGISTRY = CollectorRegistry(auto_describe=True)

ADMISSIONS = Counter(
    "gpu_webhook_admission_requests_total",
    "Admission reviews answered, by webhook, operation, kind and decision.",
    ["webhook", "operation", "kind", "decision"],
    registry=REGISTRY,
)
FINDINGS = Counter(
    "gpu_webhook_rule_findings_total",
    "Policy violations found, by webhook, rule, mode (enforce/warn/audit) and tenant.",
    ["webhook", "rule", "mode", "tenant"],
    registry=REGISTRY,
)
GPU_SECONDS = Counter(
    "gpu_webhook_gpu_seconds_total",
    "GPU time accounted (GPU-equivalents x seconds, weights of MIG slices, shares and spot "
    "applied, not the budgets' product weights), by tenant, user and product; written by "
    "the leader replica as it records the time (sum over replicas).",
    ["tenant", "user", "product"],
    registry=REGISTRY,
)
BUDGET_USED = Gauge(
    "gpu_webhook_budget_used_gpu_hours",
    "GPU-hours (product weights applied) each tenant's budget has used in its open period, "
    "as this replica decides admissions by (refreshed every few seconds).",
    ["tenant"],
    registry=REGISTRY,
)
BUDGET_LIMIT = Gauge(
    "gpu_webhook_budget_gpu_hours",
    "Each tenant's budget of GPU-hours per period (tenants[].budget.gpuHours).",
    ["tenant"],
    registry=REGISTRY,
)
REUSED = Counter(
    "gpu_webhook_mutating_decisions_reused_total",
    "Mutating reviews answered with the decision already made for a pod of the same "
    "shape (a ReplicaSet's or a Job's pods), under the same policy and namespace labels.",
    registry=REGISTRY,
)
REUSED_CHECKS = Counter(
    "gpu_webhook_validations_reused_total",
    "Validating reviews of pod creations whose checks (every rule but quota) were the ones "
    "already made for a pod of the same shape, re-aimed at this pod; quota is decided "
    "for each pod.",
    registry=REGISTRY,
)
MUTATIONS = Counter(
    "gpu_webhook_mutations_total",
    "Changes made by the mutating webhook, by kind of change.",
    ["change"],
    registry=REGISTRY,
)
BAD_REVIEWS = Counter(
    "gpu_webhook_bad_reviews_total",
    "Requests refused before admission because the body was not a usable AdmissionReview.",
    ["webhook", "status"],
    registry=REGISTRY,
)
ERRORS = Counter(
    "gpu_webhook_errors_total",
    "Reviews the webhook failed to decide (answered as denials).",
    ["webhook"],
    registry=REGISTRY,
)
OVERLOAD = Counter(
    "gpu_webhook_overload_refusals_total",
    "Admission requests answered with an HTTP error because of load, by webhook and "
    "reason: inflight (429, --max-inflight reached), deadline (503, queued past the "
    "deadline), body-timeout (408, the body did not arrive in time).",
    ["webhook", "reason"],
    registry=REGISTRY,
)
LATE = Counter(
    "gpu_webhook_admission_late_answers_total",
    "Admission answers written after the API server's own timeout for the call (its "
    "?timeout=, counted from the request's arrival): it had given up, and applied the "
    "webhook's failurePolicy.",
    ["webhook"],
    registry=REGISTRY,
)
RELAYS = Counter(
    "gpu_webhook_relayed_reviews_total",
    "Reviews relayed to the replica that decides GPU quota (--quota-commit leader), by "
    "outcome: answered (its answer was sent on), failed (no answer: decided here, where "
    "a quota commit is refused).",
    ["webhook", "outcome"],
    registry=REGISTRY,
)
DECIDING = Gauge(
    "gpu_webhook_quota_deciding",
    "1 while this replica decides GPU quota (--quota-commit leader: it leads and its "
    "hand-over is over), else 0.",
    registry=REGISTRY,
)
INFLIGHT = Gauge(
    "gpu_webhook_inflight_requests",
    "Admission requests being handled now (bounded by --max-inflight).",
    registry=REGISTRY,
)
# Up to the API server's longest webhook timeout (30 s): a quota commit that waits on a
# slow API server stays within a finite bucket, so its p99 is read, not capped.
ADMISSION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENCY = Histogram(
    "gpu_webhook_admission_duration_seconds",
    "Server-side time to decide a review, from full body to reply.",
    ["webhook"],
    buckets=ADMISSION_BUCKETS,
    registry=REGISTRY,
)
PHASE = Histogram(
    "gpu_webhook_admission_phase_seconds",
    "Seconds of each phase of an admission, by webhook (mutate, validate): parse (the "
    "review parsed), decide (the admission pipeline, a quota commit included); and of the "
    "quota ledger (webhook=ledger), per admission: commit (from its ask to its answer), "
    "queued (of that, waiting for its tenant's commit to start); per commit attempt: read "
    "(the ledger read from the API server, when the last write is not reused), decide (the "
    "batch decided), write (the conditional write), backoff (the pause after a conflict).",
    ["webhook", "phase"],
    buckets=ADMISSION_BUCKETS,
    registry=REGISTRY,
)
POLICY_GENERATION = Gauge(
    "gpu_webhook_policy_generation",
    "Generation of the policy serving now (increments on each successful load).",
    registry=REGISTRY,
)
POLICY_RELOADS = Counter(
    "gpu_webhook_policy_reloads_total",
    "Policy loads, by result (success or failure).",
    ["result"],
    registry=REGISTRY,
)
POLICY_LAST_SUCCESS = Gauge(
    "gpu_webhook_policy_last_success_timestamp_seconds",
    "Unix time of the last successful policy load.",
    registry=REGISTRY,
)
SCALES_UNCHECKED = Counter(
    "gpu_webhook_scales_unchecked_total",
    "Scale-ups (kubectl scale, an HPA) of workloads in tenants with quota that were admitted "
    "unchecked, with a warning, because the workload could not be read from the API server "
    "(unreachable, too slow, not found or forbidden: check the webhook's RBAC).",
    registry=REGISTRY,
)
RESERVATIONS_UNAVAILABLE = Counter(
    "gpu_webhook_quota_reservations_unavailable_total",
    "GPU pod admissions whose quota reservation could not be committed (shared state "
    "unreachable or too contended within the request's budget); denied, or admitted "
    "uncounted with a warning when quotaLedger.onUnavailable is allow.",
    registry=REGISTRY,
)
CERT_EXPIRY = Gauge(
    "gpu_webhook_certificate_expiry_timestamp_seconds",
    "Unix time at which the serving certificate in use expires (follows reloads).",
    registry=REGISTRY,
)
HEAP_FROZEN = Gauge(
    "gpu_webhook_heap_frozen_objects",
    "Objects moved out of the garbage collector's full passes (gc.freeze) at start-up, "
    "when the caches first listed the cluster and when a new policy was served.",
    registry=REGISTRY,
)
# The collector's own counts (python_gc_collections_total, python_gc_objects_collected_total
# by generation): every pass stops the event loop, so their rate is where a latency tail
# from garbage collection shows.
GCCollector(registry=REGISTRY)
LEADER = Gauge(
    "gpu_webhook_leader",
    "1 while this replica holds the leader Lease (it writes the GPUQuota status and the "
    "audit's PolicyReports), else 0.",
    registry=REGISTRY,
)
CONFIGURATION_DRIFT = Gauge(
    "gpu_webhook_configuration_drift",
    "Differences between a webhook configuration the API server holds and the one the "
    "served policy needs (webhooks missing, not needed or changed; 1 when it is absent "
    "or unreadable), by configuration, as the leader last compared them; 0 in step.",
    ["configuration"],
    registry=REGISTRY,
)
CONFIGURATION_WRITES = Counter(
    "gpu_webhook_configuration_writes",
    "Webhook configurations the leader wrote as the served policy needs them, by "
    "configuration and result (written, conflict, failed).",
    ["configuration", "result"],
    registry=REGISTRY,
)
AUDIT_RESULTS = Gauge(
    "gpu_webhook_audit_results",
    "Results of the leader's last periodic audit, by result (fail, warn).",
    ["result"],
    registry=REGISTRY,
)

# The quota line (tenants[].overQuota: wait), written by the leader's release rounds.
WAITING_PODS = Gauge(
    "gpu_webhook_waiting_pods",
    "Pods waiting behind the quota gate, by tenant (the leader's count; 0 elsewhere).",
    ["tenant"],
    registry=REGISTRY,
)
WAITING_GPUS = Gauge(
    "gpu_webhook_waiting_gpus",
    "GPU-equivalents the waiting pods ask, by tenant.",
    ["tenant"],
    registry=REGISTRY,
)
RELEASE_LATENCY = Histogram(
    "gpu_webhook_release_latency_seconds",
    "Seconds from the moment a waiting pod could fit (a pod of its tenant gave GPUs back, "
    "or the pod arrived, whichever is later) to its release (charge committed, gate "
    "removed).",
    ["tenant"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60),
    registry=REGISTRY,
)
RELEASE_SECONDS = Histogram(
    "gpu_webhook_release_wait_seconds",
    "Seconds from a waiting pod's creation to its release (charge committed, gate removed).",
    ["tenant"],
    buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400),
    registry=REGISTRY,
)
RELEASED = Counter(
    "gpu_webhook_released_pods_total",
    "Waiting pods released by the leader, by tenant.",
    ["tenant"],
    registry=REGISTRY,
)


class _Store(Protocol):
    def view(self) -> UsageView: ...
    def ready(self) -> bool: ...


Namespaces = Callable[[], Mapping[str, Mapping[str, str]]]  # name -> labels, as watched


def no_namespaces() -> Mapping[str, Mapping[str, str]]:
    return {}


def namespace_tenants(policy: CompiledPolicy, known: Mapping[str, Mapping[str, str]]
                      ) -> list[tuple[str, str, str]]:
    """(namespace, tenant, product) for every namespace that belongs to a tenant: those
    the policy names, and those the cluster cache knows whose labels a tenant selects.
    ``product`` is the tenant's one allowed product, "" when it may use several: a GPU
    series of the namespace then is of that product, without asking the node."""
    names = set(known)
    for t in policy.tenants:
        names.update(t.namespace_quota)
    names.update(policy.named_namespaces())
    out = []
    for ns in sorted(names):
        owner = policy.tenant_for(ns, known.get(ns))
        if owner is None:
            continue
        allowed = owner.allowed_products or ()
        out.append((ns, owner.name, allowed[0] if len(allowed) == 1 else ""))
    return out


class StateCollector(Collector):
    """Quota usage and limits, reservation counters and cache state, read from the usage
    store when Prometheus scrapes: nothing is updated on the admission path.

    ``gpu_webhook_quota_used`` / ``gpu_webhook_quota_limit`` have one series per cap in
    the policy (labels: tenant; scope tenant or namespace; namespace, empty for tenant
    scope; name: gpus, a resource name, product:<short name>, spot or pods), so their number is
    bounded by the policy, not by the cluster.
    """

    def __init__(self, store: _Store | None, policy: Callable[[], CompiledPolicy | None],
                 namespaces: Namespaces = no_namespaces) -> None:
        # The policy is looked up at every scrape: reloads replace it.
        self._store, self._policy = store, policy
        self._namespaces = namespaces

    def describe(self) -> Iterable[Metric]:
        return []  # what collect() yields depends on the policy; nothing to pre-register

    def collect(self) -> Iterable[Metric]:
        store, policy = self._store, self._policy()
        if store is None:
            return
        yield from _quota(policy, store)
        if policy is not None and policy.cohorts:
            yield from _cohorts(policy, store.view())
        yield _namespace_tenants(policy, self._namespaces())
        yield from _store_state(store)


def _quota(policy: CompiledPolicy | None, store: _Store) -> Iterator[Metric]:
    """Each cap of the policy, and what is in use under it."""
    labels = ["tenant", "scope", "namespace", "name"]
    used = GaugeMetricFamily("gpu_webhook_quota_used",
                             "Quota in use (running pods plus reservations), per cap.",
                             labels=labels)
    limit = GaugeMetricFamily("gpu_webhook_quota_limit", "Quota caps of the policy.",
                              labels=labels)
    if policy is not None:
        view = store.view()
        for t in policy.tenants:
            scopes: list[tuple[str, str, Limits, Totals]] = (
                [("tenant", "", t.quota, view.tenant(t.name))] if t.quota else [])
            scopes += [("namespace", ns, q, view.namespace(ns))
                       for ns, q in sorted(t.namespace_quota.items())]
            for scope, ns, caps, totals in scopes:
                for name, cap, now in _caps(caps, totals):
                    used.add_metric([t.name, scope, ns, name], now)
                    limit.add_metric([t.name, scope, ns, name], cap)
    yield used
    yield limit


def _namespace_tenants(policy: CompiledPolicy | None, namespaces: Mapping[str, Mapping[str, str]]
                       ) -> Metric:
    # The join key for NVIDIA's dcgm-exporter, whose series carry namespace and pod but
    # know nothing of tenants: `DCGM_... * on (namespace) group_left (tenant)
    # gpu_webhook_namespace_tenant` sums GPU activity per tenant. One series per
    # namespace of a tenant, so bounded by the cluster's namespaces.
    info = GaugeMetricFamily(
        "gpu_webhook_namespace_tenant",
        "1 for each namespace that belongs to a GPU tenant (by name or by its labels); "
        "product: the tenant's one allowed GPU product, empty when it has several.",
        labels=["namespace", "tenant", "product"])
    if policy is not None:
        for ns, tenant, product in namespace_tenants(policy, namespaces):
            info.add_metric([ns, tenant, product], 1.0)
    return info


def _store_state(store: _Store) -> Iterator[Metric]:
    """The store's reservation counters and whether its caches are synced."""
    for attr, name, text in (
        ("commits", "gpu_webhook_quota_reservations",
         "Quota reservations committed for admitted GPU pods."),
        ("conflicts", "gpu_webhook_quota_reservation_conflicts",
         "Ledger writes that lost a compare-and-swap race to another replica (retried)."),
        ("expired", "gpu_webhook_quota_reservations_expired",
         "Reservations dropped after their TTL because their pod was never seen."),
    ):
        # Always exposed (0 where a store has no such event, e.g. no conflicts in
        # memory) so that dashboards and alerts never see a missing series.
        value = getattr(store, attr, 0)
        yield CounterMetricFamily(name, text, value=value if isinstance(value, int) else 0)
    yield GaugeMetricFamily("gpu_webhook_cache_synced",
                            "1 when the usage store's cluster caches are synced (always "
                            "1 for the in-memory store).", value=float(store.ready()))


def _cohorts(policy: CompiledPolicy, view: UsageView) -> Iterator[Metric]:
    """Borrowing in each cohort (one series per tenant of a cohort, bounded by the
    policy): what each borrows and lends now, and what is borrowed beyond what the
    cohort lends (the lenders took it back; the scheduler preempts it)."""
    # At scrape time, not at import: this module stays importable from every layer.
    from webhook.quota.borrow import cohort_members
    from webhook.quota.cohort import overdrawn

    borrowed = GaugeMetricFamily(
        "gpu_webhook_cohort_borrowed_gpus",
        "GPU-equivalents a tenant's pods hold on quota borrowed from its cohort.",
        labels=["cohort", "tenant"])
    lendable = GaugeMetricFamily(
        "gpu_webhook_cohort_lendable_gpus",
        "GPU-equivalents of a tenant's unused quota its cohort may borrow (within its "
        "lendingLimit).", labels=["cohort", "tenant"])
    over = GaugeMetricFamily(
        "gpu_webhook_cohort_overdrawn_gpus",
        "GPU-equivalents borrowed beyond what the cohort lends now: lenders took them "
        "back, and the scheduler preempts that many borrowed GPUs when it needs them.",
        labels=["cohort"])
    for name, tenants in sorted(policy.cohorts.items()):
        members = cohort_members(policy, tenants[0], view)
        for m in members:
            borrowed.add_metric([name, m.name], m.borrowed)
            lendable.add_metric([name, m.name], m.lendable)
        over.add_metric([name], overdrawn(members))
    yield borrowed
    yield lendable
    yield over


def _caps(caps: Limits, totals: Totals) -> Iterator[tuple[str, float, float]]:
    if caps.gpus is not None:
        yield "gpus", caps.gpus, totals.gpus
    for r, devices in sorted(caps.resources.items()):
        yield r, devices, totals.resources.get(r, 0.0)
    for p, equivalents in sorted(caps.products.items()):
        yield f"product:{p}", equivalents, totals.products.get(p, 0.0)
    if caps.spot is not None:
        yield "spot", caps.spot, totals.spot
    if caps.shared is not None:
        yield "shared", caps.shared, totals.shared
    if caps.pods is not None:
        yield "pods", caps.pods, totals.pods


class Exposition:
    """What one server's ``/metrics`` shows: the process-wide counters and histograms
    (``REGISTRY``), then that server's own quota state. Anything with ``collect()`` is a
    registry to ``generate_latest``."""

    def __init__(self, state: StateCollector) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        yield from self.state.collect()


_CHILDREN: dict[tuple[int, tuple[str, ...]], Any] = {}


def child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, memoised: the client's own lookup validates and
    hashes the labels on every call, which costs more than the increment on the hot
    path. Bounded so hostile label values cannot grow it without end."""
    key = (id(metric), labels)
    found = _CHILDREN.get(key)
    if found is None:
        found = metric.labels(*labels)
        if len(_CHILDREN) < 10_000:
            _CHILDREN[key] = found
    return found
