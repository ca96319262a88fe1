"""``gpu-webhook usage``: GPU-hours by tenant, namespace, user and product over a period,
read from the days the leader keeps (:mod:`webhook.quota.usagebook`), priced with the
policy's rate card (``spec.showback``).

A period is a UTC month (``2026-12``), a UTC day (``2026-12-07``) or ``--since`` /
``--until`` (UTC days, the second exclusive). What is shown is what was written: up to
the watermark, which trails the present by one accounting interval and the watch's
settle time at most.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from webhook.libs import kube
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.gputime import HOUR
from webhook.quota.usagebook import (
    GROUP,
    KIND,
    PLURAL,
    VERSION_API,
    DayBook,
    day_start,
    days_of,
    sums,
    watermark,
)


@dataclass(frozen=True, slots=True)
class Row:
    tenant: str
    namespace: str
    user: str
    product: str
    gpu_hours: float
    cost: float | None  # None: no rate for its product


@dataclass(frozen=True, slots=True)
class Usage:
    since: float
    until: float
    accounted_until: float | None
    rows: list[Row]
    currency: str | None
    unreadable: dict[str, str]

    @property
    def total_hours(self) -> float:
        return sum(r.gpu_hours for r in self.rows)


def period(text: str | None, since: str | None, until: str | None, today: date
           ) -> tuple[float, float]:
    """[start, end) in unix seconds of ``--period`` or ``--since``/``--until`` (default:
    this UTC month). ValueError names the expected form."""
    if text and (since or until):
        raise ValueError("give --period or --since/--until, not both")
    if since or until:
        try:
            a = date.fromisoformat(since) if since else today.replace(day=1)
            b = date.fromisoformat(until) if until else today
        except ValueError:
            raise ValueError("--since and --until are UTC days, e.g. 2026-12-01") from None
        start, end = day_start(a), day_start(b) + (0 if until else 24 * HOUR)
        if end <= start:
            raise ValueError(f"--until {until} is not after --since {since}")
        return start, end
    text = text or f"{today:%Y-%m}"
    try:
        if len(text) == 7:
            first = datetime.strptime(text, "%Y-%m").replace(tzinfo=UTC).date()
            nxt = first.replace(year=first.year + 1, month=1) if first.month == 12 else (
                first.replace(month=first.month + 1))
            return day_start(first), day_start(nxt)
        d = date.fromisoformat(text)
        return day_start(d), day_start(d) + 24 * HOUR
    except ValueError:
        raise ValueError(f"--period {text!r} is not a month (2026-12) or a day "
                         "(2026-12-07)") from None


class NotKept(Exception):
    """The cluster keeps no GPU time (the GPUUsage CRD is not installed)."""


def read(api: Any) -> tuple[list[DayBook], dict[str, str]]:
    """The kept days (GPUUsage objects), and those that cannot be read (name -> why)."""
    try:
        objs = kube.ClusterRecords(api, GROUP, VERSION_API, PLURAL, KIND).list()
    except kube.NotFound:
        raise NotKept("this cluster keeps no GPU time: the GPUUsage CRD is not installed "
                      "(deploy/base/crd-gpuusage.yaml, in the chart and kustomize "
                      "base)") from None
    days, bad = days_of(objs)
    return list(days.values()), bad


def usage(policy: CompiledPolicy, days: list[DayBook], since: float, until: float,
          unreadable: dict[str, str] | None = None) -> Usage:
    acc = policy.accounting
    rows = []
    for (tenant, ns, user, product), seconds in sorted(sums(days, since, until).rows.items()):
        hours = seconds / HOUR
        rate = acc.rate(product) if acc is not None else None
        rows.append(Row(tenant, ns, user, product, hours,
                        hours * rate if rate is not None else None))
    return Usage(since, until, watermark(days), rows,
                 acc.currency if acc is not None else None, dict(unreadable or {}))


def _when(t: float | None) -> str:
    return "never" if t is None else f"{datetime.fromtimestamp(t, UTC):%Y-%m-%d %H:%M:%S} UTC"


def as_json(u: Usage) -> dict[str, Any]:
    return {"since": _when(u.since), "until": _when(u.until),
            "accountedUntil": _when(u.accounted_until), "currency": u.currency,
            "rows": [{"tenant": r.tenant, "namespace": r.namespace, "user": r.user,
                      "product": r.product, "gpuHours": round(r.gpu_hours, 4),
                      "cost": round(r.cost, 2) if r.cost is not None else None}
                     for r in u.rows],
            "totalGpuHours": round(u.total_hours, 4), "unreadable": u.unreadable}


def as_csv(u: Usage) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["tenant", "namespace", "user", "product", "gpu_hours", "cost", "currency"])
    for r in u.rows:
        w.writerow([r.tenant, r.namespace, r.user, r.product, f"{r.gpu_hours:.4f}",
                    f"{r.cost:.2f}" if r.cost is not None else "", u.currency or ""])
    return out.getvalue()


def table(u: Usage) -> str:
    head = ("TENANT", "NAMESPACE", "USER", "PRODUCT", "GPU-HOURS", "COST")
    lines = [head] + [(r.tenant, r.namespace, r.user or "-", r.product or "-",
                       f"{r.gpu_hours:.2f}",
                       f"{r.cost:.2f} {u.currency}" if r.cost is not None else "-")
                      for r in u.rows]
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = "".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() + "\n"
                   for row in lines)
    text += (f"{u.total_hours:.2f} GPU-hours from {_when(u.since)} to {_when(u.until)}; "
             f"accounted until {_when(u.accounted_until)}\n")
    for why in sorted(u.unreadable.values()):
        text += f"not counted: {why}\n"
    return text
