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
Inside one process, commits for a tenant queue on a lock, so only replicas conflict.

Reservations are never removed when a pod is seen (another replica may not have seen it
yet); they expire after the TTL, by wall-clock time written in the entry. See
docs/quota.md for the failure modes.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.engine.charge import Charge
from webhook.libs.kube import ConfigMaps, Conflict, KubeError, StoredMap
from webhook.quota.cache import ClusterState
from webhook.quota.check import UsageView
from webhook.quota.store import Combined, ReservationUnavailable
from webhook.quota.usage import Usage

LEDGER_PREFIX = "gpu-webhook-ledger-"
LABELS = {"app.kubernetes.io/name": "gpu-webhook", "gpu-webhook.dev/ledger": "quota"}


@dataclass(frozen=True, slots=True)
class Entry:
    charge: Charge
    expires: float  # unix time


def encode(entries: dict[str, Entry]) -> dict[str, str]:
    out = {
        key: {"ns": e.charge.namespace, "owner": e.charge.owner, "product": e.charge.product,
              "resources": dict(e.charge.resources), "gpus": e.charge.gpus,
              "expires": round(e.expires, 3)}
        for key, e in entries.items()
    }
    return {"reservations": orjson.dumps(out, option=orjson.OPT_SORT_KEYS).decode()}


def decode(tenant: str, data: dict[str, str]) -> dict[str, Entry]:
    """Entries of a ledger; an unreadable ledger reads as empty rather than blocking the
    tenant forever (it is rewritten by the next commit)."""
    try:
        raw: Any = orjson.loads(data.get("reservations") or "{}")
    except orjson.JSONDecodeError:
        return {}
    out: dict[str, Entry] = {}
    if not isinstance(raw, dict):
        return out
    for key, v in raw.items():
        try:
            charge = Charge(tenant, str(v["ns"]), str(v["owner"]), v.get("product"),
                            {str(r): float(n) for r, n in v["resources"].items()},
                            float(v["gpus"]))
            out[str(key)] = Entry(charge, float(v["expires"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out


class LedgerStore:
    """The usage store for a cluster: watch-fed pods + the shared reservation ledger."""

    def __init__(self, state: ClusterState, maps: ConfigMaps, ttl: float = 60.0,
                 wall: Callable[[], float] = time.time) -> None:
        self.state = state
        self.maps = maps
        self.ttl = ttl
        self.wall = wall
        self._known: dict[str, dict[str, Entry]] = {}  # last ledger read, per tenant
        self._locks: dict[str, asyncio.Lock] = {}
        self.conflicts = 0
        self.commits = 0
        self.expired = 0  # entries this replica dropped from a ledger after their TTL

    def ready(self) -> bool:
        return self.state.synced()

    def _unseen(self, tenants: dict[str, dict[str, Entry]]) -> Usage:
        now = self.wall()
        usage = Usage()
        for entries in tenants.values():
            for key, e in entries.items():
                if e.expires > now and not self.state.seen(key):
                    usage.put(key, e.charge)
        return usage

    def view(self) -> UsageView:
        return Combined(self.state.pods, self._unseen(self._known))

    async def reserve(self, key: str, charge: Charge, fits: Callable[[UsageView], bool],
                      budget: float) -> bool:
        deadline = time.monotonic() + budget
        lock = self._locks.setdefault(charge.tenant, asyncio.Lock())
        try:
            async with asyncio.timeout(budget):
                async with lock:
                    return await self._commit(key, charge, fits, deadline)
        except TimeoutError:
            raise ReservationUnavailable(
                f"no commit within {budget:.1f}s ({self.conflicts} conflicts so far)") from None

    async def _commit(self, key: str, charge: Charge, fits: Callable[[UsageView], bool],
                      deadline: float) -> bool:
        name = LEDGER_PREFIX + charge.tenant
        attempt = 0
        while True:
            try:
                stored: StoredMap = await asyncio.to_thread(self.maps.read, name)
            except KubeError as exc:
                raise ReservationUnavailable(str(exc)) from None
            now = self.wall()
            stored_entries = decode(charge.tenant, stored.data)
            entries = {k: e for k, e in stored_entries.items() if e.expires > now}
            self._known[charge.tenant] = entries
            if key in entries or self.state.seen(key):
                return True  # a retried review of a pod already counted
            view = Combined(self.state.pods, self._unseen({charge.tenant: entries}))
            if not fits(view):
                return False
            entries[key] = Entry(charge, now + self.ttl)
            try:
                await asyncio.to_thread(self.maps.write, name, encode(entries),
                                        stored.resource_version, LABELS)
            except Conflict:
                self.conflicts += 1
                attempt += 1
                # Jittered backoff so racing replicas do not collide in lockstep.
                pause = min(0.2, 0.005 * (2 ** min(attempt, 6))) * random.random()
                if time.monotonic() + pause >= deadline:
                    raise ReservationUnavailable(
                        f"the ledger kept changing ({attempt} conflicts)") from None
                await asyncio.sleep(pause)
                continue
            except KubeError as exc:
                raise ReservationUnavailable(str(exc)) from None
            self._known[charge.tenant] = entries
            self.commits += 1
            # Counted once the write that drops them has won, so a retry never recounts.
            self.expired += len(stored_entries) - (len(entries) - 1)
            return True
