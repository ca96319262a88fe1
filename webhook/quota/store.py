"""Usage stores: where quota usage lives and how a reservation is committed atomically.

Two implementations share one interface:

* :class:`MemoryStore`: usage and reservations in this process. Used when no cluster is
  configured (``serve`` on a laptop, ``review``, tests, benchmarks). Atomic because the
  check and the write happen with no ``await`` between them on one event loop; it does
  not coordinate several replicas.
* ``webhook.quota.ledger.LedgerStore``: pods from a watch-fed cache plus reservations in
  a per-tenant ledger object in the Kubernetes API, committed with resourceVersion
  compare-and-swap, so every replica sees every admission.

A reservation is keyed by the pod's uid (the validating webhook sees the final object,
uid and generated name included). It counts until its pod is seen in the cache, and
expires after a TTL if the pod never appears (a later admission step refused it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from webhook.engine.cost import Charge
from webhook.quota.check import UsageView
from webhook.quota.gang import Gang, slots_of
from webhook.quota.usage import Totals, Usage


class ReservationUnavailable(Exception):
    """The shared state cannot be reached within the request's time budget."""


class NameTaken(Exception):
    """The pod's name ("namespace/name") is held by another pod stored now: its create
    fails (AlreadyExists), so it is refused here and nothing is kept for it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@runtime_checkable
class UsageStore(Protocol):
    def view(self) -> UsageView:
        """Usage as this replica knows it now (pods seen + reservations not yet seen)."""
        ...

    async def reserve(self, key: str, charge: Charge, fits: Callable[[UsageView], bool],
                      budget: float, name: str | None = None,
                      gangs: tuple[str, ...] = ()) -> bool:
        """Atomically: if ``fits(view)`` then record the reservation. Returns whether it
        was recorded (or need not be: a retry of a pod already reserved under ``name``,
        its "namespace/name"); raises ReservationUnavailable when the state cannot be
        reached. ``gangs``: the gangs the pod may belong to (see :class:`GangStore`)."""
        ...

    def ready(self) -> bool: ...


@runtime_checkable
class GangStore(Protocol):
    """A store that can reserve a gang whole and let its pods draw from it.

    A pod draws inside :meth:`UsageStore.reserve`, in the same atomic step as its check:
    when one of ``gangs`` has a free slot of the pod's shape, the slot is replaced by the
    pod's reservation, and ``fits`` is asked of the usage without that slot (true for a
    slot this webhook reserved: it was checked when the gang was). So a draw needs no
    round trip of its own, and a slot that was never checked (a forged ledger entry)
    cannot admit a pod past a cap."""

    async def reserve_gang(self, key: str, ids: tuple[str, ...],
                           charges: list[tuple[Charge, int]],
                           fits: Callable[[UsageView], bool], ttl: float,
                           budget: float = 1.0) -> bool:
        """Atomically: if ``fits(view)``, reserve the gang's slots under ``key`` (the
        workload's uid) for ``ttl`` seconds; ``ids`` are what its pods find it by. A
        retried review finds it reserved."""
        ...

    async def release_gang(self, key: str, tenant: str, budget: float = 1.0) -> int:
        """The workload is gone: free the slots its pods did not take. Returns how many."""
        ...


@runtime_checkable
class BorrowStore(Protocol):
    """A store that commits borrowed pods apart from their tenant's own reservations:
    in one place per cohort, so two commits never lend the same idle GPUs."""

    async def reserve_borrowed(self, key: str, charge: Charge, cohort: str,
                               lenders: tuple[str, ...], fits: Callable[[UsageView], bool],
                               budget: float, name: str | None = None) -> bool: ...


def _never(view: UsageView) -> bool:
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class Held:
    """A waiting pod to be charged on release: its reservation, and the quota test it
    must pass on the usage with the pods released before it (``fits``); ``passed``:
    when it does not fit, whether the units behind it may still go (only its user's own
    caps refuse it)."""

    key: str  # the pod's uid
    charge: Charge
    name: str  # "namespace/name"
    fits: Callable[[UsageView], bool]
    passed: Callable[[UsageView], bool] = _never
    # The gangs it may belong to: a free slot of its gang's reservation is drawn, as at
    # admission (see GangStore), so a gang reserved whole is not charged twice.
    gangs: tuple[str, ...] = ()


@runtime_checkable
class ReleaseStore(Protocol):
    """A store that charges waiting pods in order, a gang only whole (see
    ``webhook.server.leading.release``)."""

    def view(self) -> UsageView: ...

    async def reserve_in_order(self, tenant: str, units: list[list[Held]],
                               budget: float = 1.0) -> list[int]:
        """Atomically, in one commit: reserve each unit's pods (every one passing its
        ``fits`` with the ones before it counted), unit after unit, stopping at the first
        unit that does not fit whole (none of its pods is reserved), unless that unit is
        ``passed`` (refused by its user's own caps alone): it is left out and the units
        behind it go on. Returns the indexes of the units reserved, in order. A pod
        reserved already (a retry) needs no room again."""
        ...

    def has_slot(self, gangs: tuple[str, ...], charge: Charge) -> bool:
        """Whether a gang reservation of ``gangs`` holds a free slot of ``charge``'s shape."""
        ...


class Combined:
    """Usage of seen pods plus reservations, as one view (sums are per call, O(resources))."""

    __slots__ = ("a", "b")

    def __init__(self, a: Usage, b: Usage) -> None:
        self.a, self.b = a, b

    def tenant(self, name: str) -> Totals:
        return _sum(self.a.tenant(name), self.b.tenant(name))

    def namespace(self, name: str) -> Totals:
        return _sum(self.a.namespace(name), self.b.namespace(name))

    def user(self, tenant: str, name: str) -> Totals:
        return _sum(self.a.user(tenant, name), self.b.user(tenant, name))

    def top_owners(self, scope: tuple[str, ...], n: int = 3) -> list[tuple[str, float]]:
        if not self.b.owners_in(scope):  # the usual case: no reservation in this scope
            return self.a.top_owners(scope, n)
        merged: dict[str, float] = dict(self.a.top_owners(scope, 1000))
        for o, g in self.b.top_owners(scope, 1000):
            merged[o] = merged.get(o, 0.0) + g
        return sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def covers(a: Charge, b: Charge) -> bool:
    """Whether ``a`` counts at least as much as ``b`` in every scope a cap can name."""
    return (a.tenant == b.tenant and a.namespace == b.namespace and a.product == b.product
            and a.user == b.user and a.gpus >= b.gpus and a.spot >= b.spot
            and a.shared >= b.shared
            and all(a.resources.get(r, 0.0) >= n for r, n in b.resources.items()))


def _sum(x: Totals, y: Totals) -> Totals:
    if not y.pods and not y.gpus and not y.resources:  # nothing reserved in this scope
        return x
    out = x.copy()
    out.gpus += y.gpus
    out.pods += y.pods
    out.spot += y.spot
    out.shared += y.shared
    for r, n in y.resources.items():
        out.resources[r] = out.resources.get(r, 0.0) + n
    for p, n in y.products.items():
        out.products[p] = out.products.get(p, 0.0) + n
    return out


@dataclass(slots=True)
class _Reservation:
    charge: Charge
    expires: float
    name: str | None = None


class MemoryStore:
    """Pods and reservations held in this process only."""

    def __init__(self, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._own_pods = Usage()
        self.reserved = Usage()
        # In the order made: with one TTL for all, that is the order they expire in, so
        # expiring walks only the expired ones (an admission's view must not cost the
        # whole TTL's admissions); and by name, for the retry check.
        self._reservations: dict[str, _Reservation] = {}
        self._named: dict[str, set[str]] = {}
        self.ttl = ttl
        self.clock = clock
        self.commits = 0  # reservations made, and dropped unseen: read by /metrics
        self.expired = 0
        self.gangs: dict[str, Gang] = {}  # workload uid -> its gang reservation

    @property
    def pods(self) -> Usage:
        """The pods that count as themselves (see ``webhook.quota.decider`` for a store
        whose pods are a watch's)."""
        return self._own_pods

    def ready(self) -> bool:
        return True

    def view(self) -> UsageView:
        self._expire()
        return Combined(self.pods, self.reserved)

    def pod_seen(self, key: str, charge: Charge | None) -> None:
        """A pod appeared, changed or (charge None) ended: it now counts as itself."""
        self.pods.put(key, charge)
        if key in self._reservations:
            self._drop(key)

    def load(self, pods: Iterable[tuple[str, Charge]]) -> None:
        for key, charge in pods:
            self.pods.put(key, charge)

    async def reserve(self, key: str, charge: Charge, fits: Callable[[UsageView], bool],
                      budget: float = 1.0, name: str | None = None,
                      gangs: tuple[str, ...] = ()) -> bool:
        if key in self.pods:
            return True  # already counted as a running pod
        view = self.view()
        if key in self._reservations or (name is not None and any(
                covers(self._reservations[k].charge, charge)
                for k in self._named.get(name, ()))):
            return True  # the same pod reviewed or created again (a retry): one charge
        drawn = self._slot(gangs, charge) if gangs else None
        if drawn is not None:
            # Checked without the slot it replaces: see GangStore.
            self.reserved.put(drawn[1], None)
            if not fits(view):
                self.reserved.put(drawn[1], drawn[0].slots[drawn[1]])
                return False
            drawn[0].taken[key] = drawn[1]
        elif not fits(view):
            return False
        self._reservations[key] = _Reservation(charge, self.clock() + self.ttl, name)
        if name is not None:
            self._named.setdefault(name, set()).add(key)
        self.reserved.put(key, charge)
        if drawn is None:
            self.commits += 1
        return True

    async def reserve_in_order(self, tenant: str, units: list[list[Held]],
                               budget: float = 1.0) -> list[int]:
        done: list[int] = []
        self._expire()
        for i, unit in enumerate(units):
            made: list[tuple[str, tuple[Gang, str] | None]] = []
            for h in unit:
                if h.key in self.pods or h.key in self._reservations:
                    continue  # reserved already: a retry needs no room again
                drawn = self._slot(h.gangs, h.charge) if h.gangs else None
                if drawn is not None:  # checked without the slot it replaces
                    self.reserved.put(drawn[1], None)
                    drawn[0].taken[h.key] = drawn[1]
                if not h.fits(self.view()):
                    for k, d in [*made, (h.key, drawn)]:
                        if k in self._reservations:
                            self._drop(k)
                        if d is not None:
                            del d[0].taken[k]
                            self.reserved.put(d[1], d[0].slots[d[1]])
                    made = []
                    if h.passed(self.view()):
                        break  # its user's caps alone: the units behind it go on
                    return done
                self._reservations[h.key] = _Reservation(h.charge, self.clock() + self.ttl,
                                                         h.name)
                self._named.setdefault(h.name, set()).add(h.key)
                self.reserved.put(h.key, h.charge)
                made.append((h.key, drawn))
            else:
                self.commits += bool(made)
                done.append(i)
        return done

    def has_slot(self, gangs: tuple[str, ...], charge: Charge) -> bool:
        self._expire()
        return self._slot(gangs, charge) is not None

    # --- gang reservations (webhook.quota.gang) -------------------------------------

    async def reserve_gang(self, key: str, ids: tuple[str, ...],
                           charges: list[tuple[Charge, int]],
                           fits: Callable[[UsageView], bool], ttl: float,
                           budget: float = 1.0) -> bool:
        if key in self.gangs:
            return True
        if not fits(self.view()):
            return False
        gang = Gang(key, ids, slots_of(key, charges), self.clock() + ttl)
        for slot, charge in gang.slots.items():
            self.reserved.put(slot, charge)
        self.gangs[key] = gang
        self.commits += 1
        return True

    def _slot(self, ids: tuple[str, ...], charge: Charge) -> tuple[Gang, str] | None:
        """A free slot of ``charge``'s shape in a gang the pod belongs to."""
        for gang in self.gangs.values():
            if set(ids) & set(gang.ids):
                slot = gang.slot_for(charge)
                if slot is not None:
                    return gang, slot
        return None

    async def release_gang(self, key: str, tenant: str = "", budget: float = 1.0) -> int:
        return self._drop_gang(key)

    def _drop_gang(self, key: str) -> int:
        """The workload is gone (or its bound passed): its untaken slots are freed."""
        gang = self.gangs.pop(key, None)
        if gang is None:
            return 0
        taken = set(gang.taken.values())
        for slot in gang.slots:
            if slot not in taken:
                self.reserved.put(slot, None)
        return len(gang.slots) - len(taken)

    def _expire(self) -> None:
        if self.gangs:
            now = self.clock()
            for key in [k for k, g in self.gangs.items() if g.expires <= now]:
                self._drop_gang(key)
        if not self._reservations:
            return
        now = self.clock()
        gone = []
        for key, r in self._reservations.items():
            if r.expires > now:
                # The oldest live one: the rest are younger. (After a change of TTL a
                # younger one may expire first; it then counts until the older ones
                # go: a little long, never too short.)
                break
            gone.append(key)
        for key in gone:
            self._drop(key)
            self.expired += 1

    def _drop(self, key: str) -> None:
        r = self._reservations.pop(key)
        if r.name is not None:
            keys = self._named[r.name]
            keys.discard(key)
            if not keys:
                del self._named[r.name]
        self.reserved.put(key, None)
