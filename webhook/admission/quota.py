"""The validating webhook's quota step: what the engine's quota hand-off (one of the
records of :mod:`webhook.engine.handoff`) finds against a usage store.

A workload or a dry run is checked against the usage this replica sees; a real pod
creation (or a gang workload's CREATE) is checked *inside* the store's atomic
reservation, so two pods that each fit alone can never both be admitted when together
they do not. A store that cannot commit refuses the pod, or warns where the policy fails
open on quota.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from webhook.admission.groups import GroupGang
from webhook.engine import messages
from webhook.engine.decision import Checker, Decision, Finding
from webhook.engine.handoff import ClaimQuota, GangQuota, PodQuota, QuotaStep, Validation
from webhook.engine.validate import OWNED
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode, Rule
from webhook.policy.tenantrules import CohortRules
from webhook.quota.borrow import check_borrowed, why_not_borrowed
from webhook.quota.budget import Spending, judge
from webhook.quota.check import UsageView, check_gang, check_group, check_pod, check_workload
from webhook.quota.decider import NotDeciding
from webhook.quota.gang import GANG_BOUND_SECONDS
from webhook.quota.store import (
    BorrowStore,
    GangStore,
    NameTaken,
    ReservationUnavailable,
    UsageStore,
)
from webhook.quota.waiting import ever_fits


async def with_quota(v: Validation, policy: CompiledPolicy, store: UsageStore | None,
                     budget: float, now: float | None = None, group: GroupGang | None = None
                     ) -> Decision:
    """The engine's decision with its quota step's findings (none without a store).
    ``now`` (unix time, the pipeline's clock) chooses the caps of a tenant's quota
    window; None: the tenant's caps outside every window. ``group``: the PodGroup gang
    to check and reserve whole before the pod (``webhook.admission.groups``)."""
    if v.quota is None or store is None:
        return v.decision
    findings, faults = await quota(at(v.quota, now), policy, store, budget, group)
    return v.decision.adding(findings, faults)


def at(step: QuotaStep, now: float | None) -> QuotaStep:
    """The step with its tenant's caps of the quota window open at ``now``: decided
    once per review, so every attempt of a commit holds the pod to the same caps."""
    if now is None or step.tenant.schedule is None:
        return step
    return replace(step, tenant=step.tenant.at(now))


Found = tuple[list[Finding], list[str]]  # the quota step's findings, and its faults


async def quota(step: QuotaStep, policy: CompiledPolicy, store: UsageStore, budget: float,
                group: GroupGang | None = None) -> Found:
    """The quota step's findings (and faults): checked against the store's usage, or,
    for a real creation, checked and reserved in one atomic step."""
    match step:
        case GangQuota():
            return await _gang(step, policy, store, budget)
        case PodQuota(borrowing=CohortRules() as cohort) if step.ask.is_pod:
            return await _borrowed(step, cohort, policy, store, budget)
        case PodQuota() if group is not None:
            return await _grouped(step, group, policy, store, budget)
        case _:
            return await _single(step, policy, store, budget)


class _Attempts:
    """The ``fits`` test a store runs on each attempt of its compare-and-swap loop,
    against the state that attempt read. Each attempt is checked by a checker of its
    own, so the findings that stand are those of the last attempt, the one that
    decided."""

    def __init__(self, policy: CompiledPolicy, step: QuotaStep,
                 test: Callable[[Checker, UsageView], bool]) -> None:
        self._policy, self._step, self._test = policy, step, test
        self.last = _checker(policy, step)

    def __call__(self, view: UsageView) -> bool:
        self.last = _checker(self._policy, self._step)
        return self._test(self.last, view)


def _checker(policy: CompiledPolicy, step: QuotaStep) -> Checker:
    return Checker(policy, step.tenant, step.subject, OWNED)


async def _single(step: PodQuota | ClaimQuota, policy: CompiledPolicy, store: UsageStore,
                  budget: float) -> Found:
    """A pod, the pods of a workload of one template, or a claim."""
    tenant, ask, res = step.tenant, step.ask, step.reservation
    if res is None:  # a dry run or a workload: checked, not kept
        check = _checker(policy, step)
        if ask.is_pod:
            check_pod(check, tenant, ask, store.view())
        else:
            check_workload(check, tenant, ask, store.view())
        return check.findings, []

    def fits(check: Checker, view: UsageView) -> bool:
        if check_pod(check, tenant, ask, view):
            return True
        why_not_borrowed(check, policy, tenant, ask, view)  # a cohort tenant's
        return False

    attempts = _Attempts(policy, step, fits)
    try:
        await store.reserve(res.key, res.charge, attempts, budget, name=res.name,
                            gangs=res.gangs)
    except ReservationUnavailable as exc:
        return _unavailable(policy, step, exc)
    except NameTaken as exc:
        return _name_taken(policy, step, exc)
    return attempts.last.findings, []


async def _grouped(step: PodQuota, group: GroupGang, policy: CompiledPolicy,
                   store: UsageStore, budget: float) -> Found:
    """A pod of a PodGroup: found by its gang's id too (a CompositePodGroup's); at its
    gang's first pod, the whole gang checked and, when it fits now, reserved in one
    atomic step; then the pod draws a slot of it as any pod of the gang. A gang refused
    refuses the pod (its findings); a gang that could not be learnt leaves the pod
    counted alone, with a warning."""
    res = step.reservation
    if res is not None and group.id not in res.gangs:
        res = replace(res, gangs=(*res.gangs, group.id))
        step = replace(step, reservation=res)
    if group.unread is not None or res is None or not isinstance(store, GangStore):
        found, faults = await _single(step, policy, store, budget)
        check = _checker(policy, step)
        check.report(Rule.QUOTA, messages.group_unread(group.name, group.unread or ""),
                     at_most=Mode.WARN)
        return [*found, *check.findings], faults
    if group.size > 1:
        tenant, ask = step.tenant, step.ask
        attempts = _Attempts(policy, step, lambda check, view: check_group(
            check, tenant, ask, group.name, group.size, view, group.composite))
        try:
            # The slots are the gang's until its pods take them (each then its own).
            slot = replace(res.charge, owner=group.owner)
            reserved = await store.reserve_gang(group.key, (group.id,), [(slot, group.size)],
                                                attempts, GANG_BOUND_SECONDS, budget)
        except ReservationUnavailable as exc:
            return _unavailable(policy, step, exc)
        if not reserved:
            return attempts.last.findings, []
    return await _single(step, policy, store, budget)


def waiting(step: PodQuota, policy: CompiledPolicy) -> Found:
    """A pod created behind the quota gate: checked against the caps alone (a pod that
    could never fit is refused), not charged; its charge is committed on release."""
    check = _checker(policy, step)
    ever_fits(check, policy, step)
    return check.findings, []


def _unavailable(policy: CompiledPolicy, step: QuotaStep, exc: ReservationUnavailable
                 ) -> Found:
    """No commit could be made (the ledger unreachable, kept changing, or the cache not
    current): the pod is refused, or warned where the policy fails open on quota."""
    check = _checker(policy, step)
    text = (messages.quota_not_decided(str(exc)) if isinstance(exc, NotDeciding)
            else messages.quota_unavailable(str(exc)))
    check.report(Rule.QUOTA, text, at_most=Mode.WARN if policy.quota_fail_open else None)
    return check.findings, ["ledger-unavailable"]


def _name_taken(policy: CompiledPolicy, step: QuotaStep, exc: NameTaken) -> Found:
    """Another pod holds the name: the create would fail (AlreadyExists) after this
    review; refusing it here keeps nothing that could hold GPUs once that pod goes."""
    check = _checker(policy, step)
    check.report(Rule.QUOTA, messages.name_taken(exc.name))
    return check.findings, []


async def _borrowed(step: PodQuota, cohort: CohortRules, policy: CompiledPolicy,
                    store: UsageStore, budget: float) -> Found:
    """A pod marked as borrowed: checked against its cohort's room (and its namespace's
    caps) and, when real, reserved in the cohort's atomic step (see quota.borrow)."""
    tenant, ask, res = step.tenant, step.ask, step.reservation
    attempts = _Attempts(policy, step,
                         lambda check, view: check_borrowed(check, policy, tenant, ask, view))
    if res is None:  # a dry run
        attempts(store.view())
        return attempts.last.findings, []
    try:
        if isinstance(store, BorrowStore):
            lenders = tuple(t.name for t in policy.cohorts[cohort.name])
            await store.reserve_borrowed(res.key, res.charge, cohort.name, lenders,
                                         attempts, budget, name=res.name)
        else:
            await store.reserve(res.key, res.charge, attempts, budget, name=res.name)
    except ReservationUnavailable as exc:
        return _unavailable(policy, step, exc)
    except NameTaken as exc:
        return _name_taken(policy, step, exc)
    return attempts.last.findings, []


