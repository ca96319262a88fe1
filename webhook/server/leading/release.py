"""The leader releases pods waiting for quota (``tenants[].overQuota: wait``).

Every round (``--release-seconds``, 1 s; a round that would decide what the last one
decided, with nothing changed since, is skipped, but at most for 10 s) the leader reads
the gated pods its pod watch holds (``webhook.quota.line.WaitLine``), lines each tenant's
up by priority then arrival, a gang (the pods of a PodGroup of the core gang API, its
``minCount``; of a Job with parallelism above 1; or of a
training workload's gang: a Volcano Job, a JobSet or TrainJob, a Kubeflow job, one group
of a LeaderWorkerSet, its size read from the workload) as one unit of its size, and
commits, in **one compare-and-swap commit** of the tenant's ledger
(``LedgerStore.reserve_in_order``, the commit admission uses), the charges of the
complete units in order up to the first that does not fit whole (a unit refused by its
user's own caps alone, ``tenants[].userQuota``, is passed over: only that user's pods
ending can make it fit, and the tenant's GPUs should not idle meanwhile). Only then is
each released pod's gate removed, by a JSON Patch guarded by ``test`` ops: the pod's uid and
our gate at its index, so a pod replaced meanwhile, or another controller's gate (Kueue's),
is never touched. A pod is never ungated without its charge committed: a leader that
dies between the two leaves a reservation (it expires after the TTL, or counts as the
pod once the next leader releases it) and a pod still gated, which the next leader
finds reserved already and releases without charging it twice.

A pod its tenant's caps could not hold even with nothing else running (the quota was cut
after it was created) is passed over, not left to stop the line for every pod behind
it, and told so once (Event ``QuotaNeverFits``, with the cap and what to do).

Each waiting pod gets an Event when its place or the numbers change ("waiting for GPU
quota: 4 GPUs asked, 2 free; 3rd in line in tenant research"), at most every 5 s, and
one when it is released. Metrics: waiting pods and GPUs per tenant, seconds from
creation to release, and seconds from the moment a pod could fit (a pod of its tenant
gave GPUs back, or it arrived, whichever is later) to its release: the line's own delay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webhook.admission.quota import at, quota
from webhook.engine import messages
from webhook.engine.charge import charge_of_pod
from webhook.engine.decision import Checker, Quiet
from webhook.engine.handoff import PodQuota, Validation
from webhook.engine.users import recorded_on
from webhook.engine.validate import OWNED, validate
from webhook.engine.waiting import ungate_ops, ungated
from webhook.k8s import podgroups
from webhook.k8s.identity import ObjectId
from webhook.k8s.objects import MalformedObject
from webhook.k8s.review import AdmissionRequest
from webhook.k8s.workloads import READERS, job_pods
from webhook.libs import kube, logs
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode
from webhook.policy.tenantrules import TenantRules
from webhook.quota.borrow import cohort_members
from webhook.quota.budget import Spending, judge, no_spending
from webhook.quota.cache import ClusterState
from webhook.quota.check import UsageView, check_pod, users_cap_alone
from webhook.quota.cohort import room
from webhook.quota.fairshare import ordered
from webhook.quota.line import GangOf, Unit, Waiting, gang_of, line_up, releasable
from webhook.quota.store import (
    Held,
    MemoryStore,
    ReleaseStore,
    ReservationUnavailable,
    UsageStore,
)
from webhook.server import metrics
from webhook.server.leading import leader

EVENT_SECONDS = 5.0  # a waiting pod's event is written again at most this often
SKIP_SECONDS = 10.0  # a round with nothing changed is skipped at most this long
RELEASED_SECONDS = 30.0  # a released pod is not released again while the watch catches up
UNKNOWN_SIZE = 2**31  # a gang whose Job could not be read: never complete


@dataclass(frozen=True, slots=True)
class _Decided:
    """A waiting pod as decided for its release (``Releaser._decided``)."""

    policy: CompiledPolicy
    key: tuple[Any, ...]  # (its resourceVersion, its namespace's labels)
    gpus: float  # GPU-equivalents it asks, for the events and metrics
    validation: Validation


@dataclass(frozen=True, slots=True)
class _Gang:
    size: int
    read: float  # time.monotonic()


class Releaser:
    def __init__(self, policy: Callable[[], CompiledPolicy], state: ClusterState,
                 store: ReleaseStore, pods: kube.Pods, leading: Callable[[], bool],
                 interval: float = 1.0, budget: float = 5.0,
                 wall: Callable[[], float] = time.time,
                 spending: Callable[[], Spending] = no_spending) -> None:
        self.policy, self.state, self.store, self.pods = policy, state, store, pods
        self.leading, self.interval, self.budget, self.wall = leading, interval, budget, wall
        self.spending = spending  # what each GPU-hour budget has used
        self._told: dict[str, tuple[str, float]] = {}  # uid -> (last event, when)
        self._released: dict[str, float] = {}  # uid -> when (monotonic)
        self._arrived: dict[str, float] = {}  # uid -> when first seen waiting (monotonic)
        self._jobs: dict[str, _Gang] = {}  # gang key -> its size
        self._decisions: dict[str, _Decided] = {}  # uid -> as decided last
        self._last: dict[str, tuple[Any, ...]] = {}  # tenant -> what its last round saw
        self._last_at: dict[str, float] = {}
        self._tenants: set[str] = set()  # tenants with metrics written
        # A round's pods waiting for GPUs to borrow, by cohort: (tenant, place, unit and
        # its quota step), committed after every tenant's own line (_lend).
        self._to_borrow: dict[str, list[tuple[str, tuple[int, str, str, str],
                                              tuple[Unit, PodQuota]]]] = {}

    async def run(self) -> None:
        await leader.every(self.interval, self.leading, self.state.synced, self.round_,
                           missing="quota line not released: an object is missing",
                           failed="quota line not released; tried again next round")

    async def round_(self) -> None:
        policy = self.policy()
        now = time.monotonic()
        self._released = {u: t for u, t in self._released.items()
                          if now - t < RELEASED_SECONDS}
        lines: dict[str, tuple[TenantRules, list[Waiting]]] = {}
        pods: dict[str, dict[str, Any]] = {}
        for uid, pod in list(self.state.line.pods.items()):
            if uid in self._released:
                continue
            self._arrived.setdefault(uid, now)
            ident = ObjectId.of(pod)
            ns = ident.namespace
            tenant = policy.tenant_for(ns, self.state.namespace_labels(ns))
            pods[uid] = pod
            if tenant is None or not tenant.has_quota:
                await self._ungate(uid, pod, "")  # nothing to charge it to
                continue
            gang = await self._gang(pod)
            w = Waiting(uid, ns, ident.name, _priority(pod), ident.created, gang,
                        self._decided(uid, pod, policy).gpus)
            lines.setdefault(tenant.name, (tenant, []))[1].append(w)
        for name in self._tenants - set(lines):
            metrics.WAITING_PODS.labels(name).set(0)
            metrics.WAITING_GPUS.labels(name).set(0)
        self._tenants = set(lines)
        # Tenants' lines are independent (a ledger each): decided and released side by
        # side, so one tenant's commit and patches do not wait for another's.
        self._to_borrow = {}
        await asyncio.gather(*(self._tenant(policy, tenant, waiting, pods)
                               for tenant, waiting in lines.values()))
        # What a cohort lends goes to its members' waiting pods in one order across them.
        await asyncio.gather(*(self._lend(policy, cohort, items, pods)
                               for cohort, items in self._to_borrow.items()))
        for uid in [u for u in self._told if u not in self.state.line.pods]:
            del self._told[uid]
        for uid in [u for u in self._arrived if u not in self.state.line.pods]:
            del self._arrived[uid]
        for uid in [u for u in self._decisions if u not in self.state.line.pods]:
            del self._decisions[uid]

    def _decided(self, uid: str, pod: dict[str, Any], policy: CompiledPolicy) -> _Decided:
        """The pod's charge and the validating engine's decision on its creation, as of
        now. Kept while the pod (its resourceVersion), the policy and its namespace's
        labels stay the same: a line of 1,000 pods is not decided 1,000 times a second.
        A pod naming DRA claims is decided every time (its claims may change)."""
        ident = ObjectId.of(pod)
        ns, name = ident.namespace, ident.name
        labels = self.state.namespace_labels(ns)
        version = ident.resource_version
        key = (version, tuple(sorted(labels.items())) if labels else ())
        known = self._decisions.get(uid)
        if known is not None and known.policy is policy and known.key == key and version:
            return known
        # Decided as its creation by the user it records: its own CREATE wrote that name
        # (a bare pod) or checked it against its creator (a controller's), so its
        # per-user cap binds the release as it bound the admission.
        user = recorded_on(ident) or ""
        obj = ungated(pod)
        req = AdmissionRequest(uid="release", group="", version="v1", kind="Pod",
                               operation="CREATE", namespace=ns, name=name,
                               object=obj, resource="pods", username=user)
        v = validate(req, policy, self.state.namespace_labels, self.state.claim_lookup)
        charge = charge_of_pod(obj, policy, labels, self.state.claim_lookup)
        out = _Decided(policy, key, charge.gpus if charge else 0.0, v)
        spec = pod.get("spec")
        if not (isinstance(spec, dict) and spec.get("resourceClaims")):
            self._decisions[uid] = out
        return out

    async def _tenant(self, policy: CompiledPolicy, tenant: TenantRules,
                      waiting: list[Waiting], pods: dict[str, dict[str, Any]]) -> None:
        jobs = {w.gang for w in waiting if w.gang}
        units = line_up(waiting, {j: self._jobs[j].size for j in jobs if j in self._jobs},
                        {j: self.state.line.running(j) for j in jobs})
        metrics.WAITING_PODS.labels(tenant.name).set(len(waiting))
        metrics.WAITING_GPUS.labels(tenant.name).set(sum(w.gpus for w in waiting))
        ready: list[Unit] = []
        held: list[list[Held]] = []
        borrowing: list[tuple[Unit, PodQuota]] = []
        never: dict[str, str] = {}  # uid -> why it can never fit the quota now
        for u in releasable(units):
            h = [self._held(policy, w.uid, pods[w.uid], never) for w in u.pods]
            if any(x is False for x in h):
                continue  # refused by the policy now: it stays, told why, passed over
            steps = [x for x in h if isinstance(x, PodQuota)]
            if steps:  # marked: it waits for GPUs to borrow (never a gang's)
                if u.gang is None:
                    borrowing.append((u, steps[0]))
                continue
            ready.append(u)
            held.append([x for x in h if isinstance(x, Held)])
        view = self.store.view()
        used = view.tenant(tenant.name)
        lend = self._to_lend(policy, tenant, view) if borrowing else 0.0
        seen = (self.state.line.version, id(policy), used.gpus, used.pods, len(ready),
                len(borrowing), lend)
        now = time.monotonic()
        if self._last.get(tenant.name) == seen and now - self._last_at[tenant.name] < SKIP_SECONDS:
            return  # nothing changed since a round that released nothing
        done: list[Unit] = []
        if ready:
            try:
                done = [ready[i] for i in
                        await self.store.reserve_in_order(tenant.name, held, self.budget)]
            except ReservationUnavailable as exc:
                logs.event("quota line not released: the ledger cannot be reached",
                           logging.WARNING, tenant=tenant.name, error=str(exc))
                return
        if tenant.cohort is not None:
            self._to_borrow.setdefault(tenant.cohort.name, []).extend(
                (tenant.name, u.pods[0].place(), (u, step)) for u, step in borrowing)
        # Charged already: the gates come off together (a gang's pods start at once).
        await asyncio.gather(*(self._ungate(w.uid, pods[w.uid], tenant.name)
                               for u in done for w in u.pods))
        if done:
            self._last.pop(tenant.name, None)
        else:
            self._last[tenant.name], self._last_at[tenant.name] = seen, now
        gone = {w.uid for u in done for w in u.pods}
        for uid, why in never.items():
            await self._tell_once(uid, pods[uid], "QuotaNeverFits", why)
        await self._tell(policy, tenant, [u for u in units if u.pods[0].uid not in gone
                                          and u.pods[0].uid not in never],
                         pods, view, {u.pods[0].uid for u, _ in borrowing})

    async def _lend(self, policy: CompiledPolicy, cohort: str,
                    items: list[tuple[str, tuple[int, str, str, str],
                                      tuple[Unit, PodQuota]]],
                    pods: dict[str, dict[str, Any]]) -> None:
        """The cohort's pods waiting for GPUs to borrow, committed in one order across
        its tenants: by fair share when the cohort has it (``webhook.quota.fairshare``),
        then priority, then arrival."""
        fair = self.spending().standing.get(cohort)
        whose = {id(u): tenant for tenant, _, (u, _) in items}
        done = await self._borrow(policy, ordered(items, fair))
        await asyncio.gather(*(self._ungate(w.uid, pods[w.uid], whose[id(u)])
                               for u in done for w in u.pods))

    async def _borrow(self, policy: CompiledPolicy, borrowing: list[tuple[Unit, PodQuota]]
                      ) -> list[Unit]:
        """The pods waiting for GPUs to borrow, in line order, each committed as
        admission commits a borrowed pod (``webhook.admission.quota``: the cohort's
        ledger, against what its cohort lends now), up to the first that does not fit."""
        done: list[Unit] = []
        store = self.store
        if not isinstance(store, UsageStore):
            return done  # a store that admits nothing cannot commit a borrowed pod
        for u, step in borrowing:
            found, faults = await quota(at(step, self.wall()), policy, store, self.budget)
            if faults or any(f.mode is Mode.ENFORCE for f in found):
                break  # not committed: it and those behind it wait for the next round
            done.append(u)
        return done

    def _to_lend(self, policy: CompiledPolicy, tenant: TenantRules, view: UsageView
                 ) -> float:
        """GPUs the tenant's cohort can lend it now."""
        if tenant.cohort is None:
            return 0.0
        return room(cohort_members(policy, tenant, view), tenant.name).free

    def _held(self, policy: CompiledPolicy, uid: str, pod: dict[str, Any],
              never: dict[str, str]) -> Held | PodQuota | bool:
        """The pod's charge and quota test as admission would decide its creation now:
        a Held, its quota step when it is marked as borrowed, True when it is charged
        nothing (its tenant caps nothing it asks), False when the policy refuses it now
        or it could not fit its caps even with nothing else running (a quota cut below
        what it asks: said in ``never``, and passed over rather than holding up every
        pod behind it)."""
        ident = ObjectId.of(pod)
        ns, name = ident.namespace, ident.name
        v = self._decided(uid, pod, policy).validation
        if not v.decision.allowed:
            logs.event("waiting pod refused by the policy now; it stays waiting",
                       logging.WARNING, namespace=ns, name=name, why=v.decision.message)
            return False
        step = v.quota
        if not isinstance(step, PodQuota) or step.reservation is None:
            return True
        if step.borrowing is not None:
            return step  # marked: committed by the borrowed step (_borrow)
        res = step.reservation
        tenant, ask = step.tenant.at(self.wall()), step.ask  # the window open now
        spent = self.spending()
        if tenant.budget is not None and judge(tenant, ask.user, spent, spent.at).reason:
            return False  # waits for GPU-hours: stays in line until they come back
        alone = Checker(policy, tenant, f"pod {ns}/{name}", OWNED)
        if not check_pod(alone, tenant, ask, MemoryStore().view()):
            never[uid] = messages.never_fits_event(alone.findings[0].message)
            return False

        def fits(view: UsageView) -> bool:
            return check_pod(Quiet(policy, tenant, "", OWNED), tenant, ask, view)

        def passed(view: UsageView) -> bool:
            return users_cap_alone(tenant, ask, view)

        return Held(key=res.key, charge=res.charge, name=res.name or f"{ns}/{name}",
                    fits=fits, passed=passed, gangs=res.gangs)

    async def _gang(self, pod: dict[str, Any]) -> str | None:
        """The pod's gang (its key in the line) when its workload starts more than one
        pod at once: a Job's parallelism, a training workload's gang (read from it)."""
        gang = gang_of(pod, lookup=self.state.claim_lookup)
        if gang is None:
            return None
        if gang.size is not None:  # a gang of gangs, known from the watches
            self._jobs[gang.key] = _Gang(gang.size, time.monotonic())
            return gang.key if gang.size > 1 else None
        known = self._jobs.get(gang.key)
        if known is None or time.monotonic() - known.read > SKIP_SECONDS:
            try:
                size = await asyncio.to_thread(self._size, gang)
            except (kube.KubeError, MalformedObject) as exc:
                logs.event("workload of a waiting pod not read; its pods keep waiting",
                           logging.WARNING, kind=gang.kind, namespace=gang.namespace,
                           name=gang.name, error=str(exc))
                if known is None:
                    # Its size unknown, none of it is released (a part could start and
                    # hold GPUs the rest then waits for); read again next round.
                    self._jobs[gang.key] = _Gang(UNKNOWN_SIZE,
                                                 time.monotonic() - SKIP_SECONDS)
                    return gang.key
                return gang.key if known.size > 1 else None
            known = self._jobs[gang.key] = _Gang(size, time.monotonic())
        return gang.key if known.size > 1 else None

    def _size(self, gang: GangOf) -> int:
        """Pods of the gang that must start together, read from its workload now."""
        if gang.is_job:
            return gang_size(self.pods.job(gang.namespace, gang.name))
        obj = self.pods.workload(gang.group, gang.version, gang.resource, gang.namespace,
                                 gang.name)
        if gang.kind == podgroups.KIND:
            return podgroups.gang_size(obj)
        workload = READERS[(gang.group, gang.kind)](obj)
        if workload is None:
            return 1
        # A LeaderWorkerSet's gang is one group (``gang_of`` keys its pods so).
        return workload.gang if workload.gang is not None else workload.pods

    async def _ungate(self, uid: str, pod: dict[str, Any], tenant: str) -> None:
        ops = ungate_ops(pod)
        ident = ObjectId.of(pod)
        ns, name = ident.namespace, ident.name
        if ops is None:
            return
        try:
            await asyncio.to_thread(self.pods.patch, ns, name, ops)
        except (kube.Conflict, kube.NotFound):
            return  # replaced, deleted or released meanwhile: nothing of someone else's
        except kube.KubeError as exc:
            logs.event("waiting pod not released; tried again next round", logging.WARNING,
                       namespace=ns, name=name, error=str(exc))
            return
        now = self._released[uid] = time.monotonic()
        waited = max(self.wall() - _timestamp(ident.created), 0.0)
        metrics.RELEASED.labels(tenant or "none").inc()
        metrics.RELEASE_SECONDS.labels(tenant or "none").observe(waited)
        could = max(self.state.freed.get(tenant, 0.0), self._arrived.pop(uid, now))
        metrics.RELEASE_LATENCY.labels(tenant or "none").observe(max(now - could, 0.0))
        logs.event("waiting pod released", namespace=ns, name=name, tenant=tenant,
                   waited_seconds=round(waited, 1))
        await self._event(pod, "QuotaReleased", messages.released_event(waited))

    async def _tell(self, policy: CompiledPolicy, tenant: TenantRules, units: list[Unit],
                    pods: dict[str, dict[str, Any]], view: UsageView,
                    borrowing: set[str]) -> None:
        cap = tenant.quota.gpus if tenant.quota is not None else None
        used = view.tenant(tenant.name).gpus
        free = max(cap - used, 0.0) if cap is not None else 0.0
        lend = self._to_lend(policy, tenant, view) if borrowing else 0.0
        for place, u in enumerate(units, 1):
            for w in u.pods:
                if w.uid in borrowing and tenant.cohort is not None:
                    text = messages.waiting_borrow_event(w.gpus, lend, place, tenant.name,
                                                         tenant.cohort.name)
                elif u.gang is None:
                    text = messages.waiting_event(w.gpus, free, place, tenant.name)
                else:
                    text = messages.waiting_gang_event(u.gpus, free, place, tenant.name,
                                                       len(u.pods) + u.running, u.size)
                last = self._told.get(w.uid)
                now = time.monotonic()
                if last is not None and (last[0] == text or now - last[1] < EVENT_SECONDS):
                    continue
                self._told[w.uid] = (text, now)
                await self._event(pods[w.uid], "WaitingForQuota", text)

    async def _tell_once(self, uid: str, pod: dict[str, Any], reason: str, text: str) -> None:
        """An Event and a log line, once while the pod and what is said stay the same."""
        if (self._told.get(uid) or ("", 0.0))[0] == text:
            return
        self._told[uid] = (text, time.monotonic())
        ident = ObjectId.of(pod)
        logs.event("waiting pod can never fit its quota now; passed over", logging.WARNING,
                   namespace=ident.namespace, name=ident.name, why=text)
        await self._event(pod, reason, text)

    async def _event(self, pod: dict[str, Any], reason: str, text: str) -> None:
        try:
            await asyncio.to_thread(self.pods.event, pod, reason, text)
        except kube.KubeError as exc:
            logs.event("event on a waiting pod not written", logging.INFO, error=str(exc))


def gang_size(job: dict[str, Any]) -> int:
    """Pods a Job runs at once now: its parallelism, capped by the completions left."""
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    p, c, done = spec.get("parallelism"), spec.get("completions"), status.get("succeeded")
    return job_pods(p if isinstance(p, int) else 1, c if isinstance(c, int) else None,
                    done if isinstance(done, int) else 0)


def _priority(pod: dict[str, Any]) -> int:
    p = (pod.get("spec") or {}).get("priority")
    return p if isinstance(p, int) and not isinstance(p, bool) else 0


def _timestamp(value: Any) -> float:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
