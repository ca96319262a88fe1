"""Waiting for quota, as the admission pipeline asks it (pure: no I/O).

Two moments, as for borrowing (``webhook.quota.borrow``):

* the **mutating** webhook (:func:`wait_on_mutate`): in a tenant with ``overQuota:
  wait``, a real (not dry-run) pod creation that does not fit what this replica sees
  free, but would fit the tenant's caps were nothing else running, is given our
  scheduling gate and the annotation saying why (``webhook.engine.waiting``). Only a
  CREATE can add a gate, so only the mutating webhook can decide it. A pod of a gang
  (a training workload's, found by its controller's label, or a Job's) is always gated
  unless it draws a slot of its gang's reservation: its gang's size is the workload's,
  which the pod does not carry, so the leader reads it and releases the gang's pods
  together; a pod alone that fits is never gated, nor one marked as borrowed; one that
  its tenant's own quota can never hold but its cohort could lend (a pod alone) is
  marked as borrowed *and* gated, to wait for GPUs to borrow (its PriorityClass can be
  set only at its creation); any other that can never fit is left to the validating
  webhook, which refuses it;
* the **validating** webhook (:func:`ever_fits`): a pod carrying our gate is checked
  against the caps alone (a marked one against what its cohort could lend), not the
  usage, and is not charged. Its charge is committed
  when the leader replica releases it (``webhook.server.leading.release``).

The mutating webhook's answer is a forecast on this replica's view: a pod gated while
GPUs were being freed waits one release round; a pod not gated whose GPUs were taken
meanwhile is refused by the validating webhook's commit, as in ``deny``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from webhook.engine import messages
from webhook.engine.borrowed import is_marked, mark
from webhook.engine.cost import Charge
from webhook.engine.decision import Checker, Decision, Quiet
from webhook.engine.handoff import PodAsk, PodQuota
from webhook.engine.target import NamespaceLabels
from webhook.engine.validate import OWNED
from webhook.engine.waiting import REASON, gate, is_gated
from webhook.k8s.patch import Patch
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.tenantrules import TenantRules
from webhook.quota.borrow import check_borrowed
from webhook.quota.budget import Spending, judge
from webhook.quota.check import EPSILON, UsageView, check_pod, lines
from webhook.quota.line import gang_of
from webhook.quota.store import Combined
from webhook.quota.usage import Usage

# (the gangs a pod may belong to, its charge) -> whether a gang reservation holds a free
# slot of its shape for it (it is then admitted from the slot, never gated).
SlotLookup = Callable[[tuple[str, ...], Charge], bool]


def _no_slots(gangs: tuple[str, ...], charge: Charge) -> bool:
    return False


def nothing_used() -> UsageView:
    """Usage with nothing running: what "can it ever fit" is asked against."""
    return Combined(Usage(), Usage())


def wait_on_mutate(req: AdmissionRequest, policy: CompiledPolicy, d: Decision,
                   usage: UsageView, labels: NamespaceLabels, asked: PodAsk,
                   has_slot: SlotLookup = _no_slots, spent: Spending | None = None
                   ) -> Decision:
    """The mutating webhook's decision ``d``, with the pod gated (and a warning saying
    why) when its tenant waits and it does not fit now but can. ``asked``: what the pod
    asks of its tenant's quota, at the caps of the quota window open now (the validating
    webhook's, so a pod it would refuse waits), computed once by the pipeline. A pod of
    a tenant that waits for GPU-hours (``budget.onExhausted: wait``) whose budget (or
    its user's) is ``spent`` is gated too, with the budget's numbers."""
    obj = req.object
    if (not d.allowed or req.kind != "Pod" or req.operation != "CREATE" or req.sub_resource
            or req.dry_run or not isinstance(obj, dict)):
        return d
    owner = policy.tenant_for(req.namespace, labels(req.namespace))
    for_hours = owner is not None and owner.budget is not None and owner.budget.waits
    if owner is None or not (owner.waits or for_hours):
        return d  # the usual case, decided without looking further
    if "borrowed" in d.mutations or is_marked(obj) or is_gated(obj):
        return d
    step = asked()  # on the mutated pod
    if step is not None and for_hours and spent is not None:
        why = judge(step.tenant, step.ask.user, spent, spent.at, gate=True).reason
        if why is not None:
            return _gated(obj, why, d)
    if step is None or step.borrowing is not None or not owner.waits:
        return d
    tenant, ask = step.tenant, step.ask
    # A gang's pod cannot tell how many pods its workload runs at once: it goes through
    # the line, where the leader releases its gang's pods together when they all fit, so
    # no part of a gang takes GPUs the rest of it then waits for.
    gang = gang_of(obj)
    if gang is None and check_pod(Quiet(policy, tenant, "", OWNED), tenant, ask, usage):
        return d  # room now: admitted and charged as any pod
    res = step.reservation
    if res is not None and res.gangs and has_slot(res.gangs, res.charge):
        return d  # its gang's reservation holds its GPUs
    if not check_pod(Quiet(policy, tenant, "", OWNED), tenant, ask, nothing_used()):
        if gang is None and tenant.cohort is not None and check_borrowed(
                Quiet(policy, tenant, "", OWNED), policy, tenant, ask, nothing_used()):
            return _to_borrow(obj, tenant, ask.gpus, d)
        return d  # can never fit: the validating webhook refuses it with the numbers
    broken = [x for x in lines(tenant, ask, usage) if x.used + x.per_pod > x.cap + EPSILON]
    if broken:
        line = min(reversed(broken), key=lambda x: x.free() / x.per_pod if x.per_pod else 0.0)
        reason = messages.waits_for_quota(line.per_pod, line.what, line.free(), line.cap,
                                          line.scope)
    else:
        reason = messages.gang_pod_in_line(ask.gpus, tenant.name,
                                           "a Job" if gang is None or gang.is_job
                                           else gang.named())
    return _gated(obj, reason, d)


def _gated(obj: dict[str, Any], reason: str, d: Decision) -> Decision:
    """``d`` with the pod behind our gate, and the warning saying why."""
    patch = Patch()
    gate(obj, reason, patch)
    return replace(d, patch=[*d.patch, *patch.ops], warnings=[*d.warnings, reason],
                   mutations=[*d.mutations, "waiting"])


def _to_borrow(obj: dict[str, Any], tenant: TenantRules, gpus: float, d: Decision
               ) -> Decision:
    """A pod alone that only borrowed GPUs can ever hold (more than its tenant's own
    quota, within what its cohort could lend): marked as borrowed now (its PriorityClass
    can be set only at creation) and gated; the leader releases it onto GPUs the cohort
    lends, committed as admission commits a borrowed pod."""
    assert tenant.cohort is not None and tenant.quota is not None
    patch = Patch()
    mark(obj, tenant.cohort.priority, patch)
    reason = messages.waits_to_borrow(gpus, tenant.name, tenant.quota.gpus or 0.0,
                                      tenant.cohort.name, tenant.cohort.priority.name)
    gate(obj, reason, patch)
    return replace(d, patch=[*d.patch, *patch.ops], warnings=[*d.warnings, reason],
                   mutations=[*d.mutations, "borrowed", "waiting"])


def ever_fits(check: Checker, policy: CompiledPolicy, step: PodQuota) -> bool:
    """A gated pod at the validating webhook: within every cap with nothing else
    running, or, marked as borrowed, within what its cohort could lend with nothing
    borrowed (else it could never start: refused, with the numbers). Not charged."""
    if step.borrowing is not None:
        return check_borrowed(check, policy, step.tenant, step.ask, nothing_used())
    return check_pod(check, step.tenant, step.ask, nothing_used())


__all__ = ["REASON", "SlotLookup", "ever_fits", "nothing_used", "wait_on_mutate"]
