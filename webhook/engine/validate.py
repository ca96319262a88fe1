"""The validating webhook's decision on the final object: per-container and per-pod
maximums, products and topology the pod is pinned to, and what quota must check. It
never returns a patch.

Rules the mutating phase owns are re-checked here only to enforce them, so a pod that
reached the API server without the mutating webhook (failurePolicy Ignore while it was
down, or a reinvocation) is still held to the policy.

Quota needs the usage store, which the engine does not touch: :func:`validate` returns
the decision of every other rule and, when that allows the object and its tenant has a
quota, a quota step (:mod:`webhook.engine.handoff`) saying what to check (and for a real
creation, what to reserve atomically). The admission pipeline (``webhook.admission``) runs
it.

A workload with roles (a training job) is checked template by template, and its quota
step asks for every role at once (:class:`~webhook.engine.gang.GangAsk`). A role made
up from resource fields (a TrainJob's resourcesPerNode, an Argo step) is not pinned yet:
it is charged to the tenant's default product, and its pods are pinned when created.
"""

from __future__ import annotations

from contextlib import suppress

from webhook.engine import claims as claims_engine
from webhook.engine import holding, messages
from webhook.engine.borrowed import charged_to, priority_mismatch
from webhook.engine.charge import owner_of, pod_cost, unknown_templates
from webhook.engine.claims import is_claim
from webhook.engine.cost import Ask, Cost
from webhook.engine.decision import Checker, Decision, Finding, malformed
from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.gang import GangAsk, RoleAsk, pod_ids, workload_ids
from webhook.engine.gpu import check_maximums, check_requests, shared_part, weighted
from webhook.engine.handoff import (
    GangQuota,
    GangReservation,
    PodQuota,
    Reservation,
    Validation,
)
from webhook.engine.target import (
    NamespaceLabels,
    Target,
    Targets,
    no_labels,
    no_tenant,
    prepare,
)
from webhook.engine.tolerations import tolerated_gpu_taints
from webhook.engine.users import charged_user, recorded
from webhook.k8s import podgroups
from webhook.k8s.objects import MalformedObject
from webhook.k8s.review import AdmissionRequest
from webhook.k8s.workloads import Workload, owned_by_reserving, read_workload, replicas
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule, TolerationPolicy

OWNED = frozenset({Rule.MAX_PER_CONTAINER, Rule.MAX_PER_POD, Rule.QUOTA, Rule.UNKNOWN_CLAIM,
                   Rule.RESOURCES_PER_GPU})


def validate(req: AdmissionRequest, policy: CompiledPolicy,
             labels: NamespaceLabels = no_labels, claims: ClaimLookup = no_claims,
             prepared: Targets | Decision | None = None) -> Validation:
    """Every rule but quota on the final object, and the quota step it leaves.
    ``prepared``: what :func:`~webhook.engine.target.prepare` made of this request, when
    the caller has it already (the pipeline shares it with the routes' recheck)."""
    if is_claim(req):
        return claims_engine.validate(req, policy, labels, claims)
    targets = prepared if prepared is not None else prepare(req, policy, labels, claims)
    if isinstance(targets, Decision):
        return Validation(targets)
    if len(targets.roles) == 1 and targets.roles[0].role.name is None:
        done = _one_template(targets.roles[0].target, policy, req, labels)
    else:
        done = _roles(targets, policy, req, labels)
    if targets.is_pod or targets.tenant is None or targets.tenant.runtime is None:
        return done
    # A Job that skipped the mutating webhook is still held to its maximum runtime.
    held = Checker(policy, targets.tenant, targets.subject, OWNED)
    try:
        holding.workload(held, targets, req, None, [])
    except MalformedObject as exc:
        return Validation(malformed(targets.subject, exc))
    return Validation(done.decision.adding(held.findings),
                      None if held.denied else done.quota)


def _one_template(target: Target, policy: CompiledPolicy, req: AdmissionRequest,
                  labels: NamespaceLabels) -> Validation:
    check = Checker(policy, target.tenant, target.subject, OWNED)
    try:
        quota = None
        unknown_templates(check, target)
        if target.has_gpu:
            quota = _gpu_pod(check, policy, target, req, labels)
        elif policy.non_gpu_tolerations is TolerationPolicy.DENY and not target.claims:
            _tolerates_gpu_taints(check, policy, target)
    except MalformedObject as exc:
        return Validation(malformed(target.subject, exc))
    return Validation(check.decide(), quota)


