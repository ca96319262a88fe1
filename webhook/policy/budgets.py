"""GPU-hour budgets, compiled: a tenant's budget and the period open at a given instant;
how GPU time is weighed and accounted. Nothing here reads the time: the instant is the
caller's (the pipeline's clock, which tests control)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from webhook.policy.model import Accounting, Budget, Showback, Spec

HOUR = 3600


@dataclass(frozen=True, slots=True)
class Span:
    """One period of a budget: [start, end) in unix seconds, and how people name it."""

    start: float
    end: float
    label: str  # "December 2026 (Europe/Berlin)", "the last 168 hours"
    rolling: bool = False


@dataclass(frozen=True, slots=True)
class BudgetRules:
    gpu_hours: float
    per_user: float | None
    period: str
    window_hours: int | None
    zone: ZoneInfo
    waits: bool  # onExhausted: wait
    warn_at: tuple[int, ...]

    def span(self, now: float) -> Span:
        """The period open at unix time ``now``. A rolling period is the clock hour open
        now and the ``windowHours - 1`` before it (GPU time is kept by the hour)."""
        if self.period == "rolling":
            assert self.window_hours is not None
            upto = (int(now) // HOUR + 1) * HOUR
            return Span(upto - self.window_hours * HOUR, upto,
                        f"the last {self.window_hours} hours", rolling=True)
        local = datetime.fromtimestamp(now, UTC).astimezone(self.zone)
        midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
        zone = self.zone.key
        if self.period == "day":
            start, end = midnight, midnight + timedelta(days=1)
            label = f"{start:%Y-%m-%d} ({zone})"
        elif self.period == "week":
            start = midnight - timedelta(days=midnight.weekday())
            end = start + timedelta(days=7)
            label = f"the week of {start:%Y-%m-%d} ({zone})"
        else:
            start = midnight.replace(day=1)
            end = (start + timedelta(days=32)).replace(day=1)
            label = f"{start:%B %Y} ({zone})"
        # Wall-clock midnights: re-attached to the zone so a DST change in the period
        # gives the period's true length.
        start = start.replace(tzinfo=None).replace(tzinfo=self.zone)
        end = end.replace(tzinfo=None).replace(tzinfo=self.zone)
        return Span(start.timestamp(), end.timestamp(), label)

    def next_free(self, now: float) -> str:
        """When GPU-hours come back, in words."""
        span = self.span(now)
        if span.rolling:
            return (f"as the hours used leave the window (the next at "
                    f"{datetime.fromtimestamp(span.end, UTC):%H:%M} UTC)")
        local = datetime.fromtimestamp(span.end, UTC).astimezone(self.zone)
        return f"when the next period starts, {local:%Y-%m-%d %H:%M} {self.zone.key}"


def compile_budget(b: Budget | None) -> BudgetRules | None:
    if b is None:
        return None
    return BudgetRules(b.gpu_hours, b.per_user_gpu_hours, b.period, b.window_hours,
                       ZoneInfo(b.time_zone), b.on_exhausted == "wait", tuple(b.warn_at))


@dataclass(frozen=True, slots=True)
class AccountingRules:
    """How GPU time is accounted and weighed (``spec.accounting``, ``spec.showback``)."""

    interval: float
    weights: dict[str, float]  # product -> what its hour counts against a budget
    retention_days: int
    currency: str | None
    rates: dict[str, float]  # product (or "default") -> price per GPU-hour

    def weight(self, product: str) -> float:
        return self.weights.get(product, 1.0)

    def rate(self, product: str) -> float | None:
        return self.rates.get(product, self.rates.get("default"))


def compile_accounting(spec: Spec) -> AccountingRules | None:
    """None when nothing asks for GPU time (no budget, no showback)."""
    if not spec.accounts_gpu_time:
        return None
    a = spec.accounting or Accounting()
    s: Showback | None = spec.showback
    return AccountingRules(float(a.interval_seconds), dict(a.product_weights),
                           a.retention_days, s.currency if s else None,
                           dict(s.rates) if s else {})
