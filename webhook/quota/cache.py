"""The cluster as quota sees it: GPU pods and namespace labels, fed by watches.

Only what quota needs is kept: one :class:`~webhook.quota.usage.Charge` per GPU pod
(non-GPU pods cost nothing), namespace labels for selector-based tenants, and, for a
while, the uids of pods that ended so a reservation for them is not counted again.
Events arrive on watch threads and are applied on the event loop, so the usage totals
are only ever touched by one thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from webhook.engine.charge import charge_of_pod
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.usage import Usage


class ClusterState:
    def __init__(self, policy: Callable[[], CompiledPolicy], tombstone_ttl: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.pods = Usage()
        self.labels: dict[str, dict[str, str]] = {}
        self._ended: dict[str, float] = {}
        self._tombstone_ttl = tombstone_ttl
        self._clock = clock
        self.pods_synced = False
        self.namespaces_synced = False
        self.on_relabel: Callable[[], None] | None = None

    def synced(self) -> bool:
        return self.pods_synced and self.namespaces_synced

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        return self.labels.get(namespace)

    def seen(self, uid: str) -> bool:
        """Whether this replica has seen the pod (running now, or ended recently)."""
        return uid in self.pods or uid in self._ended

    # -- events (on the event loop) -------------------------------------------------

    def pod_event(self, typ: str, pod: dict[str, Any]) -> None:
        if typ == "RESET":
            self.pods = Usage()
            return
        if typ == "SYNCED":
            self.pods_synced = True
            return
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str):
            return
        if typ == "DELETED":
            self.pods.put(uid, None)
            self._end(uid)
            return
        ns = str(meta.get("namespace") or "")
        charge = charge_of_pod(pod, self.policy(), self.labels.get(ns))
        if charge is None and uid in self.pods:
            self._end(uid)  # reached a terminal phase
        self.pods.put(uid, charge)

    def namespace_event(self, typ: str, ns: dict[str, Any]) -> None:
        if typ == "RESET":
            self.labels = {}
            return
        if typ == "SYNCED":
            self.namespaces_synced = True
            return
        meta = ns.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str):
            return
        before = self.labels.get(name)
        if typ == "DELETED":
            self.labels.pop(name, None)
        else:
            self.labels[name] = dict(meta.get("labels") or {})
        if self.namespaces_synced and before != self.labels.get(name) and self.on_relabel:
            self.on_relabel()  # tenants by selector may have changed: recount the pods

    def _end(self, uid: str) -> None:
        now = self._clock()
        self._ended[uid] = now
        if len(self._ended) > 1024:
            cutoff = now - self._tombstone_ttl
            for k in [k for k, t in self._ended.items() if t < cutoff]:
                del self._ended[k]

    # -- wiring ----------------------------------------------------------------------

    def deliverer(self, loop: asyncio.AbstractEventLoop,
                  handler: Callable[[str, dict[str, Any]], None]
                  ) -> Callable[[str, dict[str, Any]], None]:
        """A callback for a watch thread that applies events on ``loop``."""

        def deliver(typ: str, obj: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(handler, typ, obj)

        return deliver
