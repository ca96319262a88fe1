"""Borrowing in a cohort, as the admission pipeline asks it (pure: no I/O).

Two moments:

* the **mutating** webhook (:func:`borrow_on_mutate`): a pod of a cohort tenant that
  does not fit its tenant's own caps now, but fits what the cohort leaves idle, is
  marked as borrowed (``webhook.engine.borrowed.mark``) and told so in a warning. A pod
  that fits its own quota is never marked; one that fits neither is left to the
  validating webhook, which refuses it on its own quota;
* the **validating** webhook (:func:`check_borrowed`): a marked pod is checked against
  the cohort's room (``webhook.quota.cohort``) and its namespace's caps, in the store's
  atomic step, instead of its tenant's own caps.

The mutating webhook's answer is a forecast made on this replica's view; the validating
webhook's commit decides. A pod marked by the first and fitting its own quota by the
second still runs as borrowed (it is preemptible, which is never unsafe); a pod not
marked that no longer fits its own quota is refused, as any pod.
"""

from __future__ import annotations

from dataclasses import replace

from webhook.engine import messages
from webhook.engine.borrowed import account, is_marked, mark
from webhook.engine.cost import Ask
from webhook.engine.decision import Checker, Decision, Quiet
from webhook.engine.handoff import PodAsk
from webhook.engine.target import NamespaceLabels
from webhook.engine.validate import OWNED
from webhook.k8s.patch import Patch
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule
from webhook.policy.tenantrules import TenantRules
from webhook.quota.check import EPSILON, UsageView, check_pod, lines
from webhook.quota.cohort import Member, members, room


def cohort_members(policy: CompiledPolicy, tenant: TenantRules, usage: UsageView
                   ) -> list[Member]:
    """The tenant's cohort as the arithmetic sees it: each member's own and borrowed use."""
    assert tenant.cohort is not None
    cohort = policy.cohorts.get(tenant.cohort.name, ())
    spec = [(t.name, t.quota.gpus if t.quota and t.quota.gpus is not None else 0.0,
             t.cohort.borrowing_limit if t.cohort else 0.0,
             t.cohort.lending_limit if t.cohort else 0.0) for t in cohort]
    return members(spec, {t.name: usage.tenant(t.name) for t in cohort},
                   {t.name: usage.tenant(account(t.name)) for t in cohort})


def check_borrowed(check: Checker, policy: CompiledPolicy, tenant: TenantRules, ask: Ask,
                   usage: UsageView) -> bool:
    """A pod on borrowed GPUs: within its namespace's caps (they bind borrowed pods as
    any), and within what its cohort may lend it now. True when it fits."""
    assert tenant.cohort is not None
    fits = True
    for line in lines(tenant, ask, usage):
        if line.holders[0] != "namespace":
            continue  # the tenant-wide caps are what borrowing goes beyond
        if line.used + line.per_pod > line.cap + EPSILON:
            fits = False
            check.report(Rule.QUOTA, messages.quota_exceeded(
                line.scope, line.what, line.used, line.per_pod, line.cap,
                usage.top_owners(line.holders), "this pod asks", []))
    r = room(cohort_members(policy, tenant, usage), tenant.name)
    if ask.gpus > r.free + EPSILON:
        fits = False
        left = {"borrowingLimit": r.limit_left, "lenders": r.others_lend,
                "cohort": r.cohort_left}[r.bound]
        check.report(Rule.QUOTA, messages.borrow_refused(
            tenant.name, tenant.cohort.name, ask.gpus, r.bound, left,
            tenant.cohort.borrowing_limit))
    return fits


def why_not_borrowed(check: Checker, policy: CompiledPolicy, tenant: TenantRules, ask: Ask,
                     usage: UsageView) -> None:
    """For a cohort tenant's pod refused on its own quota: what its cohort can lend now
    (a sentence with the refusal, so the developer knows whether to retry)."""
    if tenant.cohort is None:
        return
    r = room(cohort_members(policy, tenant, usage), tenant.name)
    left = {"borrowingLimit": r.limit_left, "lenders": r.others_lend,
            "cohort": r.cohort_left}[r.bound]
    check.report(Rule.QUOTA, messages.not_borrowed(
        tenant.cohort.name, ask.gpus, r.free, r.bound, left, tenant.cohort.borrowing_limit))


def borrow_on_mutate(req: AdmissionRequest, policy: CompiledPolicy, d: Decision,
                     usage: UsageView, labels: NamespaceLabels, asked: PodAsk) -> Decision:
    """The mutating webhook's decision ``d``, with the pod marked as borrowed when it
    fits only on its cohort's idle GPUs (or was marked already), and a warning saying so.
    ``asked``: what the pod asks of its tenant's quota (the pipeline's, computed once)."""
    obj = req.object
    if (not d.allowed or req.kind != "Pod" or req.operation != "CREATE" or req.sub_resource
            or not isinstance(obj, dict)):
        return d
    owner = policy.tenant_for(req.namespace, labels(req.namespace))
    if owner is None or owner.cohort is None:
        return d  # the usual case, decided without looking further
    patch = Patch()
    marked = is_marked(obj)
    if marked:  # labelled by hand (or a reinvocation): its priority is the class's
        mark(obj, owner.cohort.priority, patch)
    step = asked()  # on the pod as mutated, marked included
    if step is None:
        return d if not patch else replace(d, patch=[*d.patch, *patch.ops])
    tenant, ask = step.tenant, step.ask
    if tenant.cohort is None or tenant.quota is None or tenant.quota.gpus is None:
        return d
    if not marked:
        quiet = Quiet(policy, tenant, "", OWNED)
        if check_pod(quiet, tenant, ask, usage):
            return d  # its own quota has room: never borrowed
        if not check_borrowed(Quiet(policy, tenant, "", OWNED), policy, tenant, ask, usage):
            return d  # no room either way: the validating webhook refuses it
        mark(obj, tenant.cohort.priority, patch)
    own = usage.tenant(tenant.name).gpus
    warning = messages.borrowed(tenant.name, tenant.cohort.name, ask.gpus, own,
                                tenant.quota.gpus, tenant.cohort.priority.name)
    return replace(d, patch=[*d.patch, *patch.ops], warnings=[*d.warnings, warning],
                   mutations=[*d.mutations, "borrowed"])
