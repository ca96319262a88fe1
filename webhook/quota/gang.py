"""Gang reservations: a training workload's gang reserved whole, and its pods drawing
from it instead of competing with other pods.

Without this, two gangs that each fit alone race pod by pod for the same free GPUs and
can both end up half-admitted, holding a tenant's quota while neither can run. When a
gang workload is created and its gang fits what is free now, its GPUs are reserved as
one entry under the workload's uid: one slot per pod of the gang, each costing what a
pod of its role costs. The check and the write are one atomic step of the store, so of
two gangs racing for the same free GPUs one is reserved whole and the other not at all
(it is admitted with a warning that says so, and its pods compete as they come).

A pod of the workload (found by its owner references' uids, or by the label its
controller sets, for kinds whose pods are owned through another object: JobSet -> Job
-> Pod, TrainJob -> JobSet -> Job -> Pod, LeaderWorkerSet -> StatefulSet -> Pod) takes a
slot of its own shape: it is admitted from the reservation, with nothing more counted.
The slots no pod took are released when the workload is deleted (its DELETE is sent to
the webhook) or, at the latest, when the reservation's bound passes. Each store holds
the slots its own way: ``MemoryStore`` in the process, ``LedgerStore`` as entries of the
tenant's ledger, shared by every replica.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from webhook.engine.cost import Charge

# How long a gang's slots wait for its pods: its controller makes them within seconds,
# a scheduler-gated or queued job (Kueue, Volcano queues) may hold them back longer;
# past this the untaken slots are released and late pods compete as any pod.
GANG_BOUND_SECONDS = 300.0

def same_shape(a: Charge, b: Charge) -> bool:
    return a.product == b.product and dict(a.resources) == dict(b.resources)


@dataclass(slots=True)
class Gang:
    """One gang's reservation: the slots its pods have not taken yet."""

    key: str  # the workload's uid
    ids: tuple[str, ...]
    slots: dict[str, Charge]  # slot key -> what one pod of it costs
    expires: float
    taken: dict[str, str] = field(default_factory=dict)  # pod key -> slot key

    def slot_for(self, charge: Charge) -> str | None:
        for k, c in self.slots.items():
            if k not in self.taken.values() and same_shape(c, charge):
                return k
        return None


def slots_of(key: str, charges: Iterable[tuple[Charge, int]]) -> dict[str, Charge]:
    """Slot keys (``<uid>#<n>``) for ``count`` pods of each charge."""
    out: dict[str, Charge] = {}
    for charge, count in charges:
        for _ in range(count):
            out[f"{key}#{len(out)}"] = charge
    return out
