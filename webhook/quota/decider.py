"""The leader decides: every tenant's quota decided in one replica's memory, with no API
write on the admission path (``serve --quota-commit leader``).

The shared ledger (:mod:`webhook.quota.ledger`) lets every replica decide, at the price
of a conditional write of the tenant's ledger per admission. Here one replica decides
(the one holding the leader Lease); the others relay their reviews to it
(``webhook.server.web.forward``). It counts what its pod watch shows (the same
``ClusterState`` the ledger counts) plus the pods it admitted that the watch has not
shown yet, held in this process as :class:`~webhook.quota.store.MemoryStore` holds
them: a check and its reservation happen with no ``await`` between them, so two
admissions can never both take the last GPU.

What a new leader cannot know is what the last one admitted and its watch has not shown
yet: those reservations were in the old leader's memory. So it decides nothing until
every such pod must be stored and seen (the hand-over, :meth:`DecidingStore.handover`):

* the old leader decided only while its Lease held (``Leadership.leading``: until one
  duration after its last renewal, which no other replica can take over before);
* a pod it admitted is stored within the reservation TTL of its admission or never (the
  same bound the ledger's entries rest on: an admission is answered within the API
  server's request timeout, and the TTL is at least that);
* this replica's watches show what was stored within their settle time, and it decides
  only while they are live (``ClusterState.synced``).

So a replica that has led for TTL + settle time has seen every pod admitted before it
led. Until then, and whenever its watches are not live, a review that would reserve
quota is refused saying why (:class:`NotDeciding`): never admitted uncounted. A
reservation is dropped when the watch shows its pod, or after that same TTL + settle
time (its pod was never stored: a later admission step refused it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from webhook.engine.cost import Charge
from webhook.libs import logs
from webhook.libs.kube import KubeError
from webhook.quota.cache import ClusterState
from webhook.quota.check import UsageView
from webhook.quota.store import Held, MemoryStore, NameTaken, ReservationUnavailable
from webhook.quota.usage import Usage


class NotDeciding(ReservationUnavailable):
    """This replica does not decide GPU quota now; the text says why and when it will."""


class DecidingStore(MemoryStore):
    """Quota decided in this process from the pod watch, while this replica leads."""

    def __init__(self, state: ClusterState, ttl: float = 60.0,
                 clock: Callable[[], float] = time.monotonic,
                 holder: Callable[[str], str | None] | None = None) -> None:
        super().__init__(ttl, clock)
        self.state = state
        # The uid of the pod the API server stores under a name now (see _name_free).
        self.holder = holder
        self._leading: Callable[[], bool] = _never
        self._since: float | None = None  # when this replica last began to lead (clock)
        state.on_seen = self._seen

    @property
    def pods(self) -> Usage:
        return self.state.pods  # a relist replaces the watch's set: asked each time

    @property
    def ttl(self) -> float:
        """How long a reservation lives unseen: as long as its pod may take to be
        stored (the reservation TTL) and seen (the watches' settle time)."""
        return self._ttl + self.state.settle_time()

    @ttl.setter
    def ttl(self, value: float) -> None:
        self._ttl = value  # the policy's reservation TTL

    # -- leading ---------------------------------------------------------------------

    def follow(self, leading: Callable[[], bool]) -> None:
        """Decide while ``leading()`` (the leader Lease's ``Leadership.leading``)."""
        self._leading = leading

    def led(self, leading: bool) -> None:
        """The Lease was won (``True``) or lost: the hand-over starts again at a win."""
        self._since = self.clock() if leading else None

    def handover(self) -> float:
        """Seconds a new leader waits before deciding (see the module docstring): what
        a reservation of the last leader's would have lived."""
        return self.ttl

    def deciding(self) -> str | None:
        """None when this replica decides GPU quota now; else why not."""
        if self._since is None or not self._leading():
            return ("this replica does not decide GPU quota (another replica leads, or "
                    "none does yet)")
        if not self.state.synced():
            return ("the replica that decides GPU quota does not see the cluster's pods "
                    "now (its watches are behind or not listed yet)")
        left = self._since + self.handover() - self.clock()
        if left > 0:
            return (f"the replica that decides GPU quota took over "
                    f"{self.clock() - self._since:.0f} s ago and counts the pods admitted "
                    f"before it for {math.ceil(left)} s more")
        return None

    def ready(self) -> bool:
        return self.state.synced()

    def _require(self) -> None:
        why = self.deciding()
        if why is not None:
            raise NotDeciding(why)

    # -- reserving -------------------------------------------------------------------

    async def reserve(self, key: str, charge: Charge, fits: Callable[[UsageView], bool],
                      budget: float = 1.0, name: str | None = None,
                      gangs: tuple[str, ...] = ()) -> bool:
        self._require()
        if name is not None:
            await self._name_free(key, name)
            self._require()  # the read awaited: still leading?
        return await super().reserve(key, charge, fits, budget, name, gangs)

    async def reserve_gang(self, key: str, ids: tuple[str, ...],
                           charges: list[tuple[Charge, int]],
                           fits: Callable[[UsageView], bool], ttl: float,
                           budget: float = 1.0) -> bool:
        self._require()
        return await super().reserve_gang(key, ids, charges, fits, ttl, budget)

    async def reserve_in_order(self, tenant: str, units: list[list[Held]],
                               budget: float = 1.0) -> list[int]:
        self._require()
        return await super().reserve_in_order(tenant, units, budget)

    def _seen(self, uid: str) -> None:
        """The watch shows the pod (or its end): it counts as itself from now on."""
        if uid in self._reservations:
            self._drop(uid)

    async def _name_free(self, key: str, name: str) -> None:
        """Raise :class:`NameTaken` when another pod holds ``name`` now (as the ledger
        does, see ``LedgerStore._name_free``): asked of the API server only when the
        watch shows the name held by another pod."""
        seen = self.state.holder(name)
        if self.holder is None or seen is None or seen[0] == key:
            return
        try:
            uid = await asyncio.to_thread(self.holder, name)
        except KubeError as exc:  # a failed read decides nothing: recorded as before
            logs.event("pod name holder unknown", logging.INFO, pod=name, error=str(exc))
            return
        if uid is not None and uid != key:
            raise NameTaken(name)

    def reserved_usage(self) -> Usage:
        """What reservations hold for pods the watch has not shown yet."""
        self._expire()
        return self.reserved


def _never() -> bool:
    return False