def _gpu_pod(check: Checker, policy: CompiledPolicy, target: Target, req: AdmissionRequest,
             labels: NamespaceLabels) -> PodQuota | None:
    tenant = target.tenant
    if tenant is None and not policy.unassigned_allowed:
        check.report(Rule.TENANT_REQUIRED, no_tenant(req.namespace, policy, labels))
        return None
    cost = pod_cost(check, policy, target)
    holding.ratios(check, target, cost)
    if target.template.is_pod:
        holding.recheck(check, policy, target, req.namespace)
    if tenant is None or check.denied or not tenant.has_quota:
        return None
    if not cost.resources:
        # Every GPU count unreadable (only reported in warn or audit mode): the pod costs
        # nothing, as the cluster cache will count it; reserving a GPU pod of 0 GPUs would
        # hold a slot of the tenant's pod cap that the cache never charges.
        return None
    assert req.object is not None
    pods = 1 if target.template.is_pod else replicas(req.group, req.kind, req.object)
    added = pods
    if req.operation == "UPDATE" and req.old_object is not None:
        with suppress(MalformedObject):  # an unreadable old object: count all pods
            added = max(0, pods - replicas(req.group, req.kind, req.old_object))
    user = charged_user(req, tenant, target)
    if user is not None and target.template.is_pod:
        said = recorded(target.template.metadata)
        if said != user:
            # The mutating webhook writes the creator's name on the pod; a pod that
            # reaches this webhook saying someone else did not pass it (failurePolicy
            # Ignore while it was down), and the cache would charge it to that name.
            check.report(Rule.QUOTA, messages.user_not_recorded(said, user))
            return None
    ask = Ask(tenant=tenant.name, namespace=req.namespace, cost=cost, pods=pods,
              is_pod=target.template.is_pod, pods_added=added, kind=req.kind, user=user)
    reservation = None
    if target.template.is_pod and not req.dry_run:  # a dry run must leave no trace
        key, name = reserved_as(req)
        group = podgroups.group_of(req.object)
        gangs = pod_ids(req.ident)
        if group is not None:
            gangs = (*gangs, podgroups.group_id(req.namespace, group))
        reservation = Reservation(
            key=key, charge=cost.charge(charged_to(tenant, req.object), req.namespace,
                                        owner_of(req.ident), user=user),
            gangs=gangs, name=name, group=group)
    borrowed = charged_to(tenant, req.object) != tenant.name
    if borrowed and target.template.is_pod and tenant.cohort is not None:
        problem = priority_mismatch(req.object, tenant.cohort.priority)
        if problem is not None:
            check.report(Rule.QUOTA, messages.borrowed_priority_changed(
                tenant.cohort.priority.name, problem))
            return None
    return PodQuota(tenant=tenant, subject=target.subject, ask=ask, reservation=reservation,
                    borrowing=tenant.cohort if borrowed else None)


def reserved_as(req: AdmissionRequest) -> tuple[str, str]:
    """The key (its uid) and "namespace/name" a pod creation's reservation is kept
    under: a retry of the same create is one charge, and a name another pod holds is
    refused before it can hold GPUs (see quota.ledger)."""
    name = f"{req.namespace}/{req.ident.name or req.name}"
    return req.ident.uid or name, name


def _tolerates_gpu_taints(check: Checker, policy: CompiledPolicy, target: Target) -> None:
    hits, found = tolerated_gpu_taints(target.template.spec, target.template.spec_pointer,
                                       policy.tolerations)
    if hits:
        check.report(Rule.NON_GPU_TOLERATIONS, messages.tolerates_gpu_taint(found))


