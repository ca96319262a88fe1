"""Quota that changes with the clock, compiled: a tenant's windows and the one open at
a given instant.

Caps apply to what is admitted while a window is open: a pod admitted at 17:59 under
the working-hours cap keeps running after 18:00, and the next pod is checked against
the night's. The instant is always the caller's (the admission pipeline takes it once
per review from its clock, which tests control); nothing here reads the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from webhook.policy.model import QuotaLimits, QuotaSchedule, UserQuota

_DAY = {"Mon": 0, "Tue": 1, "Wed": 2, "Thu": 3, "Fri": 4, "Sat": 5, "Sun": 6}
_WEEK = 7 * 24 * 60  # minutes


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


@dataclass(frozen=True, slots=True)
class Window:
    """One window: open from ``start`` to ``end`` (minutes of the local day) on
    ``days`` (0 = Monday); an ``end`` not after ``start`` is the next day's."""

    name: str
    days: frozenset[int]
    start: int
    end: int
    quota: QuotaLimits
    user_quota: UserQuota | None

    def is_open(self, weekday: int, minute: int) -> bool:
        length = (self.end - self.start) % (24 * 60) or 24 * 60
        now = weekday * 24 * 60 + minute
        for d in self.days:
            opened = d * 24 * 60 + self.start
            if (now - opened) % _WEEK < length:
                return True
        return False

    def hours(self) -> str:
        """``08:00-18:00``, as the policy wrote it."""
        def clock(m: int) -> str:
            return f"{m // 60:02d}:{m % 60:02d}"
        return f"{clock(self.start)}-{clock(self.end)}"


@dataclass(frozen=True, slots=True)
class Schedule:
    zone: ZoneInfo
    windows: tuple[Window, ...]

    def open_at(self, now: float) -> Window | None:
        """The first window open at unix time ``now``, in the schedule's time zone."""
        local = datetime.fromtimestamp(now, UTC).astimezone(self.zone)
        weekday, minute = local.weekday(), local.hour * 60 + local.minute
        for w in self.windows:
            if w.is_open(weekday, minute):
                return w
        return None


def compile_schedule(s: QuotaSchedule | None) -> Schedule | None:
    if s is None:
        return None
    return Schedule(ZoneInfo(s.time_zone), tuple(
        Window(w.name, frozenset(_DAY[d] for d in w.days), _minutes(w.start),
               _minutes(w.end), w.quota, w.user_quota) for w in s.windows))
