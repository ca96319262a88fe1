"""Fair share in a cohort (pure): each tenant's recent GPU time, decayed by the cohort's
half-life, against its share of the cohort, and the order in which pods waiting for GPUs
to borrow are released (``tenants[].cohort.fairShare``).

A tenant's share is its ``quota.gpus`` over the cohort's total; its use, its decayed
GPU-hours over the cohort's. The pod of the tenant furthest below its share goes first
(use - share, lowest first), then by priority, then arrival, as every waiting line is
ordered. Worked example: docs/quota.md, "Fair share when borrowing".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from webhook.policy.compiled import CompiledPolicy
from webhook.quota.gputime import HOUR, Tally
from webhook.quota.usagebook import DayBook

HORIZON = 10  # half-lives: older hours weigh under 0.1 %, and are not read


def recent(days: Iterable[DayBook], live: Tally, now: float, half_life_hours: float,
           tenants: Iterable[str]) -> dict[str, float]:
    """Each tenant's GPU-hours, every hour weighed 0.5 ** (its age / the half-life)."""
    wanted = set(tenants)
    out = dict.fromkeys(wanted, 0.0)
    half = half_life_hours * HOUR
    oldest = now - HORIZON * half

    def add(tenant: str, hour: float, seconds: float) -> None:
        if tenant in wanted and hour >= oldest:
            age = max(0.0, now - (hour + HOUR / 2))
            out[tenant] += seconds / HOUR * 0.5 ** (age / half)

    for book in days:
        if book.end < oldest:
            continue
        for key, hour, seconds in book.hours():
            add(key[0], hour, seconds)
    for (key, hour), seconds in live.items():
        add(key[0], hour, seconds)
    return out


def standing(policy: CompiledPolicy, cohort: str, use: Mapping[str, float]
             ) -> dict[str, float]:
    """Each member's use of the cohort's recent GPU time less its share of the cohort's
    quota (negative: below its share, served first)."""
    members = policy.cohorts.get(cohort, ())
    quotas = {t.name: (t.quota.gpus or 0.0) if t.quota else 0.0 for t in members}
    total_quota = sum(quotas.values())
    total_use = sum(use.get(t, 0.0) for t in quotas)
    out: dict[str, float] = {}
    for name, q in quotas.items():
        share = q / total_quota if total_quota else 1.0 / len(quotas)
        used = use.get(name, 0.0) / total_use if total_use else 0.0
        out[name] = used - share
    return out


T = TypeVar("T")


def ordered(items: Sequence[tuple[str, tuple[int, str, str, str], T]],
            standing: Mapping[str, float] | None) -> list[T]:
    """``items`` (tenant, place in line, what) in release order: by standing when fair
    share is on (``standing`` given), then by place (priority, then arrival)."""
    if standing is None:
        return [x for _, _, x in sorted(items, key=lambda i: i[1])]
    return [x for _, _, x in sorted(items, key=lambda i: (standing.get(i[0], 0.0), i[1]))]