def _roles(targets: Targets, policy: CompiledPolicy, req: AdmissionRequest,
           labels: NamespaceLabels) -> Validation:
    """A workload with roles: each template checked, and one quota step for them all."""
    tenant = targets.tenant
    findings: list[Finding] = []
    if targets.has_gpu and tenant is None and not policy.unassigned_allowed:
        told = Checker(policy, None, targets.subject, OWNED)
        told.report(Rule.TENANT_REQUIRED, no_tenant(req.namespace, policy, labels))
        return Validation(told.decide())
    asks: list[RoleAsk] = []
    old = _old_pods(req, policy)
    denied = False
    for rt in targets.roles:
        check = Checker(policy, tenant, rt.target.subject, OWNED)
        try:
            cost = _role_cost(check, policy, rt.target, rt.role.patchable)
        except MalformedObject as exc:
            return Validation(malformed(rt.target.subject, exc))
        denied |= check.denied
        findings.extend(check.findings)
        role = rt.role
        name = role.name or ""
        added = role.pods if old is None else max(0, role.pods - old.get(name, 0))
        asks.append(RoleAsk(name, cost, role.pods, added, role.minimum))
    decision = Decision.of(findings, tenant=tenant.name if tenant else None)
    if (tenant is None or denied or not tenant.has_quota
            or not any(a.cost.resources for a in asks)):
        return Validation(decision)
    w = targets.workload
    # Its pods are charged to one user, as a Job's: the user's caps bind the whole gang.
    user = charged_user(req, tenant, targets.roles[0].target) if targets.roles else None
    gang = GangAsk(tenant.name, req.namespace, w.kind, w.noun, w.role_word, tuple(asks),
                   w.gang, w.sequential, user)
    return Validation(decision, GangQuota(tenant=tenant, subject=targets.subject, gang=gang,
                                          reservation=_gang_reservation(req, w)))


def _role_cost(check: Checker, policy: CompiledPolicy, target: Target, patchable: bool
               ) -> Cost:
    """One role's rules checked (reporting to ``check``), and what one of its pods costs."""
    unknown_templates(check, target)
    if target.has_gpu:
        cost = (pod_cost(check, policy, target) if patchable
                else _unpinned_cost(check, policy, target))
        holding.ratios(check, target, cost)
        return cost
    if (policy.non_gpu_tolerations is TolerationPolicy.DENY and patchable
            and not target.claims):
        _tolerates_gpu_taints(check, policy, target)
    return Cost(None, {}, 0.0)


def _gang_reservation(req: AdmissionRequest, w: Workload) -> GangReservation | None:
    """The reservation of a gang workload's CREATE (not a dry run), under its uid."""
    if (w.gang is None or not w.reserves or req.operation != "CREATE" or req.dry_run
            or req.object is None or owned_by_reserving(req.ident)):
        # A workload made by a reserved one (a TrainJob's JobSet) is checked only: its
        # pods draw from its owner's reservation, and reserving again would hold the
        # GPUs twice.
        return None
    # The validating webhook sees the final object, uid included: a gang's GPUs are
    # reserved under it, and its pods find it through their owners.
    uid = req.ident.uid
    if not uid:
        return None
    name = req.ident.shown(req.name)
    return GangReservation(key=uid, owner=f"{w.kind.lower()}/{name}",
                           ids=workload_ids(req.group, req.kind, req.namespace, name, uid))


def _old_pods(req: AdmissionRequest, policy: CompiledPolicy) -> dict[str, int] | None:
    """Pods per role before an UPDATE (None for a CREATE or an unreadable old object:
    every pod counts as added)."""
    if req.operation != "UPDATE" or req.old_object is None:
        return None
    try:
        old: Workload | None = read_workload(req.group, req.kind, req.old_object,
                                             policy.workload_kinds)
    except MalformedObject:
        return None
    if old is None:
        return None
    return {r.name or "": r.pods for r in old.roles}


def _unpinned_cost(check: Checker, policy: CompiledPolicy, target: Target) -> Cost:
    """A role made up from resource fields: counts and maximums checked; not pinned yet,
    so charged to the tenant's default product, where its pods will be pinned."""
    counts = check_requests(check, target.containers, None)
    effective = check_maximums(check, policy, target.containers, counts)
    tenant = target.tenant
    product = tenant.default_product if tenant is not None and tenant.capped_products \
        else None
    return Cost(product, effective, weighted(policy, effective),
                shared=shared_part(policy, effective,
                                   tenant.name if tenant is not None else None))
