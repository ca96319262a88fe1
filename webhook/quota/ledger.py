"""Reservations shared by every webhook replica, committed with compare-and-swap.

Why a ledger in the Kubernetes API: the API server is already the cluster's consistent
store, every replica can reach it, and ``resourceVersion`` gives an atomic
compare-and-swap for free (an update carrying an old version fails with 409). One
ConfigMap per tenant (``gpu-webhook-ledger-<tenant>`` in the webhook's namespace) holds
the reservations of that tenant's last minute of admissions; quotas are per tenant, so
tenants never contend with each other.

Admitting a GPU pod: read the tenant's ledger; usage = pods this replica has seen plus
live reservations for pods it has not seen yet; if the pod fits, write the ledger back
with its reservation, conditional on the version read. A conflict means another
admission committed first: read again and decide again, within the request's budget.
Inside one process, one commit per tenant runs at a time and the operations that arrive
meanwhile (pods, a gang's slots, a gang's release) are committed together by the next
(group commit, see ``_drain``), so only replicas conflict; the ledger as last written is
reused as the next read.

A reservation is not removed when its pod is seen (another replica may not have seen it
yet), but once this replica has seen it for the cache's settle time (a few windows of
its watches: ``ClusterState.settle_time``), by when every replica that may commit has
seen it too (a replica commits only while its watches are live): the next commit leaves
it out, so a ledger holds the admissions of the last quarter-minute or so, not a TTL's.
A reservation whose pod is never seen (the create failed after admission) expires after
the TTL, by wall-clock time written in the entry. See docs/quota.md for the failure
modes.

A reservation names its pod (``namespace/name``) as well as its uid. Only one pod can
hold a name, so of a name's pending reservations and the pod this replica sees holding
it, at most one is real: when one of them covers the others (same tenant, namespace and
product, at least as many of every resource) only that one is counted. So a retried
create of the same pod is not a second charge, and a create of a name another pod still
holds (the API server answers AlreadyExists) does not hold GPUs for a TTL. Where the
store can read pods (``holder``: the server's), such a create is checked against the pod
the API server stores under the name now: held by another pod, it is refused
(:class:`NameTaken`) and leaves nothing; a name this replica's cache still shows but
whose pod is gone is decided as a new pod.

A gang workload's reservation (``webhook.quota.gang``) is one entry per pod of its gang,
``<workload uid>#<n>``, each naming the gang's ids and expiring at the gang's bound,
written in one commit that checked the whole gang. A pod of the gang draws in its own
commit: the slot of its shape is replaced by the pod's reservation, in the same write.
A slot is counted like any reservation until it is drawn, released (the workload's
DELETE) or expired; no pod sees it, so it never stops counting early.

What a ledger holds, and how a corrupt entry is dropped, is :mod:`webhook.quota.entries`;
a commit's bookkeeping (its batch, its asks, the ledger as last read) is
:mod:`webhook.quota.batch`; which entries a replica counts, and when one leaves its
ledger, :mod:`webhook.quota.counting`; the cohorts' ledgers of borrowed pods
:mod:`webhook.quota.cohortledger`. This module holds the store and the tenants' ledgers'
group commit.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from webhook.engine.cost import Charge
from webhook.libs import logs
from webhook.libs.kube import ConfigMaps, Conflict, KubeError, StoredMap
from webhook.quota.batch import Ask, Batch, Decided, Op, Read, slot_for
from webhook.quota.cache import ClusterState
from webhook.quota.check import UsageView
from webhook.quota.cohortledger import CohortLedger
from webhook.quota.entries import LABELS, LEDGER_PREFIX, Entry, decode, encode
from webhook.quota.gang import slots_of
from webhook.quota.store import Combined, Held, NameTaken, ReservationUnavailable, covers
from webhook.quota.usage import Usage


class LedgerStore(CohortLedger):
    """The usage store for a cluster: watch-fed pods + the shared reservation ledger."""

    def __init__(self, state: ClusterState, maps: ConfigMaps, ttl: float = 60.0,
                 wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic,
                 holder: Callable[[str], str | None] | None = None,
                 phase: Callable[[str, float], None] | None = None) -> None:
        self.state = state
        # Seconds of each phase of a commit, for the metrics (see _commit): per operation
        # "commit" (from its ask to its answer) and "queued" (of that, waiting for its
        # tenant's commit to start); per commit attempt "read", "decide", "write" and
        # "backoff" (after a conflict).
        self.phase = phase or _no_phase
        # The uid of the pod the API server stores under a name now (a GET; see reserve).
        self.holder = holder
        self.maps = maps
        self.ttl = ttl
        self.wall = wall
        self.clock = clock
        # Per tenant (or cohort ledger), when this replica's commits first found each
        # entry's pod seen (``clock``): the entry leaves a settle time after (_settled).
        self._seen_at: dict[str, dict[str, float]] = {}
        # Per tenant, the entries of the last ledger read (or written) that are live and
        # for pods this replica has not seen: all a view counts. The whole ledger holds
        # every admission of the last TTL (rate x TTL entries); a pod seen once is counted
        # as a pod for as long as it exists, so its entry is never walked again.
        self._known: dict[str, dict[str, Entry]] = {}
        # Group commit (see _drain): operations waiting per tenant, the task committing
        # them, and the ledger as this replica last wrote it.
        self._queued: dict[str, list[Ask]] = {}
        self._committers: dict[str, asyncio.Task[None]] = {}
        self._cached: dict[str, Read] = {}
        self._encoded: dict[str, dict[str, tuple[Entry, dict[str, Any]]]] = {}  # see encode
        self.conflicts = 0
        self.commits = 0
        self.expired = 0  # entries this replica dropped from a ledger after their TTL
        self.settled = 0  # entries dropped because every replica has seen their pod
        # Borrowed pods' reservations, per cohort (see reserve_borrowed), last read, and
        # the lock that queues one process's commits to a cohort's ledger.
        self._borrowed: dict[str, dict[str, Entry]] = {}
        self._cohort_locks: dict[str, asyncio.Lock] = {}

    def ready(self) -> bool:
        return self.state.synced()

    def view(self) -> UsageView:
        return Combined(self.state.pods,
                        self._unseen([*self._known.values(), *self._borrowed.values()],
                                     prune=True))

    def reserved(self, fresh: Mapping[str, StoredMap] | None = None) -> Usage:
        """What reservations hold for pods not seen yet, as admission counts them, with
        the ledgers read just now (``fresh``, by tenant: the other replicas'
        reservations too) taking the place of the last ones read. For the quota status
        objects; called on the event loop, as commits are."""
        for tenant, stored in (fresh or {}).items():
            now = self.wall()
            self._known[tenant] = self._pending(
                decode(tenant, stored.data, now, LEDGER_PREFIX + tenant), now)
        return self._unseen(self._known.values(), prune=True)

    async def reserve(self, key: str, charge: Charge, fits: Callable[[UsageView], bool],
                      budget: float, name: str | None = None,
                      gangs: tuple[str, ...] = ()) -> bool:
        if name is not None:
            await self._name_free(key, name)

        def place(batch: Batch, now: float) -> tuple[bool, bool]:
            return self._place(key, charge, fits, name, gangs, batch, now)

        return bool(await self._enqueue(charge.tenant, place, budget))

    async def _name_free(self, key: str, name: str) -> None:
        """Raise :class:`NameTaken` when another pod holds ``name`` now. Asked of the API
        server only when this replica's cache shows the name held (rare: a create of a
        name in use, or one just freed), so the common create costs no read. A read that
        fails decides nothing: the create is then recorded as before (see _place)."""
        seen = self.state.holder(name)
        if self.holder is None or seen is None or seen[0] == key:
            return
        try:
            uid = await asyncio.to_thread(self.holder, name)
        except KubeError as exc:
            logs.event("pod name holder unknown", logging.INFO, pod=name, error=str(exc))
            return
        if uid is not None and uid != key:
            raise NameTaken(name)

    async def reserve_gang(self, key: str, ids: tuple[str, ...],
                           charges: list[tuple[Charge, int]],
                           fits: Callable[[UsageView], bool], ttl: float,
                           budget: float = 1.0) -> bool:
        """The gang's slots (``<uid>#<n>``, each expiring after ``ttl``) written in one
        compare-and-swap commit of the tenant's ledger, decided on the ledger it
        replaces: of two gangs racing on several replicas, one is written whole and the
        other decided again against it."""
        if not charges:
            return True
        slots = slots_of(key, charges)

        def place(batch: Batch, now: float) -> tuple[bool, bool]:
            if any(k in batch.entries for k in slots):
                return True, False  # a retried review: reserved already
            if not fits(Combined(self.state.pods, self._unseen([batch.unseen]))):
                return False, False
            for k, c in slots.items():
                batch.put(k, Entry(c, now + ttl, gang=ids))
            return True, True

        return bool(await self._enqueue(charges[0][0].tenant, place, budget))

    async def release_gang(self, key: str, tenant: str, budget: float = 1.0) -> int:
        """Drop the slots of ``key``'s gang that no pod took from the tenant's ledger;
        how many."""

        def place(batch: Batch, now: float) -> tuple[int, bool]:
            mine = [k for k, e in batch.entries.items() if e.gang and e.gang[0] == key]
            for k in mine:
                batch.pop(k)
            return len(mine), bool(mine)

        return int(await self._enqueue(tenant, place, budget))

    async def reserve_in_order(self, tenant: str, units: list[list[Held]],
                               budget: float = 1.0) -> list[int]:
        """Waiting pods released by the leader (store.ReleaseStore): their reservations
        written in one compare-and-swap commit of the tenant's ledger, unit after unit,
        each decided on the ledger it replaces, as admission decides a pod. A unit that
        does not fit whole stops the line and leaves nothing of itself; one refused by
        its user's own caps alone is passed over."""

        def place(batch: Batch, now: float) -> tuple[list[int], bool]:
            done: list[int] = []
            changed = False
            for i, unit in enumerate(units):
                made: list[tuple[str, str | None, Entry | None]] = []
                for h in unit:
                    if h.key in batch.entries or self.state.seen(h.key):
                        continue  # reserved by an earlier round (or leader): no room again
                    # A pod of a reserved gang replaces a slot of its shape, as at
                    # admission (_place), and is checked without it.
                    slot = slot_for(batch.entries, h.gangs, h.charge) if h.gangs else None
                    drawn = batch.pop(slot) if slot is not None else None
                    view = Combined(self.state.pods, self._unseen([batch.unseen]))
                    if not h.fits(view):
                        if slot is not None and drawn is not None:
                            batch.put(slot, drawn)  # the entries are shared: put it back
                        for k, s, e in made:
                            batch.pop(k)
                            if s is not None and e is not None:
                                batch.put(s, e)
                        made = []
                        if h.passed(view):
                            break  # its user's caps alone: the units behind it go on
                        return done, changed
                    batch.put(h.key, Entry(h.charge, now + self.ttl, h.name))
                    made.append((h.key, slot, drawn))
                else:
                    changed |= bool(made)
                    done.append(i)
            return done, changed

        return list(await self._enqueue(tenant, place, budget))

    def has_slot(self, gangs: tuple[str, ...], charge: Charge) -> bool:
        """Whether a gang reservation this replica knows of holds a free slot of the
        pod's shape (the mutating webhook then never gates it: the slot admits it)."""
        return slot_for(self._known.get(charge.tenant, {}), gangs, charge) is not None

    async def _enqueue(self, tenant: str, op: Op, budget: float) -> Any:
        """Queue ``op`` for the tenant's next commit and wait for its answer."""
        now = time.monotonic()
        ask = Ask(op, now + budget, asyncio.get_running_loop().create_future(), now)
        self._queued.setdefault(tenant, []).append(ask)
        if tenant not in self._committers:
            task = asyncio.get_running_loop().create_task(self._drain(tenant))
            self._committers[tenant] = task
        try:
            async with asyncio.timeout(budget):
                return await ask.done
        except TimeoutError:
            raise ReservationUnavailable(
                f"no commit within {budget:.1f}s ({self.conflicts} conflicts so far)") from None
        finally:
            self.phase("commit", time.monotonic() - now)

    # -- group commit ------------------------------------------------------------------
    #
    # One commit per tenant is in flight at a time (per-tenant CAS on one ConfigMap); the
    # operations that arrive meanwhile queue, and the next commit takes all of them: each
    # is decided in arrival order against the entries the ones before it left, then one
    # conditional write records them together. Under load a tenant's pods cost one
    # write per batch instead of a read and a write each, one after the other. A
    # conflict re-reads and re-decides the whole batch, so a batch admits exactly what
    # the same operations committed one by one would.
    #
    # The read: after a write that won, the ledger is what was written, at the version
    # the API server returned; the next commit writes against that without reading it
    # again. Another replica's write in between makes that write conflict (409), and
    # the conflict re-reads. So a commit is one API call unless replicas contend.

    async def _drain(self, tenant: str) -> None:
        try:
            while batch := self._queued.pop(tenant, None):
                try:
                    await self._commit(tenant, batch)
                except BaseException as exc:  # a bug must fail its asks, never hang them
                    for ask in batch:
                        ask.fail(exc if isinstance(exc, Exception) else
                                 ReservationUnavailable("the commit was interrupted"))
                    if not isinstance(exc, Exception):
                        raise
        finally:
            del self._committers[tenant]

    async def _read(self, tenant: str, ledger: str) -> Read:
        cached = self._cached.pop(tenant, None)
        if cached is not None:
            return replace(cached, fresh=False)
        t0 = time.monotonic()
        try:
            stored: StoredMap = await asyncio.to_thread(self.maps.read, ledger)
        except KubeError as exc:
            raise self._unavailable(ledger, exc) from None
        self.phase("read", time.monotonic() - t0)  # a reused last write costs no read
        return Read(decode(tenant, stored.data, self.wall(), ledger), stored.resource_version)

    async def _commit(self, tenant: str, batch: list[Ask]) -> None:
        ledger = LEDGER_PREFIX + tenant
        attempt = 0
        began = time.monotonic()
        for a in batch:
            self.phase("queued", began - a.queued)
        while True:
            live = [a for a in batch if not a.done.done()]  # a caller past its budget left
            if not live:
                return
            self._require_synced()
            try:
                read = await self._read(tenant, ledger)
            except ReservationUnavailable as exc:
                for a in live:
                    a.fail(exc)
                return
            t1 = time.monotonic()
            decided = self._decide(tenant, ledger, read, live)
            t2 = time.monotonic()
            self.phase("decide", t2 - t1)
            if not decided.changed:
                if not read.fresh:
                    # Nothing to write, so no write would catch a stale copy: another
                    # replica may have freed room or written slots since. An answer
                    # that writes nothing (a refusal, a release that found nothing) is
                    # given on the ledger as it is now.
                    continue
                self._cached[tenant] = read  # unchanged: still the ledger as last known
                decided.answer()
                return
            try:
                version = await self._write(tenant, ledger, decided.working.entries, read)
            except Conflict:
                self.phase("write", time.monotonic() - t2)
                attempt += 1
                await self._back_off(live, attempt)
                continue
            except KubeError as exc:
                error = self._unavailable(ledger, exc)
                for a in live:
                    a.fail(error)
                return
            self.phase("write", time.monotonic() - t2)
            self._won(tenant, decided, version)
            return

    def _decide(self, tenant: str, ledger: str, read: Read, live: list[Ask]) -> Decided:
        """One attempt's decisions: the live asks, in arrival order, on the ledger read
        less the entries that leave it (expired, or settled)."""
        now = self.wall()
        settled = self._settled(ledger, read.entries)
        entries = {k: e for k, e in read.entries.items()
                   if e.expires > now and k not in settled}
        dropped = len(read.entries) - len(entries)
        working = Batch(entries, self._pending(entries, now))
        # Views decided while this commit is in flight count its reservations too.
        self._known[tenant] = working.unseen
        outcomes = [(a, *a.op(working, now)) for a in live]
        return Decided(working, outcomes, settled, dropped)

    async def _write(self, tenant: str, ledger: str, entries: dict[str, Entry],
                     read: Read) -> str | None:
        """The compare-and-swap write of the decided entries over the ledger read (the
        resourceVersion written; raises Conflict when another write came first)."""
        data = encode(entries, self._encoded.setdefault(tenant, {}))
        return await asyncio.to_thread(self.maps.write, ledger, data, read.version, LABELS)

    def _won(self, tenant: str, decided: Decided, version: str | None) -> None:
        """After the write won: the ledger as written is the next read, and the asks
        get their answers."""
        self._known[tenant] = decided.working.unseen
        if version is not None:
            self._cached[tenant] = Read(dict(decided.working.entries), version)
        self.commits += decided.changed
        # Counted once the write that drops them has won, so a retry never recounts.
        self.settled += len(decided.settled)
        self.expired += decided.dropped - len(decided.settled)
        decided.answer()

    async def _back_off(self, live: list[Ask], attempt: int) -> None:
        """After a write conflict: a jittered pause, so racing replicas do not collide in
        lockstep; the asks it would take past their budget are refused."""
        self.conflicts += 1
        pause = min(0.2, 0.005 * (2 ** min(attempt, 6))) * random.random()
        for a in live:
            if time.monotonic() + pause >= a.deadline:
                a.fail(ReservationUnavailable(f"the ledger kept changing ({attempt} conflicts)"))
        await asyncio.sleep(pause)
        self.phase("backoff", pause)

    def _place(self, key: str, charge: Charge, fits: Callable[[UsageView], bool],
               name: str | None, gangs: tuple[str, ...], batch: Batch,
               now: float) -> tuple[bool, bool]:
        """Decide one pod against ``batch`` (the ledger as read plus the operations
        before it), adding its entry when it needs room and fits: whether it is
        admitted, and whether the entries changed."""
        entries = batch.entries
        if key in entries or self.state.seen(key):
            return True, False  # a retried review of a pod already counted
        if name is not None and any(
                e.name == name and not self.state.seen(k) and covers(e.charge, charge)
                for k, e in batch.unseen.items()):
            return True, False  # the same pod created again (a retry): one charge for a name
        holder = self.state.holder(name) if name is not None else None
        taken = (holder is not None and holder[0] != key and holder[1] is not None
                 and covers(holder[1], charge))
        # A name held by a pod at least as big: this create fails (AlreadyExists) or
        # follows that pod's deletion into the room it leaves, so it needs no room
        # now. It is still recorded, to count once the holder is gone.

        # A pod of a reserved gang replaces a slot of its shape, in this same write,
        # and is checked without it (store.GangStore: a forged slot admits nothing).
        slot = None if taken or not gangs else slot_for(entries, gangs, charge)
        drawn = batch.pop(slot) if slot is not None else None
        if not taken and not fits(Combined(self.state.pods, self._unseen([batch.unseen]))):
            if slot is not None and drawn is not None:
                batch.put(slot, drawn)  # the batch's entries are shared: put the slot back
            return False, False
        batch.put(key, Entry(charge, now + self.ttl, name))
        return True, True


def _no_phase(phase: str, seconds: float) -> None:
    return None
