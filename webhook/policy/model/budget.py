"""GPU time: a tenant's budget of GPU-hours over a period, how GPU time is accounted
(``spec.accounting``), and the rate card showback prices it with (``spec.showback``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from webhook.policy.model.core import FieldProblem, _Strict, iana_zone

Hours = Annotated[float, Field(ge=0, le=1_000_000_000)]
Weight = Annotated[float, Field(gt=0, le=1000)]
Period = Literal["day", "week", "month", "rolling"]


class Budget(_Strict):
    """GPU-hours a tenant's pods may use over a period (``tenants[].budget``).

    Counted in GPU-equivalents x hours (the weights quota uses for MIG slices, shares
    and spot), times the product's weight in ``spec.accounting.productWeights``."""

    gpu_hours: Hours
    """GPU-hours the tenant's pods may use in one period."""
    period: Period = "month"
    """``day``, ``week`` (from Monday), ``month`` (each starting at midnight in
    ``timeZone``), or ``rolling``: the last ``windowHours`` hours."""
    window_hours: Annotated[int, Field(ge=1, le=8784)] | None = None
    """The length of a ``rolling`` period, in hours (only with ``period: rolling``)."""
    time_zone: Annotated[str, Field(min_length=1, max_length=64)] = "UTC"
    """The IANA time zone the period's days start in (``Europe/Berlin``)."""
    per_user_gpu_hours: Hours | None = None
    """GPU-hours each user of the tenant may use in one period (the user
    ``userQuota`` charges a pod to: who created its workload)."""
    on_exhausted: Literal["deny", "wait"] = "deny"
    """When the budget (or a user's) is spent: ``deny`` refuses new GPU pods; ``wait``
    admits them behind the quota gate, released when the next period gives GPU-hours
    back. Running pods are never stopped."""
    warn_at: list[Annotated[int, Field(ge=1, le=99)]] = Field(
        default_factory=lambda: [80, 90], max_length=10)
    """Percentages of the budget at which each admitted GPU pod's reply warns."""

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        return iana_zone(value)

    @model_validator(mode="after")
    def _window_for_rolling(self) -> Budget:
        if self.period == "rolling" and self.window_hours is None:
            raise FieldProblem(("windowHours",),
                "a rolling budget needs windowHours (168 for the last week)")
        if self.period != "rolling" and self.window_hours is not None:
            raise FieldProblem(("windowHours",),
                f"windowHours is for period: rolling, not {self.period}: remove it or "
                "set period: rolling")
        if self.warn_at != sorted(set(self.warn_at)):
            raise FieldProblem(("warnAt",), "warnAt must list percentages in rising "
                               f"order, each once, e.g. [80, 90]; got {self.warn_at}")
        return self


class Accounting(_Strict):
    """How GPU time is accounted (``spec.accounting``): always on when a tenant has a
    budget or ``spec.showback`` is set."""

    interval_seconds: Annotated[int, Field(ge=5, le=3600)] = 60
    """How often the leader replica writes the GPU time accounted since its last write:
    the most a leader change or restart can leave uncounted per running pod, and how
    late ``gpu-webhook usage`` may be."""
    product_weights: dict[str, Weight] = Field(default_factory=dict, max_length=256)
    """What an hour of each product (short name of ``spec.products``) counts against a
    budget, e.g. ``{h100: 2.0, a100: 1.0}`` (default 1)."""
    retention_days: Annotated[int, Field(ge=1, le=3660)] = 400
    """Days of GPU time kept for showback; older days are deleted."""


class Showback(_Strict):
    """The rate card ``gpu-webhook usage`` prices GPU-hours with (``spec.showback``)."""

    currency: Annotated[str, Field(min_length=1, max_length=8)] = "USD"
    """Shown beside each amount."""
    rates: dict[str, Annotated[float, Field(ge=0, le=1_000_000)]] = Field(
        default_factory=dict, max_length=256)
    """Price of one GPU-hour per product short name; ``default`` for the rest (and
    GPUs of no known product). A product with no rate and no default is shown unpriced."""