async def _gang(step: GangQuota, policy: CompiledPolicy, store: UsageStore, budget: float
                ) -> Found:
    """A gang workload's quota: checked; and when it is being created and its gang fits
    what is free now, its GPUs reserved whole in the same atomic step."""
    tenant, gang, res = step.tenant, step.gang, step.reservation
    if res is None or not isinstance(store, GangStore):
        # A dry run, an update, or a store without gang reservations: checked only, and
        # its pods are reserved one by one as they come.
        check = _checker(policy, step)
        check_gang(check, tenant, gang, store.view())
        return check.findings, []
    charges = [(r.cost.charge(gang.tenant, gang.namespace, res.owner), n)
               for r, n in zip(gang.roles, gang.members(), strict=True)
               if n and r.cost.resources]
    attempts = _Attempts(policy, step, lambda check, view: check_gang(
        check, tenant, gang, view, reservable=True))
    try:
        await store.reserve_gang(res.key, res.ids, charges, attempts, GANG_BOUND_SECONDS,
                                 budget)
    except ReservationUnavailable as exc:
        # The workload is only an early answer: it is checked against what this replica
        # sees and admitted without a reservation; each pod is counted when created.
        check = _checker(policy, step)
        check_gang(check, tenant, gang, store.view())
        check.report(Rule.QUOTA, messages.gang_unreserved(str(exc)), at_most=Mode.WARN)
        return check.findings, ["ledger-unavailable"]
    return attempts.last.findings, []


def budget_findings(step: QuotaStep | None, policy: CompiledPolicy, spent: Spending
                    ) -> list[Finding]:
    """A GPU pod whose tenant (or user) has spent its GPU-hours: refused (a pod of a
    tenant that waits for them reaches here gated, and is not refused; a dry run is)."""
    if not isinstance(step, PodQuota) or not step.ask.is_pod or step.tenant.budget is None:
        return []
    verdict = judge(step.tenant, step.ask.user, spent, spent.at)
    if verdict.reason is None:
        return []
    check = _checker(policy, step)
    check.report(Rule.QUOTA, verdict.reason)
    return check.findings


def with_budget_warnings(d: Decision, step: QuotaStep | None, spent: Spending) -> Decision:
    """An admitted GPU pod's decision with the warnings of its budget's thresholds."""
    if (not d.allowed or not isinstance(step, PodQuota) or not step.ask.is_pod
            or step.tenant.budget is None):
        return d
    warnings = judge(step.tenant, step.ask.user, spent, spent.at).warnings
    return replace(d, warnings=[*d.warnings, *warnings]) if warnings else d
