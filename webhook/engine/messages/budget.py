"""Messages of GPU-hour budgets (tenants[].budget): spent, nearly spent, waiting."""

from __future__ import annotations

from webhook.engine.messages.words import num


def _hours(x: float) -> str:
    """GPU-hours as people read them: 2 decimals, 3 below one hour."""
    return num(round(x, 2 if x >= 1 else 3))


def _whose(tenant: str, user: str | None) -> str:
    return f"user {user} of tenant {tenant}" if user else f"tenant {tenant}"


def budget_spent(tenant: str, user: str | None, used: float, limit: float, period: str,
                 back: str) -> str:
    """The refusal of a GPU pod whose tenant (or user) has spent its GPU-hours."""
    return (f"{_whose(tenant, user)} has used {_hours(used)} of its {_hours(limit)} "
            f"GPU-hours for {period}: no new GPU pod starts until GPU-hours come back, "
            f"{back}. Pods running now are not stopped. Ask your platform team for a "
            "larger budget, or run it without GPUs")


def budget_warning(tenant: str, user: str | None, used: float, limit: float,
                   period: str) -> str:
    """The warning on an admitted GPU pod once its tenant (or user) has passed one of
    ``warnAt``'s thresholds."""
    pct = 100 * used / limit if limit else 100.0
    return (f"{_whose(tenant, user)} has used {pct:.0f} % of its {_hours(limit)} GPU-hours "
            f"for {period} ({_hours(used)} GPU-hours)")


def waits_for_budget(tenant: str, user: str | None, used: float, limit: float,
                     period: str, back: str) -> str:
    """The warning (and annotation) when a pod is admitted to wait for GPU-hours."""
    return (f"this pod waits for GPU-hours: {_whose(tenant, user)} has used "
            f"{_hours(used)} of its {_hours(limit)} GPU-hours for {period}. It is created "
            "now behind the scheduling gate gpu-webhook.dev/quota, holds no GPU while it "
            f"waits, and starts when GPU-hours come back, {back}.")
