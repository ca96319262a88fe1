"""GPU time as kept in the cluster (pure): one record per UTC day, its hours' GPU-seconds
per tenant, namespace, user and product, and how far the day is accounted.

The leader adds the seconds of [``until``, now) and moves ``until`` to now in the same
write, a compare-and-swap on the day's object (:mod:`webhook.server.leading.accounting`):
a second is counted in the write that moves ``until`` past it, so a crash before the
write counts it later (from the pods' own times), and a crash after counts it never
again. A write that would cross midnight ends the day at midnight first; the last day
written says how far everything is accounted (:func:`watermark`).

Stored as a cluster-scoped ``GPUUsage`` object (``gpu-webhook.dev/v1alpha1``,
deploy/base/crd-gpuusage.yaml) named ``day-YYYYMMDD``: ``status.version``,
``status.accountedUntil`` (unix seconds, as a string: exact) and ``status.rows``, a list
of ``{tenant, namespace, user, product, hours: {"HH": GPU-seconds}}`` (``user`` and
``product`` empty when none). Its own resource, not a ConfigMap of the webhook's
namespace: its grants need no write on the policy's ConfigMap, and ``kubectl get
gpuusages`` lists the days kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from webhook.quota.gputime import HOUR, HoldBook, Key, Tally

GROUP, VERSION_API, PLURAL, KIND = "gpu-webhook.dev", "v1alpha1", "gpuusages", "GPUUsage"
PREFIX = "day-"
VERSION = "1"
LABELS = {"app.kubernetes.io/managed-by": "gpu-webhook"}
DAY = 24 * HOUR


class BookUnreadable(ValueError):
    """A day's record is not one this version wrote; the message names it and the fix."""


def day_of(t: float) -> date:
    return datetime.fromtimestamp(t, UTC).date()


def day_start(d: date) -> float:
    return datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()


def name_of(d: date) -> str:
    return f"{PREFIX}{d:%Y%m%d}"


@dataclass
class DayBook:
    """One UTC day: GPU-seconds per row and hour of the day, accounted up to ``until``."""

    day: date
    until: float
    rows: dict[Key, dict[int, float]] = field(default_factory=dict)
    version: str | None = None  # the stored object's resourceVersion (None: not stored)

    @property
    def start(self) -> float:
        return day_start(self.day)

    @property
    def end(self) -> float:
        return self.start + DAY

    def add(self, tally: Tally) -> None:
        """Add the seconds of ``tally`` that fall in this day."""
        start, end = self.start, self.end
        for (key, hour), seconds in tally.items():
            if start <= hour < end and seconds > 0:
                hours = self.rows.setdefault(key, {})
                h = (hour - int(start)) // HOUR
                hours[h] = hours.get(h, 0.0) + seconds

    def encode(self) -> dict[str, Any]:
        """The object's fields (its ``status``)."""
        rows = [{"tenant": k[0], "namespace": k[1], "user": k[2], "product": k[3],
                 "hours": {f"{h:02d}": round(s, 3) for h, s in sorted(hours.items())}}
                for k, hours in sorted(self.rows.items())]
        return {"status": {"version": VERSION, "accountedUntil": f"{self.until:.3f}",
                           "rows": rows}}

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> DayBook:
        """The day a stored GPUUsage object holds (see :meth:`decode`)."""
        meta = obj.get("metadata") or {}
        meta = meta if isinstance(meta, dict) else {}
        status = obj.get("status")
        return cls.decode(str(meta.get("name") or ""),
                          status if isinstance(status, dict) else {},
                          meta.get("resourceVersion"))

    @classmethod
    def decode(cls, name: str, data: Mapping[str, Any], version: str | None = None
               ) -> DayBook:
        """The day stored under ``name``; BookUnreadable when it is not a day this
        version wrote (the message names the object and what to do)."""
        fix = (f"GPU time record gpuusage/{name} cannot be read ({{}}): it was edited or "
               "written by another version. GPU time is not written over it; fix or delete "
               f"it (kubectl delete gpuusage {name}: that day's GPU time is then lost)")
        if not name.startswith(PREFIX):
            raise BookUnreadable(fix.format("not a usage record name"))
        try:
            d = datetime.strptime(name[len(PREFIX):], "%Y%m%d").replace(tzinfo=UTC).date()
        except ValueError:
            raise BookUnreadable(fix.format("its name is not a day")) from None
        if data.get("version") != VERSION:
            raise BookUnreadable(fix.format(f"version {data.get('version')!r}, not "
                                            f"{VERSION!r}"))
        try:
            until = float(data.get("accountedUntil", ""))
            rows_in = data.get("rows") or []
            if not isinstance(rows_in, list):
                raise ValueError("rows is not a list")
            rows: dict[Key, dict[int, float]] = {}
            for r in rows_in:
                key = (str(r["tenant"]), str(r["namespace"]), str(r.get("user") or ""),
                       str(r.get("product") or ""))
                hours = {int(h): float(s) for h, s in dict(r["hours"]).items()}
                if any(not 0 <= h < 24 or s < 0 for h, s in hours.items()):
                    raise ValueError("an hour outside 00-23 or negative seconds")
                rows[key] = hours
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise BookUnreadable(fix.format(f"malformed: {exc}")) from None
        book = cls(d, until, rows, version)
        if not book.start <= until <= book.end:
            raise BookUnreadable(fix.format("accountedUntil is outside its day"))
        return book

    def hours(self) -> Iterable[tuple[Key, float, float]]:
        """(row, the hour's unix start, GPU-seconds) of every hour kept."""
        start = self.start
        for key, hours in self.rows.items():
            for h, s in hours.items():
                yield key, start + h * HOUR, s


