"""Which ledger entries a replica counts, and when an entry leaves its ledger.

The base of :class:`~webhook.quota.ledger.LedgerStore`, shared by its tenant ledgers'
commits and its cohort ledgers' (:mod:`webhook.quota.cohortledger`): of the entries read,
those live and for pods this replica has not seen count on top of the pods it sees, and
of a name's entries only the one that covers the rest (see :mod:`webhook.quota.ledger`);
an entry whose pod this replica has seen for the settle time is left out of the next
write; a ledger that cannot be read or written is a :class:`ReservationUnavailable`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from webhook.libs import logs
from webhook.libs.kube import KubeError
from webhook.quota.cache import ClusterState
from webhook.quota.entries import Entry
from webhook.quota.store import ReservationUnavailable, covers
from webhook.quota.usage import Usage


class LedgerCounting:
    """What :class:`~webhook.quota.ledger.LedgerStore` counts of the ledgers it read."""

    # Set by LedgerStore.__init__ (see there).
    state: ClusterState
    wall: Callable[[], float]
    clock: Callable[[], float]
    _seen_at: dict[str, dict[str, float]]

    def _pending(self, entries: Mapping[str, Entry], now: float) -> dict[str, Entry]:
        """Of ``entries``, those live at ``now`` for pods this replica has not seen."""
        seen = self.state.seen
        return {k: e for k, e in entries.items() if e.expires > now and not seen(k)}

    def _unseen(self, tenants: Iterable[dict[str, Entry]], prune: bool = False) -> Usage:
        """Reservations to count on top of the pods this replica sees: live, for pods
        not seen yet, and of each name only the one that covers the rest (see
        :mod:`webhook.quota.ledger`). With ``prune``, entries that no longer count
        (expired, or their pod seen) are dropped from the dicts given: only for views of
        what is unseen (``_known``), never for a ledger about to be written."""
        now = self.wall()
        usage = Usage()
        for entries in tenants:
            by_name: dict[str, list[tuple[str, Entry]]] = {}
            gone: list[str] = []
            for key, e in entries.items():
                if e.expires <= now or self.state.seen(key):
                    gone.append(key)
                    continue
                if e.name is None:
                    usage.put(key, e.charge)
                else:
                    by_name.setdefault(e.name, []).append((key, e))
            for name, pending in by_name.items():
                for key, e in self._counted(name, pending):
                    usage.put(key, e.charge)
            if prune:
                for key in gone:
                    del entries[key]
        return usage

    def _counted(self, name: str, pending: list[tuple[str, Entry]]
                 ) -> list[tuple[str, Entry]]:
        holder = self.state.holder(name)
        if holder is not None and holder[1] is not None and all(
                covers(holder[1], e.charge) for _, e in pending):
            return []  # the pod holding the name is counted, and is at least as big
        for key, e in pending:
            if all(covers(e.charge, o.charge) for _, o in pending):
                return [(key, e)]
        return pending  # no one covers the rest: count them all, never too little

    def _require_synced(self) -> None:
        """Refuse to decide unless the cache is known to be current: one that is not would
        count expired reservations as free for pods it has not seen (a stalled watch)."""
        if not self.state.synced():
            raise ReservationUnavailable(
                "the webhook's view of the cluster's pods is not up to date")

    def _settled(self, ledger: str, entries: Mapping[str, Entry]) -> set[str]:
        """The entries of a ledger about to be written whose pods this replica has seen
        for the settle time (noticed by a commit: a later notice only keeps an entry
        longer). Slots of gangs are never seen; they leave when drawn or released."""
        known = self._seen_at.get(ledger, {})
        now, settle = self.clock(), self.state.settle_time()
        seen_at: dict[str, float] = {}
        out: set[str] = set()
        for k in entries:
            if self.state.seen(k):
                at = seen_at[k] = known.get(k, now)
                if now - at >= settle:
                    out.add(k)
        self._seen_at[ledger] = seen_at  # only keys still in the ledger
        return out

    def _unavailable(self, ledger: str, exc: KubeError) -> ReservationUnavailable:
        # The developer reads ``reason`` in product words; the client library's text
        # (exception chain, the API server's address) goes to the log only.
        logs.event("quota ledger unavailable", logging.WARNING, ledger=ledger,
                   error=str(exc), detail=exc.detail)
        return ReservationUnavailable(exc.reason)
