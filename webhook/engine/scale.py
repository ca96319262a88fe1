"""The ``scale`` subresource (``kubectl scale``, a HorizontalPodAutoscaler): the pods a
scale-up adds, checked against quota as a workload UPDATE is.

A Scale object carries replica counts and nothing else, so the check needs the pod
template of the workload it scales, which only the API server has. This module stays
pure and splits the decision around that read, done by an adapter:

1. :func:`scale_up` decides from the request alone: anything but a scale-up of a
   Deployment, StatefulSet or ReplicaSet in a namespace whose tenant has a quota is
   answered here, with no read (scaling down or to the same count is always allowed);
2. :func:`check_scale` decides on the workload read: its pod template is charged as for
   a workload UPDATE (``replicas`` = the new count, pods added = new - old) and the
   engine's quota hook reports a gang that can never fit (denied) or does not fit the
   free quota now (a warning);
3. :func:`unchecked_scale` is the answer when the workload could not be read: allowed,
   with a warning that says why it was not checked. Quota itself still holds: every pod
   is checked and committed when it is created. Failing closed would block scaling, of
   workloads without GPUs too (nothing tells them apart without the read), for a check
   that is only an early answer.

Only the quota rule is reported: the template's other rules were checked when it was
applied, and each pod is checked again when it is created (a template stored before the
webhook was installed is unpinned, yet its pods are pinned by the mutating webhook).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.engine import messages
from webhook.engine.decision import Ask, Checker, Decision
from webhook.engine.target import NamespaceLabels, prepare
from webhook.engine.validate import OWNED, QuotaCheck, pod_charge
from webhook.k8s.patch import MalformedObject
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy, TenantRules
from webhook.policy.model import Mode, Rule

# Resources of the apps group whose scale subresource is checked, and their kinds.
SCALABLE: dict[str, str] = {
    "deployments": "Deployment",
    "statefulsets": "StatefulSet",
    "replicasets": "ReplicaSet",
}


@dataclass(slots=True)
class ScaleUp:
    """A scale-up that needs the workload's pod template to be checked."""

    resource: str  # deployments, statefulsets, replicasets
    kind: str  # Deployment, ...
    namespace: str
    name: str
    old: int  # replicas before
    new: int  # replicas asked for (> old)
    tenant: TenantRules  # the namespace's tenant (it has a quota)

    @property
    def subject(self) -> str:
        return (f"{self.kind.lower()} {self.namespace}/{self.name}, scaled from {self.old} "
                f"to {self.new} replicas")


def scale_up(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels,
             decision: Decision) -> ScaleUp | None:
    """The scale-up to check, or None when the request is answered without reading the
    workload (``decision.skipped`` says why, or ``decision`` is a denial of a malformed
    Scale)."""
    kind = SCALABLE.get(req.resource) if req.resource_group == "apps" else None
    if req.sub_resource != "scale" or kind is None:
        decision.skipped = "subresource"
        return None
    if req.operation != "UPDATE" or req.object is None:
        decision.skipped = "operation"
        return None
    if policy.is_exempt(req.namespace, req.username, req.groups):
        decision.skipped = "exempt"
        return None
    try:
        new = scale_replicas(req.object)
        # Without the old Scale (the API server always sends it) every pod counts as added.
        old = scale_replicas(req.old_object) if req.old_object is not None else 0
    except MalformedObject as exc:
        decision.allowed = False
        decision.message = (f"{kind.lower()} {req.namespace}/{req.name}, scale: "
                            f"{messages.malformed(exc.pointer, exc.expected)}")
        return None
    if new <= old:
        decision.skipped = "scale-down"
        return None
    tenant = policy.tenant_for(req.namespace, labels(req.namespace)) if req.namespace else None
    decision.tenant = tenant.name if tenant else None
    if tenant is None or (tenant.quota is None and not tenant.namespace_quota):
        decision.skipped = "no-quota"
        return None
    return ScaleUp(req.resource, kind, req.namespace, req.name, old, new, tenant)


def scale_replicas(scale: dict[str, Any]) -> int:
    """``spec.replicas`` of a Scale object (absent means 0: the field is omitted when
    empty)."""
    spec = scale.get("spec")
    if spec is None:
        return 0
    if not isinstance(spec, dict):
        raise MalformedObject("/spec", "an object")
    value = spec.get("replicas", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedObject("/spec/replicas", "a non-negative integer")
    return value


def check_scale(req: AdmissionRequest, up: ScaleUp, workload: dict[str, Any],
                policy: CompiledPolicy, labels: NamespaceLabels,
                quota: QuotaCheck | None) -> Decision:
    """Decide a scale-up on the workload read from the API server."""
    decision = Decision(subject=up.subject, tenant=up.tenant.name)
    # The workload as an UPDATE of itself, so the pod template is found, and the tenant
    # resolved, exactly as when the workload is applied.
    as_update = AdmissionRequest(
        uid=req.uid, group="apps", version="v1", kind=up.kind, operation="UPDATE",
        namespace=up.namespace, name=up.name, object=workload, username=req.username,
        groups=req.groups, dry_run=req.dry_run, api_version=req.api_version)
    target = prepare(as_update, policy, labels, decision)
    if target is None:
        if not decision.allowed:  # a stored object we cannot read: say so, do not deny
            reason = decision.message.split(": ", 1)[-1].rstrip(".")
            return unchecked_scale(up, policy, reason)
        return decision
    tenant = target.tenant
    if not target.has_gpu or tenant is None:
        decision.skipped = "no-gpu" if not target.has_gpu else "no-quota"
        return decision
    # The template's own rules are not this request's business (see the module's
    # docstring): their findings go to a scratch decision and are dropped.
    scratch = Checker(policy, tenant, up.subject, OWNED, Decision())
    try:
        product, effective, gpus = pod_charge(scratch, policy, target)
    except MalformedObject as exc:
        return unchecked_scale(up, policy, messages.malformed(exc.pointer, exc.expected)
                               .rstrip("."))
    decision.gpus = gpus
    check = Checker(policy, tenant, up.subject, OWNED, decision)
    ask = Ask(tenant.name, up.namespace, product, effective, gpus, up.new, False,
              up.new - up.old, up.kind)
    decision.ask = ask
    if quota is not None:
        quota(check, as_update, ask)
    return check.finish()


def unchecked_scale(up: ScaleUp, policy: CompiledPolicy, reason: str) -> Decision:
    """Allowed, with a warning (rule quota, at most warn) saying why it was not checked."""
    decision = Decision(subject=up.subject, tenant=up.tenant.name)
    check = Checker(policy, up.tenant, up.subject, OWNED, decision)
    check.report(Rule.QUOTA, messages.scale_unchecked(up.kind, reason), at_most=Mode.WARN)
    return check.finish()
