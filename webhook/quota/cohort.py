"""Borrowing arithmetic: how many idle GPUs of its cohort a tenant may borrow now.

Pure functions over numbers (GPU-equivalents of the tenants' ``quota.gpus`` caps), so
the rules can be stated and tested apart from the stores:

* a tenant's **own** use counts its pods that are not borrowed; what it leaves unused
  of its cap is *idle*, and at most ``lendingLimit`` of that is *lendable*;
* a tenant may borrow while, after the pod, (1) its borrowed GPUs stay within its
  ``borrowingLimit``, (2) its borrowed GPUs stay within what the *other* tenants lend
  (it never borrows its own idle quota), and (3) everything borrowed in the cohort
  stays within everything lendable in it.

(2) and (3) are together exactly the condition (Hall's) under which the borrowed GPUs
can be assigned to lenders with no lender lending more than it has lendable and no
tenant lending to itself: for any two or more borrowers every tenant may lend to one of
them, so only a single borrower's own idle needs excluding. Since a lender's own use
plus its lendable never exceeds its cap, (3) also keeps own use plus borrowed within the
cohort's total quota.

Reclaiming: a lender's own admissions never consult what is borrowed (its quota is
always its own). When it takes GPUs back, lendable shrinks below what is borrowed and
the cohort is *overdrawn* by the difference (:func:`overdrawn`): no new borrowing until
it is not, and the borrowed pods (at the borrowed PriorityClass) are the ones the
scheduler preempts to fit the lender's pods.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from webhook.engine.borrowed import account, borrower_of
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.tenantrules import TenantRules
from webhook.quota.usage import Totals

__all__ = ["Member", "Room", "account", "borrower_of", "ceiling", "fits", "members",
           "overdrawn", "room"]

EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Member:
    """One tenant of a cohort, in GPU-equivalents; a None limit is no limit."""

    name: str
    quota: float
    used: float  # own pods (not borrowed) and their reservations
    borrowed: float  # its borrowed pods and their reservations
    borrowing_limit: float | None = None
    lending_limit: float | None = None

    @property
    def idle(self) -> float:
        return max(self.quota - self.used, 0.0)

    @property
    def lendable(self) -> float:
        cap = math.inf if self.lending_limit is None else self.lending_limit
        return min(self.idle, cap)


@dataclass(frozen=True, slots=True)
class Room:
    """What ``borrower`` may borrow now, and which bound sets it."""

    free: float
    bound: str  # "borrowingLimit", "lenders" (what the others lend) or "cohort"
    limit_left: float  # of the borrowing limit (inf without one)
    others_lend: float  # what the other tenants lend, minus what the borrower has
    cohort_left: float  # everything lendable minus everything borrowed


def room(members: Sequence[Member], borrower: str) -> Room:
    """How many GPU-equivalents ``borrower`` may borrow now (0 or more)."""
    me = next(m for m in members if m.name == borrower)
    limit_left = (math.inf if me.borrowing_limit is None
                  else me.borrowing_limit - me.borrowed)
    others_lend = sum(m.lendable for m in members if m.name != borrower) - me.borrowed
    cohort_left = sum(m.lendable for m in members) - sum(m.borrowed for m in members)
    bounds = [("borrowingLimit", limit_left), ("lenders", others_lend),
              ("cohort", cohort_left)]
    bound, free = min(bounds, key=lambda b: b[1])
    return Room(max(free, 0.0), bound, limit_left, others_lend, cohort_left)


def fits(members: Sequence[Member], borrower: str, gpus: float) -> bool:
    """Whether ``borrower`` may borrow ``gpus`` more now."""
    return gpus <= room(members, borrower).free + EPSILON


def overdrawn(members: Sequence[Member]) -> float:
    """GPU-equivalents borrowed beyond what the cohort lends now: the lenders took them
    back, and that many borrowed GPUs are the scheduler's to preempt."""
    return max(sum(m.borrowed for m in members) - sum(m.lendable for m in members), 0.0)


def members(cohort: Sequence[tuple[str, float, float | None, float | None]],
            own: dict[str, Totals], borrowed: dict[str, Totals]) -> list[Member]:
    """The cohort's members from (tenant, quota.gpus, borrowingLimit, lendingLimit)
    and the usage totals of each tenant's own and borrowed accounts."""
    out = []
    for name, quota, borrowing, lending in cohort:
        o, b = own.get(name), borrowed.get(name)
        out.append(Member(name, quota, o.gpus if o else 0.0, b.gpus if b else 0.0,
                          borrowing, lending))
    return out


def ceiling(policy: CompiledPolicy, tenant: TenantRules) -> float:
    """The most a tenant could ever borrow: its borrowing limit, or what the rest of its
    cohort could lend with nothing of their own running (each quota within its lending
    limit). For a workload's "can it ever run" at apply."""
    if tenant.cohort is None:
        return 0.0
    lend = 0.0
    for t in policy.cohorts.get(tenant.cohort.name, ()):
        if t.name == tenant.name or t.quota is None or t.quota.gpus is None:
            continue
        limit = t.cohort.lending_limit if t.cohort else 0.0
        lend += t.quota.gpus if limit is None else min(limit, t.quota.gpus)
    limit = tenant.cohort.borrowing_limit
    return lend if limit is None else min(limit, lend)
