"""The admission pipeline: the one sequence of steps every caller runs.

The HTTPS server, the offline tools (``review``, ``review --replay``, ``test``) and the
tests all decide a review here, so what is tested is what runs:

- :func:`mutating`: the mutating webhook (pure: the engine alone);
- :func:`validating`: the validating webhook, then its quota step against a usage
  store: a workload or a dry run is checked against the usage this replica sees; a real
  pod creation is checked *inside* the store's atomic reservation, so two pods that each
  fit alone can never both be admitted when together they do not; the first pod of a
  PodGroup has its whole gang checked and reserved (``webhook.admission.groups``);
- :func:`scaling`: a scale subresource request, with the read of the workload it scales;
- a GPU pod's in-place resize (``pods/resize``): its new CPU and memory per GPU
  (``webhook.engine.resize``);
- :func:`releasing`: a gang workload's DELETE, which frees what its gang reservation
  still holds.

Before either webhook decides, a DRA claim or template the object names and the watch
cache has not delivered yet is read from the API server (``webhook.admission.claimreads``).

:func:`admit` picks one of them for a webhook path. Each returns a final
:class:`~webhook.engine.decision.Decision`; the callers only carry it (to the reply
:func:`reply` builds, a report, an assertion) and count what it says.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from webhook.admission.claimreads import ClaimReader, seeing
from webhook.admission.groups import GroupMembers, GroupReader, group_gang, no_members
from webhook.admission.quota import (
    budget_findings,
    waiting,
    with_budget_warnings,
    with_quota,
)
from webhook.engine import messages
from webhook.engine.claims import CLAIM_CONTROLLER_USERS, is_claim
from webhook.engine.cost import Charge
from webhook.engine.decision import Decision, subject_of
from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.handoff import PodAsk, PodQuota, Validation
from webhook.engine.mutate import mutate
from webhook.engine.resize import is_resize, resize
from webhook.engine.routes.recheck import recheck
from webhook.engine.routes.sights import Sights, no_sights
from webhook.engine.scale import check_scale, scale_up, unchecked_scale
from webhook.engine.target import NamespaceLabels, no_labels, prepare
from webhook.engine.validate import reserved_as, validate
from webhook.engine.waiting import GATE, is_gated
from webhook.k8s.reply import response
from webhook.k8s.review import API_VERSION, AdmissionRequest
from webhook.libs import logs
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.borrow import borrow_on_mutate
from webhook.quota.budget import Spending, no_spending
from webhook.quota.store import GangStore, ReleaseStore, ReservationUnavailable, UsageStore
from webhook.quota.waiting import wait_on_mutate


class Phase(StrEnum):
    """Which webhook a review was sent to (its path, its metrics label)."""

    MUTATE = "mutate"
    VALIDATE = "validate"


class WorkloadUnreadable(Exception):
    """The workload a scale request is for could not be read; the message says why."""


# (resource, namespace, name, timeout in seconds) -> the workload as a plain dict, e.g.
# ("deployments", "team-a", "trainer", 2.0); raises WorkloadUnreadable.
WorkloadReader = Callable[[str, str, str, float], Awaitable[dict[str, Any]]]

# At most this long for reading the workload of a scale request: an API server that
# takes longer is struggling, and the check is only an early answer (see engine.scale).
SCALE_READ_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class Cluster:
    """What the pipeline reads besides the review and the policy."""

    labels: NamespaceLabels = no_labels
    store: UsageStore | None = None  # None: quota is not checked
    read_workload: WorkloadReader | None = None  # None: scale-ups are not checked
    claims: ClaimLookup = no_claims  # DRA claims and templates seen (a watch cache)
    read_claim: ClaimReader | None = None  # None: an unseen claim is not read
    sights: Sights = no_sights  # GPU nodes and PriorityClasses seen (watch caches)
    # The username the webhook's own API calls are made as: the only one that may remove
    # the quota gate from a waiting pod (None: unknown, so no one may).
    gatekeeper: str | None = None
    # The time a review is decided at (unix seconds): it chooses a tenant's quota window.
    # Tests give their own (webhook.server.settings: test_clock_offset_file).
    clock: Callable[[], float] = time.time
    # The PodGroups of the core gang API, read at a gang's first pod; None: not read
    # (each pod counted alone). Their pods the cache sees charged (the pod watch's line).
    read_group: GroupReader | None = None
    group_members: GroupMembers = no_members
    # What each GPU-hour budget has used now (a snapshot every few seconds).
    spending: Callable[[], Spending] = no_spending


def mutating(req: AdmissionRequest, policy: CompiledPolicy,
             labels: NamespaceLabels = no_labels, claims: ClaimLookup = no_claims,
             store: UsageStore | None = None, sights: Sights = no_sights,
             now: float | None = None, spent: Spending | None = None) -> Decision:
    """The mutating webhook. The request's object is edited in place while the patch is
    recorded: pass a copy to keep the original. With a usage store, a cohort tenant's pod
    that fits only on GPUs its cohort leaves idle is marked as borrowed, and a waiting
    tenant's pod that does not fit now is gated (at the caps of the quota window open at
    ``now``, as the validating webhook will count it); a pod of a tenant whose GPU-hours
    are ``spent`` and that waits for them is gated too."""
    d = mutate(req, policy, labels, claims, sights)
    if store is None or not (policy.cohorts or policy.waiting):
        return d
    asked = _asked(req, policy, labels, claims, now)
    if policy.cohorts:
        d = borrow_on_mutate(req, policy, d, store.view(), labels, asked)
    if policy.waiting:
        d = wait_on_mutate(req, policy, d, store.view(), labels, asked,
                           store.has_slot if isinstance(store, ReleaseStore) else _no_slot,
                           spent)
    return d


def _asked(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels,
           claims: ClaimLookup, now: float | None) -> PodAsk:
    """What the pod asks of its tenant's quota: the validating engine's quota step on the
    pod as mutated when first asked for (after a hand-set borrowed mark is made good), at
    the caps of the quota window open at ``now``. Computed once, only if a forecast needs
    it."""
    memo: list[PodQuota | None] = []

    def asked() -> PodQuota | None:
        if not memo:
            step = validate(req, policy, labels, claims).quota
            if not isinstance(step, PodQuota) or not step.ask.is_pod:
                memo.append(None)
            else:
                memo.append(step if now is None else replace(step, tenant=step.tenant.at(now)))
        return memo[0]

    return asked


def _no_slot(gangs: tuple[str, ...], charge: Charge) -> bool:
    return False


def reusable(req: AdmissionRequest, policy: CompiledPolicy,
             labels: Mapping[str, str] | None) -> bool:
    """Whether the mutating decision is a function of the request, the policy and the
    namespace's labels alone, so that the decision made for a pod of the same shape is
    this pod's too. Not for a cohort tenant's pod: it is marked as borrowed by what its
    tenant uses now (webhook.quota.borrow), so it is decided afresh each time."""
    if not policy.cohorts and not policy.waiting:
        return True
    owner = policy.tenant_for(req.namespace, labels)
    # A waiting tenant's pod is gated by what its tenant uses now (quota.waiting).
    # So is one of a tenant that waits for GPU-hours (by what its budget has used now).
    return owner is None or (owner.cohort is None and not owner.waits
                             and not (owner.budget is not None and owner.budget.waits))


def checked(req: AdmissionRequest, policy: CompiledPolicy, cluster: Cluster) -> Validation:
    """Every rule of the validating webhook but quota, and the quota step it leaves. The
    routes to a GPU that skip the GPU request are looked at again on the final object,
    to enforce only: what they refuse leaves no quota step, so nothing is reserved for
    it."""
    # The pod templates are read once, for the rules and the routes' recheck alike.
    prepared = None if is_claim(req) else prepare(req, policy, cluster.labels, cluster.claims)
    v = validate(req, policy, cluster.labels, cluster.claims, prepared)
    again = recheck(req, policy, cluster.labels, cluster.claims, cluster.sights,
                    CLAIM_CONTROLLER_USERS, prepared)
    return Validation(v.decision.adding(again)) if again else v


async def validating(req: AdmissionRequest, policy: CompiledPolicy, cluster: Cluster,
                     budget: float = 1.0, engine: Validation | None = None) -> Decision:
    """The validating webhook, quota included. ``engine``: what :func:`checked` makes
    of this request, when the caller has it already (a pod of a shape already checked,
    :func:`rekeyed`)."""
    v = engine if engine is not None else checked(req, policy, cluster)
    step = v.quota
    if (isinstance(step, PodQuota) and step.reservation is not None and req.object is not None
            and is_gated(req.object)):
        # Waiting for quota: checked against the caps alone, charged when released.
        return v.decision.adding(*waiting(step, policy))
    group = None
    if isinstance(step, PodQuota) and step.reservation is not None and step.reservation.group:
        started = time.monotonic()
        group = await group_gang(step, req.namespace, cluster.store, cluster.read_group,
                                 cluster.group_members, budget, cluster.claims)
        budget = max(budget - (time.monotonic() - started), 0.0)
    spent = cluster.spending()
    refused = budget_findings(step, policy, spent)
    if refused:
        return v.decision.adding(refused)
    d = await with_quota(v, policy, cluster.store, budget, cluster.clock(), group)
    return with_budget_warnings(d, step, spent)


def shareable(v: Validation, req: AdmissionRequest) -> bool:
    """Whether what :func:`checked` made of this pod creation holds for every pod of its
    shape (the same request but for the pod's name and uid), once :func:`rekeyed`: the
    pod has a controller (a pod without one is charged as its own owner, by name), and
    the engine found nothing (a finding's message names the pod)."""
    d = v.decision
    if not d.allowed or d.findings or d.warnings or d.message:
        return False
    if req.kind != "Pod" or req.operation != "CREATE" or req.ident.controller is None:
        return False
    return v.quota is None or isinstance(v.quota, PodQuota)


def rekeyed(v: Validation, req: AdmissionRequest) -> Validation:
    """A :func:`shareable` validation made for another pod of this request's shape, for
    this pod: its quota step names this pod and reserves under its uid and name."""
    step = v.quota
    if not isinstance(step, PodQuota):
        return v
    assert req.object is not None, "a pod creation carries its object"
    subject = subject_of(req.kind, req.namespace, req.object, req.name)
    res = step.reservation
    if res is not None:
        key, name = reserved_as(req)
        res = replace(res, key=key, name=name)
    return Validation(v.decision, replace(step, subject=subject, reservation=res))


async def scaling(req: AdmissionRequest, policy: CompiledPolicy, cluster: Cluster,
                  budget: float = 1.0) -> Decision:
    """A scale subresource request: read the workload only for a scale-up that quota
    applies to, then decide on its pod template."""
    up = scale_up(req, policy, cluster.labels)
    if isinstance(up, Decision):
        return up
    read = cluster.read_workload
    try:
        if read is None:
            raise WorkloadUnreadable("the webhook is not connected to a cluster")
        workload = await read(up.resource, up.namespace, up.name,
                              min(budget, SCALE_READ_SECONDS))
    except WorkloadUnreadable as exc:
        logs.event("scale not checked: the workload could not be read", logging.WARNING,
                   uid=req.uid, resource=up.resource, namespace=up.namespace,
                   name=up.name, error=str(exc))
        return unchecked_scale(up, policy, str(exc)).adding([], ["scale-unchecked"])
    return await with_quota(check_scale(up, workload, policy, cluster.labels), policy,
                             cluster.store, budget, cluster.clock())


async def admit(phase: Phase, req: AdmissionRequest, policy: CompiledPolicy,
                cluster: Cluster, budget: float = 1.0) -> Decision:
    """The decision of the webhook at ``phase`` for one parsed review."""
    if cluster.read_claim is not None and not req.sub_resource:
        started = time.monotonic()
        claims = await seeing(req, cluster.claims, cluster.read_claim, budget)
        if claims is not cluster.claims:
            cluster = replace(cluster, claims=claims)
            budget = max(budget - (time.monotonic() - started), 0.0)
    if phase is Phase.MUTATE:
        return mutating(req, policy, cluster.labels, cluster.claims, cluster.store,
                        cluster.sights, cluster.clock(), cluster.spending())
    if is_resize(req):
        return resize(req, policy, cluster.labels)
    if req.sub_resource:
        return await scaling(req, policy, cluster, budget)
    if req.operation == "DELETE":
        return await releasing(req, policy, cluster, budget)
    if req.kind == "Pod" and req.operation == "UPDATE":
        return ungating(req, cluster.gatekeeper)
    return await validating(req, policy, cluster, budget)


def reply(phase: Phase, uid: str, d: Decision, api_version: str = API_VERSION
          ) -> dict[str, Any]:
    """The AdmissionReview reply that carries a decision; the validating webhook's never
    has a patch."""
    return response(uid, d.allowed, d.message, d.warnings,
                    d.patch if phase is Phase.MUTATE else (), api_version=api_version)


def ungating(req: AdmissionRequest, gatekeeper: str | None) -> Decision:
    """A pod UPDATE (sent only when it removes the quota gate): allowed from the webhook's
    own identity, which charged the pod first; refused from anyone else, who would get
    GPUs without a charge."""
    old, new = req.old_object or {}, req.object or {}
    if not is_gated(old) or is_gated(new):
        return Decision.skip("operation")
    if gatekeeper is not None and req.username == gatekeeper:
        return Decision.skip("released")
    return Decision(allowed=False, message=messages.gate_removed_by_other(GATE, req.username))


async def releasing(req: AdmissionRequest, policy: CompiledPolicy, cluster: Cluster,
                    budget: float = 1.0) -> Decision:
    """A workload's DELETE (sent for the gang kinds only): the slots of its gang
    reservation that no pod took are freed now rather than at the bound. Always allowed:
    a delete is never the webhook's to refuse, and a release that fails leaves the
    bound to free the slots."""
    store = cluster.store
    uid = req.ident.uid  # the old object's: a DELETE carries no object
    if req.dry_run or not isinstance(store, GangStore) or not uid:
        return Decision.skip("operation")
    tenant = policy.tenant_for(req.namespace, cluster.labels(req.namespace))
    if tenant is None:
        return Decision.skip("operation")
    try:
        freed = await store.release_gang(uid, tenant.name, budget)
    except ReservationUnavailable as exc:
        logs.event("gang reservation not released; its slots free at the bound",
                   logging.WARNING, uid=req.uid, namespace=req.namespace, name=req.name,
                   error=str(exc))
        return Decision.skip("operation", tenant.name)
    if freed:
        logs.event("gang reservation released", logging.INFO, namespace=req.namespace,
                   name=req.name, kind=req.kind, slots=freed)
    return Decision.skip("released" if freed else "operation", tenant.name)
