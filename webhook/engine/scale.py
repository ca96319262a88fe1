"""The ``scale`` subresource (``kubectl scale``, a HorizontalPodAutoscaler): the pods a
scale-up adds, checked against quota as a workload UPDATE is.

A Scale object carries replica counts and nothing else, so the check needs the pod
template of the workload it scales, which only the API server has. This module stays
pure and splits the decision around that read, done by an adapter:

1. :func:`scale_up` decides from the request alone: anything but a scale-up of a
   Deployment, StatefulSet or ReplicaSet in a namespace whose tenant has a quota is
   answered here, with no read (scaling down or to the same count is always allowed);
2. :func:`check_scale` decides on the workload read: its pod template is charged as for
   a workload UPDATE (``replicas`` = the new count, pods added = new - old), and the
   quota step it returns reports a gang that can never fit (denied) or does not fit the
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
from webhook.engine.charge import pod_cost
from webhook.engine.cost import Ask
from webhook.engine.decision import Checker, Decision, Quiet, malformed
from webhook.engine.handoff import PodQuota, Validation
from webhook.engine.target import NamespaceLabels, read_target
from webhook.engine.users import recorded
from webhook.engine.validate import OWNED
from webhook.k8s.objects import MalformedObject
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode, Rule
from webhook.policy.tenantrules import TenantRules

# Resources of the apps group whose scale subresource is checked, and their kinds.
SCALABLE: dict[str, str] = {
    "deployments": "Deployment",
    "statefulsets": "StatefulSet",
    "replicasets": "ReplicaSet",
}


@dataclass(frozen=True, slots=True)
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


def scale_up(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels
             ) -> ScaleUp | Decision:
    """The scale-up to check, or the final decision when the request is answered without
    reading the workload (skipped, saying why, or the denial of a malformed Scale)."""
    kind = SCALABLE.get(req.resource) if req.resource_group == "apps" else None
    if req.sub_resource != "scale" or kind is None:
        return Decision.skip("subresource")
    if req.operation != "UPDATE" or req.object is None:
        return Decision.skip("operation")
    if policy.is_exempt(req.namespace, req.username, req.groups):
        return Decision.skip("exempt")
    try:
        new = scale_replicas(req.object)
        # Without the old Scale (the API server always sends it) every pod counts as added.
        old = scale_replicas(req.old_object) if req.old_object is not None else 0
    except MalformedObject as exc:
        return malformed(f"{kind.lower()} {req.namespace}/{req.name}, scale", exc)
    if new <= old:
        return Decision.skip("scale-down")
    tenant = policy.tenant_for(req.namespace, labels(req.namespace)) if req.namespace else None
    if tenant is None or not tenant.has_quota:
        return Decision.skip("no-quota", tenant.name if tenant else None)
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


def check_scale(up: ScaleUp, workload: dict[str, Any], policy: CompiledPolicy,
                labels: NamespaceLabels) -> Validation:
    """Decide a scale-up on the workload read from the API server: the quota step for
    the pods it adds, or the final decision when there is nothing to check."""
    tenant = up.tenant.name
    try:
        # The pod template is found, and the tenant resolved, exactly as when the
        # workload is applied.
        target = read_target("apps", up.kind, up.namespace, workload, up.subject, policy,
                             labels)
        if target is None:
            return Validation(Decision.skip("kind", tenant))
        if not target.has_gpu or target.tenant is None:
            return Validation(Decision.skip(
                "no-gpu" if not target.has_gpu else "no-quota", tenant))
        # The template's own rules are not this request's business (see the module's
        # docstring): their findings are dropped.
        cost = pod_cost(Quiet(policy, target.tenant, up.subject, OWNED), policy, target)
    except MalformedObject as exc:
        # A stored object we cannot read: say so, do not deny.
        return Validation(unchecked_scale(
            up, policy, messages.malformed(exc.pointer, exc.expected).rstrip(".")))
    # The user its CREATE recorded on its template: whose cap the pods added count to.
    user = (recorded(target.template.metadata) if target.tenant.user_quota is not None
            else None)
    ask = Ask(tenant=target.tenant.name, namespace=up.namespace, cost=cost, pods=up.new,
              is_pod=False, pods_added=up.new - up.old, kind=up.kind, user=user)
    return Validation(Decision(tenant=target.tenant.name),
                      PodQuota(tenant=target.tenant, subject=up.subject, ask=ask))


def unchecked_scale(up: ScaleUp, policy: CompiledPolicy, reason: str) -> Decision:
    """Allowed, with a warning (rule quota, at most warn) saying why it was not checked."""
    check = Checker(policy, up.tenant, up.subject, OWNED)
    check.report(Rule.QUOTA, messages.scale_unchecked(up.kind, reason), at_most=Mode.WARN)
    return check.decide()
