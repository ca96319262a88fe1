"""The validating webhook's quota step: what a decision's quota hand-off
(:class:`~webhook.engine.charge.QuotaStep`) finds against a usage store.

A workload or a dry run is checked against the usage this replica sees; a real pod
creation (or a gang workload's CREATE) is checked *inside* the store's atomic
reservation, so two pods that each fit alone can never both be admitted when together
they do not. A store that cannot commit refuses the pod, or warns where the policy fails
open on quota.
"""

from __future__ import annotations

from webhook.engine import messages
from webhook.engine.charge import Ask, Charge, QuotaStep, Validation
from webhook.engine.decision import Checker, Decision, Finding
from webhook.engine.gang import GangAsk
from webhook.engine.validate import OWNED
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode, Rule
from webhook.quota.borrow import check_borrowed, why_not_borrowed
from webhook.quota.check import UsageView, check_gang, check_pod, check_workload
from webhook.quota.gang import GANG_BOUND_SECONDS
from webhook.quota.store import BorrowStore, GangStore, ReservationUnavailable, UsageStore


async def with_quota(v: Validation, policy: CompiledPolicy, store: UsageStore | None,
                      budget: float) -> Decision:
    if v.quota is None or store is None:
        return v.decision
    findings, faults = await quota(v.quota, policy, store, budget)
    return v.decision.adding(findings, faults)


async def quota(step: QuotaStep, policy: CompiledPolicy, store: UsageStore, budget: float
                ) -> tuple[list[Finding], list[str]]:
    """The quota step's findings (and faults): checked against the store's usage, or,
    for a real pod creation, checked and reserved in one atomic step."""
    check = Checker(policy, step.tenant, step.subject, OWNED)
    if step.gang is not None:
        return await _gang(step, step.gang, check, store, budget)
    assert step.ask is not None  # a QuotaStep holds an ask or a gang
    ask = step.ask
    if step.borrowed and ask.is_pod:
        return await _borrowed(step, ask, policy, check, store, budget)
    if step.reservation is None:
        view = store.view()
        if ask.is_pod:
            check_pod(check, step.tenant, ask, view)  # a dry run: checked, not kept
        else:
            check_workload(check, step.tenant, ask, view)
        return check.findings, []

    res = step.reservation
    def fits(view: UsageView) -> bool:
        # Run on every attempt of the store's compare-and-swap loop, against fresh state:
        # only the last attempt's findings stand.
        check.findings.clear()
        if check_pod(check, step.tenant, ask, view):
            return True
        why_not_borrowed(check, policy, step.tenant, ask, view)  # a cohort tenant's
        return False

    try:
        await store.reserve(res.key, res.charge, fits, budget, name=res.name,
                            gangs=res.gangs)
    except ReservationUnavailable as exc:
        return _unavailable(check, policy, exc)
    return check.findings, []


def _unavailable(check: Checker, policy: CompiledPolicy, exc: ReservationUnavailable
                 ) -> tuple[list[Finding], list[str]]:
    """No commit could be made (the ledger unreachable, kept changing, or the cache not
    current): the pod is refused, or warned where the policy fails open on quota."""
    check.findings.clear()
    check.report(Rule.QUOTA, messages.quota_unavailable(str(exc)),
                 at_most=Mode.WARN if policy.quota_fail_open else None)
    return check.findings, ["ledger-unavailable"]


async def _borrowed(step: QuotaStep, ask: Ask, policy: CompiledPolicy, check: Checker,
                    store: UsageStore, budget: float) -> tuple[list[Finding], list[str]]:
    """A pod marked as borrowed: checked against its cohort's room (and its namespace's
    caps) and, when real, reserved in the cohort's atomic step (see quota.borrow)."""
    res = step.reservation
    if res is None:
        check_borrowed(check, policy, step.tenant, ask, store.view())  # a dry run
        return check.findings, []

    def fits(view: UsageView) -> bool:
        check.findings.clear()  # only the last attempt's findings stand
        return check_borrowed(check, policy, step.tenant, ask, view)

    try:
        if isinstance(store, BorrowStore):
            assert step.tenant.cohort is not None
            lenders = tuple(t.name for t in policy.cohorts[step.tenant.cohort.name])
            await store.reserve_borrowed(res.key, res.charge, step.tenant.cohort.name,
                                         lenders, fits, budget, name=res.name)
        else:
            await store.reserve(res.key, res.charge, fits, budget, name=res.name)
    except ReservationUnavailable as exc:
        return _unavailable(check, policy, exc)
    return check.findings, []


async def _gang(step: QuotaStep, gang: GangAsk, check: Checker, store: UsageStore,
                budget: float) -> tuple[list[Finding], list[str]]:
    """A gang workload's quota: checked; and when it is being created and its gang fits
    what is free now, its GPUs reserved whole in the same atomic step."""
    if step.gang_key is None or not isinstance(store, GangStore):
        # A dry run, an update, or a store without gang reservations: checked only, and
        # its pods are reserved one by one as they come.
        check_gang(check, step.tenant, gang, store.view())
        return check.findings, []
    charges = [(Charge(gang.tenant, gang.namespace, step.gang_owner, r.cost.product,
                       dict(r.cost.resources), r.cost.gpus, spot=r.cost.spot), n)
               for r, n in zip(gang.roles, gang.members(), strict=True)
               if n and r.cost.resources]

    def fits(view: UsageView) -> bool:
        check.findings.clear()  # only the last attempt's findings stand
        return check_gang(check, step.tenant, gang, view, reservable=True)

    try:
        await store.reserve_gang(step.gang_key, step.gang_ids, charges, fits,
                                 GANG_BOUND_SECONDS, budget)
    except ReservationUnavailable as exc:
        # The workload is only an early answer: it is checked against what this replica
        # sees and admitted without a reservation; each pod is counted when created.
        check.findings.clear()
        check_gang(check, step.tenant, gang, store.view())
        check.report(Rule.QUOTA, messages.gang_unreserved(str(exc)), at_most=Mode.WARN)
        return check.findings, ["ledger-unavailable"]
    return check.findings, []
