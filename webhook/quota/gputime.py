"""GPU time (pure): how long each pod held its GPUs, and the GPU-seconds of an interval
by tenant, namespace, user, product and hour.

A pod holds its GPUs from when it is **bound** to a node (the ``PodScheduled``
condition's time, else ``status.startTime``): from then the scheduler counts its GPUs as
taken and no other pod can have them, even while its images are pulled. It gives them
back when it **ends** (the last of its containers' ``finishedAt`` once it is Succeeded
or Failed) or when its **deletion is asked** (``deletionTimestamp`` less the grace
period: the containers may run a little longer, which is never billed). Every time is
the API server's or the kubelet's, written in the pod, so every replica that has seen
the pod computes the same seconds, and a leader that takes over counts what the last
one would have.

The seconds are GPU-equivalents (the pod's charge: weights of MIG slices, shares and
spot applied) times seconds, kept per clock hour (UTC) so that any period (a day, a
month in a time zone, a rolling window) is a sum of hours.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhook.engine.cost import Charge

HOUR = 3600
# (tenant, namespace, user or "", product or ""): whose GPU time a row is.
Key = tuple[str, str, str, str]
# (row, the UTC hour it falls in, as unix seconds) -> GPU-seconds.
Tally = dict[tuple[Key, int], float]


def parse_time(value: Any) -> float | None:
    """Unix seconds of a Kubernetes timestamp (``2026-12-07T13:00:00Z``); None if absent
    or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def bound_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod was bound to its node (None: not bound yet)."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, dict) or not spec.get("nodeName"):
        return None
    status = pod.get("status") or {}
    if not isinstance(status, dict):
        return None
    for c in status.get("conditions") or ():
        if (isinstance(c, dict) and c.get("type") == "PodScheduled"
                and c.get("status") == "True"):
            at = parse_time(c.get("lastTransitionTime"))
            if at is not None:
                return at
    return parse_time(status.get("startTime"))


def ended_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod gave its GPUs back: the end of its last container once it is
    Succeeded or Failed, else the moment its deletion was asked; None: it holds them."""
    status = pod.get("status") or {}
    status = status if isinstance(status, dict) else {}
    if status.get("phase") in ("Succeeded", "Failed"):
        ends = [parse_time(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
                for c in status.get("containerStatuses") or () if isinstance(c, dict)]
        known = [e for e in ends if e is not None]
        if known:
            return max(known)
        for c in status.get("conditions") or ():
            if isinstance(c, dict) and c.get("type") == "Ready":
                at = parse_time(c.get("lastTransitionTime"))
                if at is not None:
                    return at
    meta = pod.get("metadata") or {}
    deleted = parse_time(meta.get("deletionTimestamp")) if isinstance(meta, dict) else None
    if deleted is not None:
        grace = meta.get("deletionGracePeriodSeconds")
        return deleted - (grace if isinstance(grace, int | float) else 0)
    return None


def key_of(charge: Charge) -> Key:
    return (charge.tenant, charge.namespace, charge.user or "", charge.product or "")


def spread(tally: Tally, key: Key, gpus: float, start: float, end: float) -> None:
    """Add ``gpus`` x the seconds of [start, end) to ``tally``, split at clock hours."""
    while start < end:
        hour = int(start // HOUR) * HOUR
        upto = min(end, hour + HOUR)
        slot = (key, hour)
        tally[slot] = tally.get(slot, 0.0) + gpus * (upto - start)
        start = upto


@dataclass(slots=True)
class Hold:
    """One pod's GPUs: whose, how many, and the span it held them."""

    key: Key
    gpus: float
    start: float
    end: float | None = None  # None: held still


class HoldBook:
    """The pods that hold (or held, since the last accounting) GPUs, by uid. Fed by the
    pod watch on every replica, so a replica that becomes leader knows the pods that
    ended while another led."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.holds: dict[str, Hold] = {}
        self._wall = wall
        self.alive_at: float | None = None  # the pod watch's last sign of life
        self._relist_from: float | None = None

    def touch(self) -> None:
        """The pod watch showed it was alive (an event, a bookmark)."""
        self.alive_at = self._wall()

    def pod(self, uid: str, pod: Mapping[str, Any], charge: Charge | None) -> None:
        """A pod as the watch shows it, with its charge (None: it holds nothing now)."""
        held = self.holds.get(uid)
        if charge is not None and charge.gpus > 0 and charge.pods:
            start = bound_at(pod)
            if start is None:
                return  # not bound: its GPUs are not taken yet
            self.holds[uid] = Hold(key_of(charge), charge.gpus, start, ended_at(pod))
        elif held is not None and held.end is None:
            held.end = ended_at(pod) or self._wall()

    def gone(self, uid: str, pod: Mapping[str, Any]) -> None:
        """The pod was deleted (the watch's last state of it)."""
        held = self.holds.get(uid)
        if held is not None and held.end is None:
            end = ended_at(pod)
            held.end = end if end is not None else self.alive_at or self._wall()

    def relisting(self) -> None:
        """The watch starts over: pods deleted while it was away are missed."""
        self._relist_from = self.alive_at

    def relisted(self, present: Iterable[str]) -> None:
        """The relist is done: a pod held but not listed was deleted while the watch was
        away, at some time after it was last seen alive. It is counted until then:
        never more than it held."""
        still = set(present)
        for uid, held in self.holds.items():
            if held.end is None and uid not in still:
                held.end = self._relist_from if self._relist_from is not None else self._wall()
        self._relist_from = None

    def account(self, since: float, until: float) -> Tally:
        """The GPU-seconds held within [since, until), per row and hour."""
        tally: Tally = {}
        for h in self.holds.values():
            start = max(h.start, since)
            end = min(h.end if h.end is not None else until, until)
            if end > start:
                spread(tally, h.key, h.gpus, start, end)
        return tally

    def forget(self, before: float) -> None:
        """Drop the pods that ended before ``before`` (accounted up to it)."""
        for uid in [u for u, h in self.holds.items() if h.end is not None and h.end <= before]:
            del self.holds[uid]
