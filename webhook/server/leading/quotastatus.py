"""The GPUQuota objects: each tenant's quota, kept current for ``kubectl get gpuquotas``.

One namespaced object per namespace of a tenant that has a quota, named after the
tenant, whose ``status`` holds the numbers ``gpu-webhook status`` prints (computed by the
same :mod:`webhook.quota.status`): the binding GPU cap's used / reserved / limit / free
as printer columns, every cap, GPU pods and the top consumers. Namespaced, so a
developer reads it under their namespace's own RBAC (the shipped ClusterRole aggregates
read access into ``view``), not the ledger's.

Written by the leader replica only (:mod:`webhook.server.leading.leader`), from its watch cache
and the ledgers (read once per round), never in the request path. Rate-limited: one
round every ``interval`` seconds, and an object is applied only when its numbers
changed; objects of namespaces that no longer have a quota are deleted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from webhook.libs import kube, logs
from webhook.policy.compiled import CompiledPolicy
from webhook.quota import status
from webhook.quota.budget import Spending, no_spending
from webhook.quota.cache import ClusterState
from webhook.quota.decider import DecidingStore
from webhook.quota.entries import LEDGER_PREFIX
from webhook.quota.ledger import LedgerStore
from webhook.server.leading import leader

_SELECTOR = ",".join(f"{k}={v}" for k, v in status.MANAGED_BY.items())


def wanted(policy: CompiledPolicy, state: ClusterState, store: LedgerStore | DecidingStore,
           fresh: dict[str, kube.StoredMap] | None = None, now: float | None = None,
           spent: Spending | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, tenant) -> the GPUQuota status that namespace should show now."""
    held = store.reserved(fresh) if isinstance(store, LedgerStore) else store.reserved_usage()
    out: dict[tuple[str, str], dict[str, Any]] = {}
    by_tenant: dict[str, status.Report] = {}  # once per tenant, not per namespace
    waiting = status.waiting_of(state.line.pods.values(), policy, state.namespace_labels)
    for ns, labels in sorted(state.labels.items()):
        tenant = policy.tenant_for(ns, labels)
        if tenant is None or not tenant.has_quota:
            continue
        whole = by_tenant.get(tenant.name)
        if whole is None:
            whole = by_tenant[tenant.name] = status.of([tenant], state.pods, held,
                                                        now=now)
            if tenant.name in waiting:
                whole.waiting[tenant.name] = waiting[tenant.name]
            if spent is not None and tenant.name in spent.tenants:
                whole.budgets[tenant.name] = spent.tenants[tenant.name]
        mine = status.seen_from(whole, ns)
        if not mine.rows and tenant.name not in mine.budgets:
            continue  # caps only on the tenant's other namespaces: none that bind here
        out[(ns, tenant.name)] = status.gpuquota_status(mine, tenant.name, policy.name)
    return out


def _skipped(name: str, exc: kube.KubeError) -> None:
    logs.event("quota status object not written; tried again next round", logging.WARNING,
               gpuquota=name, error=str(exc), detail=exc.detail)


def _numbers(st: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in st.items() if k != "updated"}


class QuotaStatusWriter:
    def __init__(self, policy: Callable[[], CompiledPolicy], state: ClusterState,
                 store: LedgerStore | DecidingStore, objects: kube.CustomObjects,
                 leading: Callable[[], bool], interval: float,
                 wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.time,
                 spending: Callable[[], Spending] = no_spending) -> None:
        self.policy, self.state, self.store = policy, state, store
        self.objects, self.leading = objects, leading
        self.interval, self.wall = interval, wall
        self.clock = clock  # the admission pipeline's: it chooses the quota window shown
        self.spending = spending  # what each GPU-hour budget has used
        self.writes = 0

    async def round(self) -> None:
        """Compare what should be shown with what is, and write the difference."""
        policy = self.policy()
        tenants = sorted({t.name for t in policy.tenants if t.has_quota})
        # The objects first: without their CRD there is nothing to read the ledgers for.
        existing = await asyncio.to_thread(self.objects.list, _SELECTOR)
        fresh = await asyncio.to_thread(self._read_ledgers, tenants)
        # On the loop, as commits.
        want = wanted(policy, self.state, self.store, fresh, self.clock(), self.spending())
        now = datetime.fromtimestamp(self.wall(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        have = {(str(o["metadata"]["namespace"]), str(o["metadata"]["name"])): o
                for o in existing}
        for (ns, tenant), st in want.items():
            old = have.get((ns, tenant))
            if old is not None and _numbers(old.get("status") or {}) == st:
                continue
            if not self.leading():
                return  # lost the Lease mid-round: the new leader writes from here
            obj = status.gpuquota(ns, tenant, {**st, "updated": now})
            # One object that cannot be written (its namespace terminating) must not
            # keep the others stale: logged, and tried again next round.
            try:
                await asyncio.to_thread(self._write, obj, old is None)
                self.writes += 1
            except kube.KubeError as exc:
                _skipped(f"{ns}/{tenant}", exc)
        for key in have.keys() - want.keys():
            try:
                await asyncio.to_thread(self.objects.delete, *key)
            except kube.KubeError as exc:
                _skipped("/".join(key), exc)

    def _read_ledgers(self, tenants: list[str]) -> dict[str, kube.StoredMap]:
        out: dict[str, kube.StoredMap] = {}
        if not isinstance(self.store, LedgerStore):
            return out  # the leader's reservations are in its memory (quota.decider)
        for t in tenants:
            try:
                out[t] = self.store.maps.read(LEDGER_PREFIX + t)
            except kube.KubeError as exc:  # the last read stands; the next round retries
                logs.event("quota status: ledger not read", logging.DEBUG,
                           ledger=LEDGER_PREFIX + t, error=str(exc))
        return out

    def _write(self, obj: dict[str, Any], new: bool) -> None:
        if new:
            # The status subresource cannot create its object: the object first.
            self.objects.apply({k: v for k, v in obj.items() if k != "status"})
        try:
            self.objects.apply(obj, status=True)
        except kube.NotFound:  # deleted since it was listed
            self.objects.apply({k: v for k, v in obj.items() if k != "status"})
            self.objects.apply(obj, status=True)

    async def run(self) -> None:
        """A round every ``interval`` seconds while this replica leads (the first as soon
        as it leads), until cancelled."""
        await leader.every(
            self.interval, self.leading, self.state.synced, self.round,
            missing="quota status not written: the GPUQuota CRD is not installed "
                    "(deploy/base/crd-gpuquota.yaml)",
            failed="quota status not written")
