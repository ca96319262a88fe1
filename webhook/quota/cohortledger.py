"""Borrowed pods' reservations: one ledger per cohort, committed with compare-and-swap.

The mixin of :class:`~webhook.quota.ledger.LedgerStore` that commits a pod on borrowed
GPUs to its cohort's ledger (:data:`~webhook.quota.entries.BORROWED_PREFIX`; why one
object per cohort: ``reserve_borrowed``). How the entries it reads are counted is
:mod:`webhook.quota.counting`; the tenants' own ledgers are :mod:`webhook.quota.ledger`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from webhook.engine.cost import Charge
from webhook.libs.kube import ConfigMaps, Conflict, KubeError, StoredMap
from webhook.quota.check import UsageView
from webhook.quota.counting import LedgerCounting
from webhook.quota.entries import (
    BORROWED_LABELS,
    BORROWED_PREFIX,
    LEDGER_PREFIX,
    Entry,
    decode,
    decode_borrowed,
    encode_borrowed,
)
from webhook.quota.store import Combined, ReservationUnavailable, covers


@dataclass(frozen=True, slots=True)
class _CohortRead:
    """A cohort's ledger as one commit attempt read it."""

    stored: StoredMap
    entries: dict[str, Entry]  # live, and not yet settled: what the write keeps
    settled: set[str]  # entries whose pods every replica has seen (see _settled)
    read: int  # how many valid entries the ledger held
    now: float  # wall-clock time of the read


class CohortLedger(LedgerCounting):
    """The cohort ledgers' commit, of :class:`~webhook.quota.ledger.LedgerStore`."""

    # Set by LedgerStore.__init__ (see there).
    maps: ConfigMaps
    ttl: float
    conflicts: int
    commits: int
    expired: int
    settled: int
    _known: dict[str, dict[str, Entry]]
    _borrowed: dict[str, dict[str, Entry]]
    _cohort_locks: dict[str, asyncio.Lock]

    async def reserve_borrowed(self, key: str, charge: Charge, cohort: str,
                               lenders: tuple[str, ...], fits: Callable[[UsageView], bool],
                               budget: float, name: str | None = None) -> bool:
        """Commit a pod on borrowed GPUs to its cohort's ledger (see
        :data:`BORROWED_PREFIX`): every borrowed reservation of the cohort lives in that
        one object, so two commits (any replicas) that would lend the same idle GPUs
        conflict there and the second decides again. What is idle is computed at each
        attempt from the lenders' pods and their own ledgers, read afresh. The lenders'
        own commits never read this ledger: their quota is always their own."""
        deadline = time.monotonic() + budget
        lock = self._cohort_locks.setdefault(cohort, asyncio.Lock())
        try:
            async with asyncio.timeout(budget):
                async with lock:
                    return await self._commit_borrowed(key, charge, cohort, lenders, fits,
                                                       deadline, name)
        except TimeoutError:
            raise ReservationUnavailable(
                f"no commit within {budget:.1f}s ({self.conflicts} conflicts so far)") from None

    async def _commit_borrowed(self, key: str, charge: Charge, cohort: str,
                               lenders: tuple[str, ...], fits: Callable[[UsageView], bool],
                               deadline: float, name: str | None) -> bool:
        ledger = BORROWED_PREFIX + cohort
        self._require_synced()
        attempt = 0
        while True:
            read = await self._read_cohort(cohort, ledger, lenders)
            entries, now = read.entries, read.now
            if key in entries or self.state.seen(key):
                return True  # a retried review of a pod already counted
            if name is not None and any(
                    e.name == name and not self.state.seen(k) and covers(e.charge, charge)
                    for k, e in entries.items()):
                return True  # the same pod created again: one charge for a name
            view = Combined(self.state.pods, self._unseen(
                [*(self._known[t] for t in lenders if t in self._known), entries]))
            if not fits(view):
                return False
            entries[key] = Entry(charge, now + self.ttl, name)
            try:
                await asyncio.to_thread(self.maps.write, ledger, encode_borrowed(entries),
                                        read.stored.resource_version, BORROWED_LABELS)
            except Conflict:
                attempt += 1
                await self._cohort_back_off(attempt, deadline)
                continue
            except KubeError as exc:
                raise self._unavailable(ledger, exc) from None
            self._borrowed[cohort] = self._pending(entries, now)
            self.commits += 1
            self.settled += len(read.settled)
            self.expired += read.read - (len(entries) - 1) - len(read.settled)
            return True

    async def _read_cohort(self, cohort: str, ledger: str,
                           lenders: tuple[str, ...]) -> _CohortRead:
        """The cohort's ledger and the lenders' own, read afresh: the lenders' live
        entries become what this replica knows of them, the cohort's what it knows of
        the cohort's."""
        try:
            stored: StoredMap = await asyncio.to_thread(self.maps.read, ledger)
            own = {t: await asyncio.to_thread(self.maps.read, LEDGER_PREFIX + t)
                   for t in lenders}
        except KubeError as exc:
            raise self._unavailable(ledger, exc) from None
        now = self.wall()
        for t, m in own.items():
            self._known[t] = self._pending(decode(t, m.data, now, LEDGER_PREFIX + t), now)
        stored_entries = decode_borrowed(stored.data, now, ledger)
        settled = self._settled(ledger, stored_entries)
        entries = {k: e for k, e in stored_entries.items()
                   if e.expires > now and k not in settled}
        self._borrowed[cohort] = self._pending(entries, now)
        return _CohortRead(stored, entries, settled, len(stored_entries), now)

    async def _cohort_back_off(self, attempt: int, deadline: float) -> None:
        """After a write conflict (the ``attempt``-th): a jittered pause, or, when it
        would end past the deadline, the commit refused."""
        self.conflicts += 1
        pause = min(0.2, 0.005 * (2 ** min(attempt, 6))) * random.random()
        if time.monotonic() + pause >= deadline:
            raise ReservationUnavailable(
                f"the ledger kept changing ({attempt} conflicts)") from None
        await asyncio.sleep(pause)
