"""GPU-hour budgets as admission asks them (pure): what each tenant (and user) has used
in its open period, as one snapshot, and whether a GPU pod may start under it.

A snapshot (:class:`Spending`) is made every few seconds on every replica from the kept
days and the GPU time held since they were last written (:mod:`webhook.quota.usagebook`,
:mod:`webhook.quota.gputime`), so a budget is seen spent within seconds of its last
GPU-second, whichever replica answers. A pod is refused (or waits) only once the
budget is used up: a pod admitted just before may take it past, by what it then runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from webhook.engine import messages
from webhook.policy.budgets import AccountingRules, BudgetRules, Span
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.tenantrules import TenantRules
from webhook.quota.fairshare import recent, standing
from webhook.quota.gputime import HOUR, Tally
from webhook.quota.usagebook import DayBook, Sums, sums


@dataclass(frozen=True, slots=True)
class Used:
    """GPU-hours (weighed) used in a budget's open period, and its limit."""

    used: float
    limit: float
    span: Span

    @property
    def spent(self) -> bool:
        return self.used >= self.limit

    @property
    def percent(self) -> float:
        return 100.0 * self.used / self.limit if self.limit else 100.0


def weighed(rows: Sums, accounting: AccountingRules | None, tenant: str | None = None,
            user: str | None = None) -> float:
    """GPU-hours of ``rows`` (one tenant's, one user's), each product's hour times its
    weight."""
    total = 0.0
    for (t, _, u, product), seconds in rows.rows.items():
        if (tenant is None or t == tenant) and (user is None or u == user):
            total += seconds * (accounting.weight(product) if accounting else 1.0)
    return total / HOUR


@dataclass
class Spending:
    """What each budget has used at ``at``: tenant -> Used, (tenant, user) -> Used."""

    at: float = 0.0
    tenants: dict[str, Used] = field(default_factory=dict)
    users: dict[tuple[str, str], Used] = field(default_factory=dict)
    # Cohort -> each member's standing (webhook.quota.fairshare), for cohorts with fair
    # share on.
    standing: dict[str, dict[str, float]] = field(default_factory=dict)

    def of(self, tenant: str, user: str | None) -> list[tuple[str | None, Used]]:
        """The budgets a pod of ``tenant`` charged to ``user`` is under: (user or None
        for the tenant's, its use)."""
        out: list[tuple[str | None, Used]] = []
        if tenant in self.tenants:
            out.append((None, self.tenants[tenant]))
        if user is not None and (tenant, user) in self.users:
            out.append((user, self.users[(tenant, user)]))
        return out


def spending(policy: CompiledPolicy, days: Iterable[DayBook], live: Tally, now: float
             ) -> Spending:
    """Every budget's use at ``now``: the kept days plus ``live`` (held since they were
    written), over each tenant's open period."""
    kept = list(days)
    out = Spending(at=now)
    for name, members in policy.cohorts.items():
        half = members[0].cohort.half_life if members[0].cohort else None
        if half is not None:
            use = recent(kept, live, now, half, (t.name for t in members))
            out.standing[name] = standing(policy, name, use)
    by_span: dict[tuple[float, float], Sums] = {}
    for t in policy.tenants:
        b = t.budget
        if b is None:
            continue
        span = b.span(now)
        rows = by_span.get((span.start, span.end))
        if rows is None:
            rows = by_span[(span.start, span.end)] = sums(kept, span.start, span.end, live)
        out.tenants[t.name] = Used(weighed(rows, policy.accounting, t.name), b.gpu_hours,
                                   span)
        if b.per_user is not None:
            users = {k[2] for k in rows.rows if k[0] == t.name and k[2]}
            for u in users:
                out.users[(t.name, u)] = Used(weighed(rows, policy.accounting, t.name, u),
                                              b.per_user, span)
    return out


def spending_of(policy: CompiledPolicy, tenants: dict[str, float],
                users: dict[tuple[str, str], float], now: float) -> Spending:
    """A snapshot from GPU-hours said to be used in each budget's open period (the policy
    test suites' ``gpuTime``), as :func:`spending` makes one from the kept GPU time."""
    out = Spending(at=now)
    for t in policy.tenants:
        b = t.budget
        if b is None:
            continue
        span = b.span(now)
        out.tenants[t.name] = Used(tenants.get(t.name, 0.0), b.gpu_hours, span)
        if b.per_user is not None:
            for (tenant, user), hours in users.items():
                if tenant == t.name:
                    out.users[(tenant, user)] = Used(hours, b.per_user, span)
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a budget says of one GPU pod: refused (or to wait) with ``reason``, and the
    warnings of thresholds passed."""

    reason: str | None
    warnings: tuple[str, ...] = ()


def judge(tenant: TenantRules, user: str | None, spent: Spending, now: float,
          gate: bool = False) -> Verdict:
    """Whether a GPU pod of ``tenant`` (charged to ``user``) may start now; ``gate``: the
    reason is the one of a pod gated to wait for GPU-hours (else a refusal's)."""
    b: BudgetRules | None = tenant.budget
    if b is None:
        return Verdict(None)
    warnings: list[str] = []
    for who, used in spent.of(tenant.name, user):
        if used.spent:
            back = b.next_free(now)
            make = messages.waits_for_budget if gate else messages.budget_spent
            return Verdict(make(tenant.name, who, used.used, used.limit, used.span.label,
                                back))
        passed = [p for p in b.warn_at if used.percent >= p]
        if passed:
            warnings.append(messages.budget_warning(tenant.name, who, used.used, used.limit,
                                                    used.span.label))
    return Verdict(None, tuple(warnings))


def no_spending() -> Spending:
    return Spending()


