"""A tenant's GPU quota as numbers a person reads: per scope (the tenant, or a namespace
with caps of its own) and cap (GPUs, a resource, a product, pods), used / reserved /
limit / free, and the biggest consumers.

One code for both places that show it: ``gpu-webhook status`` (a one-shot read of the
cluster) and the ``GPUQuota`` objects the webhook keeps current for ``kubectl get``
(from its watch cache and ledger). Both hand in two :class:`Usage` totals, what running
pods hold and what reservations hold for pods not created yet, so the numbers agree by
construction. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.engine import messages
from webhook.engine.borrowed import account
from webhook.engine.charge import charge_of_pod
from webhook.engine.waiting import is_gated, ungated
from webhook.k8s.identity import ObjectId
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.tenantrules import Limits, TenantRules
from webhook.quota.borrow import cohort_members
from webhook.quota.budget import Used
from webhook.quota.cohort import overdrawn, room
from webhook.quota.store import Combined
from webhook.quota.usage import Totals, Usage

# The status object: one per namespace of a tenant with a quota, named after the tenant.
GROUP = "gpu-webhook.dev"
VERSION = "v1alpha1"
KIND = "GPUQuota"
PLURAL = "gpuquotas"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-webhook"}
TOP = 3  # consumers named per tenant


@dataclass(frozen=True, slots=True)
class Row:
    tenant: str
    scope: str  # "tenant" or "namespace <name>"
    cap: str  # gpus, a resource name, product:<name>, spot, pods, borrowed gpus
    used: float  # running pods (not reservations)
    reserved: float  # live reservations for pods not seen yet
    limit: float

    @property
    def free(self) -> float:
        return max(self.limit - self.used - self.reserved, 0.0)


@dataclass(slots=True)
class Report:
    rows: list[Row]
    pods: dict[str, int]  # tenant -> GPU pods running
    top: dict[str, list[tuple[str, float]]]  # tenant -> biggest holders (GPU-equivalents)
    unread: list[str]
    cohorts: list[str] = field(default_factory=list)  # one line per cohort shown
    # tenant -> (pods waiting behind the quota gate, GPU-equivalents they ask)
    waiting: dict[str, tuple[int, float]] = field(default_factory=dict)
    holding: list[str] = field(default_factory=list)  # how tenants' GPUs are held
    # tenant -> the quota window whose caps apply now ("" outside every window), for the
    # tenants with a quotaSchedule.
    windows: dict[str, str] = field(default_factory=dict)
    # tenant -> (product, GPU-equivalents) its running pods hold on each GPU product, a
    # bound pod on its node's product: shown for every tenant, product caps or not (a pod
    # allowed two products is counted on the one it runs on).
    products: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    # tenant -> what its GPU-hour budget has used in its open period (tenants[].budget).
    budgets: dict[str, Used] = field(default_factory=dict)


def of(tenants: Sequence[TenantRules], seen: Usage, held: Usage,
       namespace: str | None = None, unread: Sequence[str] = (),
       policy: CompiledPolicy | None = None, now: float | None = None) -> Report:
    """The caps of ``tenants`` (each tenant's own, its users' and its namespaces' or
    only ``namespace``'s), with what ``seen`` pods and ``held`` reservations take of
    them; at unix time ``now``, a tenant's caps are those of its quota window open then.
    Given the ``policy``, a tenant-wide report also shows what each cohort tenant
    borrows and may borrow, and a line per cohort."""
    rows: list[Row] = []
    windows: dict[str, str] = {}
    for t in tenants:
        if now is not None and t.schedule is not None:
            t = t.at(now)
            windows[t.name] = window_named(t)
        scopes: list[tuple[str, Limits | None, Totals, Totals]] = [
            ("tenant", t.quota, seen.tenant(t.name), held.tenant(t.name))]
        if t.user_quota is not None:
            per_user = Limits(t.user_quota.gpus, {}, {}, t.user_quota.pods)
            scopes += [(f"user {u}", per_user, seen.user(t.name, u), held.user(t.name, u))
                       for u in sorted({*seen.users(t.name), *held.users(t.name)})]
        scopes += [(f"namespace {ns}", q, seen.namespace(ns), held.namespace(ns))
                   for ns, q in sorted(t.namespace_quota.items())
                   if namespace is None or ns == namespace]
        for scope, limits, used, reserved in scopes:
            if limits is None:
                continue
            for cap, limit, u, r in _caps(limits, used, reserved):
                rows.append(Row(t.name, scope, cap, u, r, limit))
        if policy is not None and t.cohort is not None and namespace is None:
            rows.append(_borrowing(policy, t, seen, held))
    lines = _cohort_lines(policy, tenants, seen, held) if policy is not None else []
    return Report(rows, {t.name: seen.tenant(t.name).pods for t in tenants},
                  {t.name: seen.top_owners(("tenant", t.name), TOP) for t in tenants},
                  list(unread), lines, windows=windows,
                  products={t.name: on_products(seen.tenant(t.name)) for t in tenants})


def on_products(used: Totals) -> list[tuple[str, float]]:
    """What ``used`` holds on each GPU product, by product name (none left out but
    products nothing holds any more)."""
    return [(p, g) for p, g in sorted(used.products.items()) if g > 1e-9]


def window_named(t: TenantRules) -> str:
    """``working-hours (Mon-Fri 08:00-18:00 Europe/Berlin)``: the window whose caps
    apply (``t`` as :meth:`TenantRules.at` made it), or "" outside every window."""
    w = t.window
    if w is None or t.schedule is None:
        return ""
    names = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
    days = ",".join(names[d] for d in sorted(w.days))
    return f"{w.name} ({days} {w.hours()} {t.schedule.zone.key})"


def _borrowing(policy: CompiledPolicy, t: TenantRules, seen: Usage, held: Usage) -> Row:
    """A cohort tenant's borrowed GPUs: USED/RESERVED on borrowed quota, FREE what it
    may borrow now (LIMIT is the two together)."""
    assert t.cohort is not None
    r = room(cohort_members(policy, t, Combined(seen, held)), t.name)
    used, reserved = seen.tenant(account(t.name)).gpus, held.tenant(account(t.name)).gpus
    return Row(t.name, f"cohort {t.cohort.name}", "borrowed gpus", used, reserved,
               used + reserved + r.free)


def _cohort_lines(policy: CompiledPolicy, tenants: Sequence[TenantRules], seen: Usage,
                  held: Usage) -> list[str]:
    out = []
    for name in sorted({t.cohort.name for t in tenants if t.cohort is not None}):
        members = cohort_members(policy, policy.cohorts[name][0], Combined(seen, held))
        borrowing = ", ".join(f"{m.name} {messages.num(m.borrowed)}" for m in members
                              if m.borrowed) or "nobody"
        lending = ", ".join(f"{m.name} {messages.num(m.lendable)}" for m in members)
        line = (f"cohort {name}: borrowed (preemptible) by {borrowing}; idle to lend: "
                f"{lending}")
        over = overdrawn(members)
        if over:
            line += (f"; {messages.num(over)} borrowed GPUs are taken back by their "
                     "lenders and will be preempted when the scheduler needs them")
        out.append(line)
    return out


def seen_from(report: Report, namespace: str) -> Report:
    """``report`` (of whole tenants) as :func:`of` with ``namespace`` gives it: the
    tenants' own caps and that namespace's, the others' left out. For the GPUQuota
    objects: one report per tenant, then one view per namespace."""
    rows = [r for r in report.rows if r.scope in ("tenant", f"namespace {namespace}")
            or r.scope.startswith("user ")]
    return Report(rows, report.pods, report.top, list(report.unread),
                  waiting=dict(report.waiting), windows=report.windows,
                  products=report.products, budgets=report.budgets)


def _caps(limits: Limits, used: Totals, reserved: Totals
          ) -> Iterator[tuple[str, float, float, float]]:
    if limits.gpus is not None:
        yield "gpus", limits.gpus, used.gpus, reserved.gpus
    for r, devices in sorted(limits.resources.items()):
        yield r, float(devices), used.resources.get(r, 0.0), reserved.resources.get(r, 0.0)
    for p, n in sorted(limits.products.items()):
        yield (f"product:{p}", n, used.products.get(p, 0.0), reserved.products.get(p, 0.0))
    if limits.spot is not None:
        yield "spot", limits.spot, used.spot, reserved.spot
    if limits.shared is not None:
        yield "shared", limits.shared, used.shared, reserved.shared
    if limits.pods is not None:
        yield "pods", float(limits.pods), float(used.pods), float(reserved.pods)


def headline(rows: Sequence[Row]) -> Row | None:
    """The GPU cap that binds first: of the ``gpus`` caps (the tenant's, the namespace's
    own), the one with the least free; ties go to the tenant's."""
    # A user's cap binds that user only: the object's columns are the tenant's.
    gpus = [r for r in rows if r.cap == "gpus" and not r.scope.startswith("user ")]
    return min(gpus, key=lambda r: (r.free, r.scope != "tenant")) if gpus else None


def _n(v: float) -> int | float:
    """Whole numbers as integers (kubectl prints 7, not 7.0); slices keep their fraction."""
    v = round(v, 6)
    return int(v) if v == int(v) else v


def gpuquota_status(report: Report, tenant: str, policy: str) -> dict[str, Any]:
    """The ``status`` of a GPUQuota object: the headline numbers that ``kubectl get``
    prints, every cap, and the tenant's top consumers."""
    rows = [r for r in report.rows if r.tenant == tenant]
    out: dict[str, Any] = {"tenant": tenant, "policy": policy,
                           "pods": report.pods.get(tenant, 0)}
    top = headline(rows)
    if top is not None:
        out.update(scope=top.scope, used=_n(top.used), reserved=_n(top.reserved),
                   limit=_n(top.limit), free=_n(top.free))
    out["caps"] = [{"scope": r.scope, "cap": r.cap, "used": _n(r.used),
                    "reserved": _n(r.reserved), "limit": _n(r.limit), "free": _n(r.free)}
                   for r in rows]
    out["topConsumers"] = [{"owner": o, "gpus": _n(g)} for o, g in report.top.get(tenant, [])]
    out["byProduct"] = [{"product": p, "gpus": _n(g)}
                        for p, g in report.products.get(tenant, [])]
    if tenant in report.windows:
        # "" outside every window: the tenant's own caps apply.
        out["window"] = report.windows[tenant]
    if tenant in report.waiting:
        n, g = report.waiting[tenant]
        out.update(waitingPods=n, waitingGpus=_n(g))
    if tenant in report.budgets:
        b = report.budgets[tenant]
        # Rounded as messages show it: the object is written again when it changes.
        out["budget"] = {"gpuHours": _n(b.limit), "usedGpuHours": hours(b.used),
                         "period": b.span.label, "percent": round(b.percent)}
    return out


def hours(x: float) -> float:
    """GPU-hours to 2 decimals (3 below one hour), as messages print them."""
    return round(x, 2 if x >= 1 else 3)


def budget_line(tenant: str, b: Used) -> str:
    """What ``status`` prints of a tenant's budget."""
    return (f"{tenant}: {round(b.percent)} % of its {messages.num(b.limit)} GPU-hours for "
            f"{b.span.label} used ({messages.num(hours(b.used))} GPU-hours)"
            + ("; its new GPU pods are refused or wait" if b.spent else ""))


def waiting_of(pods: Iterable[Mapping[str, Any]], policy: CompiledPolicy,
               labels: Callable[[str], Mapping[str, str] | None]
               ) -> dict[str, tuple[int, float]]:
    """Per tenant, the pods waiting behind the quota gate and the GPU-equivalents they
    ask (charged as they will be once released)."""
    out: dict[str, tuple[int, float]] = {}
    for pod in pods:
        if not is_gated(pod):
            continue
        charge = charge_of_pod(ungated(pod), policy, labels(ObjectId.of(pod).namespace))
        if charge is None:
            continue
        n, g = out.get(charge.tenant, (0, 0.0))
        out[charge.tenant] = (n + 1, g + charge.gpus)
    return out


def gpuquota(namespace: str, tenant: str, status: dict[str, Any]) -> dict[str, Any]:
    """The whole GPUQuota object of ``tenant`` in ``namespace``."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": tenant, "namespace": namespace, "labels": dict(MANAGED_BY)},
            "status": status}
