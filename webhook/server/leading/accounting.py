"""The leader's accounting of GPU time: every ``spec.accounting.intervalSeconds``, the
GPU-seconds held since the kept days' watermark are added to them and the watermark
moved, in one compare-and-swap write per day (:mod:`webhook.quota.usagebook`).

What a crash can lose, and why it never counts twice:

* the seconds are computed from the pods' own times (bound, ended, deletion asked:
  :mod:`webhook.quota.gputime`), which every replica's watch holds; a replica that
  takes over counts from the watermark what the last leader had not written, so a
  leader change loses nothing of a pod its watch saw;
* when every replica restarts at once, a pod deleted (not ended: an ended pod keeps its
  times) while none ran is lost from the watermark to its deletion: at most
  ``intervalSeconds`` + the time no replica ran, per such pod;
* accounting runs only while the watch is live, and only up to ``settle`` seconds ago:
  the end of a pod is in the watch by then, so a pod is never counted past its end;
* a write moves the watermark with the seconds it adds; two leaders (a Lease handover)
  read the same watermark, one write wins, the other's conflicts and is read again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import date, timedelta

from webhook.libs import kube, logs
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.gputime import Tally
from webhook.quota.usagebook import LABELS, DayBook, account, day_of, name_of, watermark
from webhook.server import metrics
from webhook.server.gputime import GpuTime, read_days


class Accountant:
    """Writes the GPU time while this replica leads."""

    def __init__(self, gpu: GpuTime, leading: Callable[[], bool],
                 wall: Callable[[], float] = time.time) -> None:
        self.gpu = gpu
        self.leading = leading
        self.wall = wall

    def policy(self) -> CompiledPolicy:
        return self.gpu.policy()

    async def run(self) -> None:
        while True:
            acc = self.policy().accounting
            if acc is not None and self.leading():
                try:
                    await self.once()
                except kube.KubeError as exc:
                    logs.event("GPU time not written; tried again next interval",
                               logging.WARNING, error=str(exc))
                except Exception as exc:  # a defect: logged, and the next round tries again
                    logs.event("GPU time not written (a defect: please report it)",
                               logging.ERROR, error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(acc.interval if acc is not None else 10.0)

    async def once(self) -> float | None:
        """One round; returns the watermark written (None: nothing written)."""
        gpu = self.gpu
        state = gpu.state
        days, bad = await asyncio.to_thread(read_days, gpu.maps)
        gpu.kept(days, bad)
        since = watermark(days.values())
        if since is None and bad:
            return None  # the last day may be the unreadable one: its watermark unknown
        if since is not None and any(name_of(day_of(since)) == n for n in bad):
            return None
        if since is not None and not state.synced():
            return None  # pods that ended while the watch was away are not known yet
        # On the loop: the holds live there.
        done = account(days, gpu.hours, self.wall(), state.settle_time())
        if done is None:
            return None
        for book in done.days:
            await asyncio.to_thread(gpu.maps.write, name_of(book.day), dict(LABELS),
                                    book.encode(), book.version)
        # This replica's budgets count from what it wrote at once (the holds it has
        # accounted are let go by the budgets' refresh, against the days it counts from).
        gpu.kept({**days, **{b.day: b for b in done.days}}, bad)
        _count(done.tally)
        await self._expire(days)
        return done.until

    async def _expire(self, days: dict[date, DayBook]) -> None:
        acc = self.policy().accounting
        if acc is None or not days:
            return
        cutoff = day_of(self.wall()) - timedelta(days=acc.retention_days)
        for book in list(days.values()):
            if book.day < cutoff:
                await asyncio.to_thread(self.gpu.maps.delete, name_of(book.day))


def _count(tally: Tally) -> None:
    by: dict[tuple[str, str, str], float] = {}
    for ((tenant, _, user, product), _), seconds in tally.items():
        key = (tenant, user, product)
        by[key] = by.get(key, 0.0) + seconds
    for (tenant, user, product), seconds in by.items():
        metrics.GPU_SECONDS.labels(tenant, user, product).inc(seconds)
