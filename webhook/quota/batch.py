"""A tenant ledger's commit as it is decided: the bookkeeping of one group commit.

What :class:`~webhook.quota.ledger.LedgerStore` keeps while a tenant's commit runs: the
operations waiting for it (:class:`Ask`, each an :data:`Op`), the ledger as last read or
written (:class:`Read`), the entries the operations edit in arrival order
(:class:`Batch`), what one attempt decided (:class:`Decided`), and the gang slot a pod
draws (:func:`slot_for`). The commit itself (read, decide, write, retry) is the store's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from webhook.engine.cost import Charge
from webhook.quota.entries import Entry
from webhook.quota.gang import same_shape
from webhook.quota.store import covers


@dataclass(slots=True)
class Batch:
    """A tenant's ledger as its commit decides it: the live entries (as read, edited by
    the operations before in the batch) and, of them, those for pods this replica has
    not seen, kept beside so that deciding a pod walks what counts, not the whole
    ledger."""

    entries: dict[str, Entry]
    unseen: dict[str, Entry]

    def put(self, key: str, e: Entry) -> None:
        self.entries[key] = e
        self.unseen[key] = e  # a new entry is for a pod not created yet, or a gang slot

    def pop(self, key: str) -> Entry:
        self.unseen.pop(key, None)
        return self.entries.pop(key)


# An operation on a tenant's ledger, decided in its commit: given the batch and the
# time, it edits the batch and returns its answer and whether it changed the entries.
Op = Callable[[Batch, float], tuple[Any, bool]]


@dataclass(slots=True)
class Ask:
    """One operation waiting for its tenant's next commit."""

    op: Op
    deadline: float  # time.monotonic()
    done: asyncio.Future[Any]
    queued: float = 0.0  # time.monotonic() when it was asked

    def succeed(self, answer: Any) -> None:
        if not self.done.done():
            self.done.set_result(answer)

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


@dataclass(frozen=True, slots=True)
class Read:
    """A tenant's ledger as last read or written: its valid entries and version."""

    entries: dict[str, Entry]
    version: str | None
    fresh: bool = True  # read from the API server for this commit, not kept from the last


@dataclass(frozen=True, slots=True)
class Decided:
    """One attempt of a commit, decided: the batch its operations left (``working``:
    its ``entries`` are what the write records), each live ask with its answer and
    whether it changed the entries, and the entries of the ledger read that the write
    drops (``settled``: their pods seen by every replica; ``dropped``: those and the
    expired ones)."""

    working: Batch
    outcomes: list[tuple[Ask, Any, bool]]
    settled: set[str]
    dropped: int

    @property
    def changed(self) -> int:
        """How many operations changed the entries (0: nothing to write)."""
        return sum(1 for _, _, c in self.outcomes if c)

    def answer(self) -> None:
        for a, answer, _ in self.outcomes:
            a.succeed(answer)


def slot_for(entries: dict[str, Entry], gangs: tuple[str, ...], charge: Charge) -> str | None:
    """A slot of a gang the pod belongs to (by owner uid or label), of the pod's shape
    and counting at least what the pod counts."""
    ids = set(gangs)
    for k, e in sorted(entries.items()):
        if e.gang and ids.intersection(e.gang) and same_shape(e.charge, charge) \
                and covers(e.charge, charge):
            return k
    return None