def days_of(objs: Iterable[Mapping[str, Any]]) -> tuple[dict[date, DayBook], dict[str, str]]:
    """The days listed GPUUsage objects hold, and those that cannot be read (name ->
    why: the message of :class:`BookUnreadable`)."""
    days: dict[date, DayBook] = {}
    bad: dict[str, str] = {}
    for obj in objs:
        try:
            book = DayBook.of(obj)
        except BookUnreadable as exc:
            meta = obj.get("metadata")
            bad[str((meta if isinstance(meta, dict) else {}).get("name") or "?")] = str(exc)
            continue
        days[book.day] = book
    return days, bad


def stored(t: float) -> float:
    """``t`` as a watermark is stored (milliseconds, as text): the instant to account up
    to, so that the watermark read back is exactly where the seconds added stop (a
    rounded-up watermark would leave a sliver uncounted, a rounded-down one count it
    twice)."""
    return float(f"{t:.3f}")


def watermark(days: Iterable[DayBook]) -> float | None:
    """How far GPU time is accounted: the latest day's ``until`` (None: nothing kept,
    accounting starts now)."""
    latest = max(days, key=lambda b: b.day, default=None)
    return latest.until if latest is not None else None


def to_write(days: Mapping[date, DayBook], tally: Tally, since: float, until: float
             ) -> list[DayBook]:
    """The days a write of [since, until)'s ``tally`` changes, in day order, each with the
    seconds added and ``until`` moved (a day before the last ends at its midnight)."""
    out: list[DayBook] = []
    d = day_of(since)
    while True:
        book = days.get(d)
        fresh = DayBook(d, day_start(d), {k: dict(v) for k, v in book.rows.items()},
                        book.version) if book is not None else DayBook(d, day_start(d))
        fresh.add(tally)
        fresh.until = min(until, fresh.end)
        out.append(fresh)
        if until <= fresh.end:
            return out
        d = d + timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Sums:
    """GPU-seconds per row over a span."""

    rows: Mapping[Key, float]

    def where(self, tenant: str | None = None, user: str | None = None) -> float:
        return sum(s for k, s in self.rows.items()
                   if (tenant is None or k[0] == tenant) and (user is None or k[2] == user))


def sums(days: Iterable[DayBook], since: float, until: float, live: Tally | None = None
         ) -> Sums:
    """GPU-seconds per row in the hours starting within [since, until), from the kept
    days and ``live`` (what is held since the watermark, not written yet)."""
    out: dict[Key, float] = {}
    for book in days:
        if book.end <= since or book.start >= until:
            continue
        for key, hour, s in book.hours():
            if since <= hour < until:
                out[key] = out.get(key, 0.0) + s
    for (key, hour), s in (live or {}).items():
        if since <= hour < until:
            out[key] = out.get(key, 0.0) + s
    return Sums(out)


@dataclass(frozen=True, slots=True)
class Round:
    """One accounting round: the days to write, in order, up to ``until``, and the
    seconds they add (for the metrics)."""

    until: float
    days: list[DayBook]
    tally: Tally


def account(days: Mapping[date, DayBook], holds: HoldBook, now: float, settle: float
            ) -> Round | None:
    """What the leader writes at ``now``: the seconds the holds held from the kept
    watermark up to ``settle`` seconds ago (None: nothing to write yet). With nothing
    kept, GPU time starts now (the install): one empty day, from the start of this
    second, as the pods' own times are kept (a pod bound within it is counted from its
    binding, not from a fraction of a second after)."""
    since = watermark(days.values())
    if since is None:
        start = float(int(now))
        return Round(start, [DayBook(day_of(start), start)], {})
    until = stored(now - settle)
    if until <= since:
        return None
    tally = holds.account(since, until)
    return Round(until, to_write(days, tally, since, until), tally)
