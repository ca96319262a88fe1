"""The validating webhook's decision on the final object: per-container and per-pod
maximums, products and topology the pod is pinned to, and (through ``quota``) the
tenant's quotas. It never returns a patch.

Rules the mutating phase owns are re-checked here only to enforce them, so a pod that
reached the API server without the mutating webhook (failurePolicy Ignore while it was
down, or a reinvocation) is still held to the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

from webhook.engine import messages
from webhook.engine.decision import Ask, Checker, Decision
from webhook.engine.gpu import check_maximums, check_requests, weighted
from webhook.engine.pinning import check_pinned
from webhook.engine.target import NamespaceLabels, Target, no_labels, prepare
from webhook.engine.tolerations import gpu_taint_tolerations
from webhook.k8s.patch import MalformedObject, child_list
from webhook.k8s.review import AdmissionRequest
from webhook.k8s.workloads import replicas
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule, TolerationPolicy

OWNED = frozenset({Rule.MAX_PER_CONTAINER, Rule.MAX_PER_POD, Rule.QUOTA})


# The quota hook: given the checker and the ask, report quota findings.
QuotaCheck = Callable[[Checker, AdmissionRequest, Ask], None]


def validate(req: AdmissionRequest, policy: CompiledPolicy,
             labels: NamespaceLabels = no_labels, quota: QuotaCheck | None = None) -> Decision:
    decision = Decision()
    target = prepare(req, policy, labels, decision)
    if target is None:
        return decision
    check = Checker(policy, target.tenant, target.subject, OWNED, decision)
    decision.subject = target.subject
    try:
        if target.has_gpu:
            _gpu_pod(check, policy, target, req, quota)
        elif policy.non_gpu_tolerations is TolerationPolicy.DENY:
            tolerations = child_list(target.template.spec, "tolerations",
                                     target.template.spec_pointer) or []
            keys = frozenset(str(t["key"]) for t in policy.tolerations if t.get("key"))
            hits = gpu_taint_tolerations(tolerations, keys)
            if hits:
                found = sorted({str(tolerations[i]["key"]) for i in hits})
                check.report(Rule.NON_GPU_TOLERATIONS, messages.tolerates_gpu_taint(found))
    except MalformedObject as exc:
        decision.allowed = False
        decision.message = f"{target.subject}: {messages.malformed(exc.pointer, exc.expected)}"
        return decision
    return check.finish()


def _gpu_pod(check: Checker, policy: CompiledPolicy, target: Target, req: AdmissionRequest,
             quota: QuotaCheck | None) -> None:
    if target.tenant is None and not policy.unassigned_allowed:
        check.report(Rule.TENANT_REQUIRED, messages.no_tenant(req.namespace, policy.name))
        return
    product, effective, gpus = pod_charge(check, policy, target)
    check.decision.gpus = gpus
    if quota is not None and target.tenant is not None and check.decision.allowed:
        assert req.object is not None
        pods = 1 if target.template.is_pod else replicas(req.group, req.kind, req.object)
        added = pods
        if req.operation == "UPDATE" and req.old_object is not None:
            with suppress(MalformedObject):  # an unreadable old object: count all pods
                added = max(0, pods - replicas(req.group, req.kind, req.old_object))
        ask = Ask(target.tenant.name, req.namespace, product, effective, gpus, pods,
                  target.template.is_pod, added, req.kind)
        check.decision.ask = ask
        quota(check, req, ask)


def pod_charge(check: Checker, policy: CompiledPolicy, target: Target
               ) -> tuple[str | None, dict[str, float], float]:
    """Check the template's GPU requests, maximums and pinning (reporting to ``check``)
    and return what one of its pods is charged: (product, devices per resource,
    GPU-equivalents)."""
    counts = check_requests(check, target.containers, None)
    effective = check_maximums(check, policy, target.containers, counts)
    product = check_pinned(check, policy, target.template)
    return product, effective, weighted(policy, effective)
