"""GPU time on every replica: the kept days read from the cluster, and the budgets'
snapshot admission decides by (:mod:`webhook.quota.budget`), made again every few
seconds from those days and the GPU time the pod watch shows held since they were
written. The leader writes the days (:mod:`webhook.server.leading.accounting`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import date
from typing import Any

from webhook.libs import kube, logs
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.budget import Spending, spending
from webhook.quota.cache import ClusterState
from webhook.quota.gputime import HoldBook
from webhook.quota.usagebook import (
    GROUP,
    KIND,
    PLURAL,
    VERSION_API,
    DayBook,
    days_of,
    watermark,
)
from webhook.server import metrics

# How often a replica reads the kept days and makes its budgets' snapshot again: the
# most a budget may be seen late, beside the watch's own lag.
REFRESH_SECONDS = 5.0


def records(api: Any) -> kube.ClusterRecords:
    """The GPUUsage objects, through ``api``."""
    return kube.ClusterRecords(api, GROUP, VERSION_API, PLURAL, KIND)


def read_days(maps: kube.ClusterRecords) -> tuple[dict[date, DayBook], dict[str, str]]:
    """The kept days, and the records that cannot be read (name -> why)."""
    return days_of(maps.list())


class GpuTime:
    """The kept days and the budgets' snapshot of this replica."""

    def __init__(self, maps: kube.ClusterRecords, state: ClusterState,
                 policy: Callable[[], CompiledPolicy], clock: Callable[[], float] = time.time,
                 every: float = REFRESH_SECONDS) -> None:
        self.maps = maps
        self.state = state
        self.hours = state.hours if state.hours is not None else HoldBook()
        state.hours = self.hours
        self.policy = policy
        # The periods are decided by the pipeline's clock (a test moves it across a
        # period's end); the GPU time held, by the system's, as the pods' times are.
        self.clock = clock
        self.every = every
        self.days: dict[date, DayBook] = {}
        self.snapshot = Spending()
        self._told: set[str] = set()

    def spending(self) -> Spending:
        return self.snapshot

    def kept(self, days: dict[date, DayBook], bad: dict[str, str]) -> None:
        """Days as just read or written (by this loop or the leader's). A read older
        than what is kept (it crossed the leader's write) is not taken: the snapshot
        would count from an earlier watermark the holds it let go already."""
        mine, theirs = watermark(self.days.values()), watermark(days.values())
        if mine is not None and (theirs is None or theirs < mine):
            return
        self.days = days
        for name, why in bad.items():
            if name not in self._told:
                logs.event("GPU time record unreadable; left as it is", logging.ERROR,
                           record=name, error=why)
        self._told = set(bad)

    def refresh(self) -> None:
        """The budgets' snapshot made again (on the event loop: the holds live there)."""
        policy = self.policy()
        if policy.accounting is None:
            return
        now = self.clock()
        since = watermark(self.days.values())
        live = self.hours.account(since, time.time()) if since is not None else {}
        if since is not None:
            self.hours.forget(since)  # ended before the watermark: written already
        self.snapshot = spending(policy, self.days.values(), live, now)
        for tenant, used in self.snapshot.tenants.items():
            metrics.BUDGET_USED.labels(tenant).set(used.used)
            metrics.BUDGET_LIMIT.labels(tenant).set(used.limit)

    async def run(self) -> None:
        while True:
            if self.policy().accounting is None:
                await asyncio.sleep(self.every)
                continue
            try:
                self.kept(*await asyncio.to_thread(read_days, self.maps))
            except kube.NotFound:
                logs.event("GPU time not read: the GPUUsage CRD is not installed "
                           "(deploy/base/crd-gpuusage.yaml); budgets count only what "
                           "this replica saw", logging.WARNING)
            except kube.KubeError as exc:
                logs.event("GPU time not read; budgets use the days read before",
                           logging.WARNING, error=str(exc))
            try:
                self.refresh()
            except Exception as exc:  # a defect: logged, and the loop goes on
                logs.event("budgets not refreshed (a defect: please report it)",
                           logging.ERROR, error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.every)
