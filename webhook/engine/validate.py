"""The validating webhook's decision on the final object: per-container and per-pod
maximums, products and topology the pod is pinned to, and what quota must check. It
never returns a patch.

Rules the mutating phase owns are re-checked here only to enforce them, so a pod that
reached the API server without the mutating webhook (failurePolicy Ignore while it was
down, or a reinvocation) is still held to the policy.

Quota needs the usage store, which the engine does not touch: :func:`validate` returns
the decision of every other rule and, when that allows the object and its tenant has a
quota, a :class:`QuotaStep` saying what to check (and for a real pod creation, what to
reserve atomically). The admission pipeline (``webhook.admission``) runs it.
"""

from __future__ import annotations

from contextlib import suppress

from webhook.engine import claims as claims_engine
from webhook.engine import messages
from webhook.engine.charge import (
    Ask,
    Charge,
    QuotaStep,
    Reservation,
    Validation,
    owner_of,
    pod_cost,
    unknown_templates,
)
from webhook.engine.claims import is_claim
from webhook.engine.decision import Checker, Decision, malformed
from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.target import NamespaceLabels, Target, no_labels, prepare
from webhook.engine.tolerations import gpu_taint_tolerations
from webhook.k8s.objects import MalformedObject, child_list
from webhook.k8s.review import AdmissionRequest
from webhook.k8s.workloads import replicas
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule, TolerationPolicy

OWNED = frozenset({Rule.MAX_PER_CONTAINER, Rule.MAX_PER_POD, Rule.QUOTA, Rule.UNKNOWN_CLAIM})


def validate(req: AdmissionRequest, policy: CompiledPolicy,
             labels: NamespaceLabels = no_labels, claims: ClaimLookup = no_claims
             ) -> Validation:
    if is_claim(req):
        return claims_engine.validate(req, policy, labels)
    target = prepare(req, policy, labels, claims)
    if isinstance(target, Decision):
        return Validation(target)
    check = Checker(policy, target.tenant, target.subject, OWNED)
    try:
        quota = None
        unknown_templates(check, target)
        if target.has_gpu:
            quota = _gpu_pod(check, policy, target, req)
        elif policy.non_gpu_tolerations is TolerationPolicy.DENY and not target.claims:
            _tolerates_gpu_taints(check, policy, target)
    except MalformedObject as exc:
        return Validation(malformed(target.subject, exc))
    return Validation(check.decide(), quota)


def _gpu_pod(check: Checker, policy: CompiledPolicy, target: Target, req: AdmissionRequest
             ) -> QuotaStep | None:
    tenant = target.tenant
    if tenant is None and not policy.unassigned_allowed:
        check.report(Rule.TENANT_REQUIRED, messages.no_tenant(req.namespace, policy.name))
        return None
    cost = pod_cost(check, policy, target)
    if tenant is None or check.denied or (tenant.quota is None and not tenant.namespace_quota):
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
    ask = Ask(tenant.name, req.namespace, cost, pods, target.template.is_pod, added, req.kind)
    reservation = None
    if target.template.is_pod and not req.dry_run:  # a dry run must leave no trace
        meta = req.object.get("metadata") or {}
        key = str(meta.get("uid") or f"{req.namespace}/{meta.get('name') or req.name}")
        reservation = Reservation(key, Charge(tenant.name, req.namespace, owner_of(req.object),
                                              cost.product, dict(cost.resources), cost.gpus))
    return QuotaStep(tenant, target.subject, ask, reservation)


def _tolerates_gpu_taints(check: Checker, policy: CompiledPolicy, target: Target) -> None:
    tolerations = child_list(target.template.spec, "tolerations",
                             target.template.spec_pointer) or []
    keys = frozenset(str(t["key"]) for t in policy.tolerations if t.get("key"))
    hits = gpu_taint_tolerations(tolerations, keys)
    if hits:
        found = sorted({str(tolerations[i]["key"]) for i in hits})
        check.report(Rule.NON_GPU_TOLERATIONS, messages.tolerates_gpu_taint(found))
