"""One replica at a time: leader election on a ``coordination.k8s.io`` Lease, as
Kubernetes controllers do it (client-go's leaderelection).

The leader writes what only one replica should write (the GPUQuota status objects, the
audit's PolicyReports); admission never waits on it and every replica keeps admitting.
The leader renews the Lease every third of its duration. Another replica takes it over
when the Lease has not changed, as that replica itself observed on its own clock, for a
whole duration: wall clocks of different machines are never compared. Every write is
conditional on the resourceVersion read, so two replicas never both win. A leader that
cannot renew stops leading when the duration since its last renewal has passed, before
anyone else may start; on shutdown it releases the Lease so another leads at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from webhook.libs import kube, logs

LEASE = "gpu-webhook-leader"
DURATION = 15  # seconds


def identity() -> str:
    """This replica's name in the Lease: the pod's name, and a suffix unique to this
    process (a restarted container is a new candidate, not the old leader)."""
    name = os.environ.get("POD_NAME") or socket.gethostname() or "gpu-webhook"
    return f"{name}_{uuid.uuid4().hex[:8]}"


def _micro_time(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


class Leadership:
    def __init__(self, leases: kube.Leases, name: str = LEASE, me: str | None = None,
                 duration: int = DURATION, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, address: str = "") -> None:
        self.leases, self.name = leases, name
        self.me = me or identity()
        # Where this replica answers, written in the Lease while it leads; and where the
        # leader answers, as the last read of the Lease said ("" unknown, or this one).
        self.address = address
        self.leader_address = ""
        self.duration = duration
        self.clock, self.wall = clock, wall
        self._until = 0.0  # leading until this (monotonic), from the last renewal
        self._seen: tuple[str, float] | None = None  # (resourceVersion, when first seen)
        self.on_change: list[Callable[[bool], None]] = []
        self._was = False
        self._failing = ""
        # One round at a time: a renewal still running in its thread when the replica
        # stops (its task cancelled) must finish before the release reads the Lease,
        # and never lead again after it.
        self._lock = threading.Lock()
        self._released = False

    def leading(self) -> bool:
        return self.clock() < self._until

    def _tell(self) -> None:
        now = self.leading()
        if now != self._was:
            self._was = now
            logs.event("leading: this replica writes quota status and audit reports" if now
                       else "no longer leading", lease=f"{self.leases.namespace}/{self.name}",
                       identity=self.me)
            for f in self.on_change:
                f(now)

    def try_once(self) -> bool:
        """One round: renew, take over an expired or released Lease, or follow."""
        with self._lock:
            if self._released:
                return False
            return self._round()

    def _round(self) -> bool:
        started = self.clock()
        try:
            lease = self.leases.read(self.name)
            self.leader_address = (lease.address if lease is not None and lease.holder
                                   and lease.holder != self.me else "")
            if lease is None:
                self._write(0, None)
            elif lease.holder == self.me:
                self._write(lease.transitions, lease.resource_version)
            elif not lease.holder or self._expired(lease, started):
                self._write(lease.transitions + 1, lease.resource_version)
            else:
                self._until = 0.0
                self._tell()
                return False
        except kube.Conflict:
            self._until = 0.0  # another replica wrote first: it leads
        except kube.KubeError as exc:
            # Keep leading only while the last renewal still holds: by then no one else
            # can have taken over. A failure that repeats is logged once.
            if self._failing != str(exc):
                logs.event("leader lease not renewed", logging.WARNING, error=str(exc),
                           detail=exc.detail)
            self._failing = str(exc)
        else:
            self._failing = ""
            # Counted from before the read: the others' clocks started no earlier.
            self._until = started + self.duration
        self._tell()
        return self.leading()

    def _expired(self, lease: kube.StoredLease, now: float) -> bool:
        if self._seen is None or self._seen[0] != lease.resource_version:
            self._seen = (lease.resource_version, now)
            return False
        return now - self._seen[1] > max(lease.duration, 1.0)

    def _write(self, transitions: int, resource_version: str | None) -> None:
        self.leases.write(self.name, self.me, self.duration, transitions,
                          _micro_time(self.wall()), resource_version, self.address)

    def release(self) -> None:
        """Give the Lease up (at shutdown), so another replica leads without waiting;
        this replica does not lead again."""
        with self._lock:
            self._released = True
            if self.leading():
                self._release()

    def _release(self) -> None:
        self._until = 0.0
        try:
            lease = self.leases.read(self.name)
            if lease is not None and lease.holder == self.me:
                self.leases.write(self.name, "", self.duration, lease.transitions,
                                  _micro_time(self.wall()), lease.resource_version)
        except kube.KubeError as exc:
            logs.event("leader lease not released; another replica leads when it expires",
                       logging.WARNING, error=str(exc))
        self._tell()

    async def keep(self) -> None:
        """Renew or contend every third of the duration, until cancelled."""
        while True:
            await asyncio.to_thread(self.try_once)
            await asyncio.sleep(self.duration / 3)


async def every(interval: float, leading: Callable[[], bool], ready: Callable[[], bool],
                round_: Callable[[], Awaitable[None]], *, missing: str, failed: str) -> None:
    """Run ``round_`` every ``interval`` seconds while this replica leads and ``ready()``
    (the first as soon as it leads), until cancelled. A failure is logged once until it
    changes: ``missing`` when the API server does not serve the kind (its CRD is not
    installed), ``failed`` for any other API error; the next round tries again."""
    due = 0.0
    failing = ""  # the last failure logged
    while True:
        if leading() and ready() and time.monotonic() >= due:
            due = time.monotonic() + interval
            try:
                await round_()
                failing = ""
            except kube.NotFound as exc:
                if failing != str(exc):
                    logs.event(missing, logging.WARNING, error=str(exc))
                failing = str(exc)
            except kube.KubeError as exc:
                if failing != str(exc):
                    logs.event(failed, logging.WARNING, error=str(exc), detail=exc.detail)
                failing = str(exc)
        elif not leading():
            due = 0.0  # leading again: a round at once
        await asyncio.sleep(min(interval, 1.0))
