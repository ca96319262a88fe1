"""The first step both webhooks share: is this request ours, and what does it hold?

It decides the cheap cases (other kinds, DELETE, exempt users and namespaces, pods with
no GPU) before any rule runs, and otherwise finds the pod template, its GPU containers
and the tenant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from webhook.engine import messages
from webhook.engine.decision import Decision, subject_of
from webhook.k8s.patch import MalformedObject
from webhook.k8s.resources import ContainerGPUs, gpu_containers
from webhook.k8s.review import AdmissionRequest
from webhook.k8s.workloads import PodTemplate, pod_template
from webhook.policy.compiled import CompiledPolicy, TenantRules

NamespaceLabels = Callable[[str], Mapping[str, str] | None]


def no_labels(namespace: str) -> Mapping[str, str] | None:
    return None


@dataclass(slots=True)
class Target:
    template: PodTemplate
    containers: list[ContainerGPUs]
    has_gpu: bool
    tenant: TenantRules | None
    subject: str


def prepare(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels,
            decision: Decision) -> Target | None:
    """The request's pod template, or None when no rule applies (``decision.skipped`` says
    why, or ``decision`` is already a denial for a malformed object)."""
    if req.sub_resource:
        decision.skipped = "subresource"
        return None
    if req.kind == "Pod" and req.group == "":
        if req.operation != "CREATE":
            decision.skipped = "operation"  # a pod's resources and placement are immutable
            return None
    elif req.operation not in ("CREATE", "UPDATE"):
        decision.skipped = "operation"
        return None
    obj = req.object
    if obj is None:
        decision.skipped = "operation"
        return None
    if policy.is_exempt(req.namespace, req.username, req.groups):
        decision.skipped = "exempt"
        return None
    subject = subject_of(req.kind, req.namespace, obj, req.name)
    try:
        template = pod_template(req.group, req.kind, obj)
        if template is None:
            decision.skipped = "kind"
            return None
        containers = gpu_containers(template.spec, template.spec_pointer, policy.is_gpu)
    except MalformedObject as exc:
        # Fail closed with a clear reason: the API server would refuse this object anyway.
        decision.allowed = False
        decision.message = f"{subject}: {messages.malformed(exc.pointer, exc.expected)}"
        return None
    has_gpu = any(c.names for c in containers)
    tenant = policy.tenant_for(req.namespace, labels(req.namespace)) if req.namespace else None
    decision.tenant = tenant.name if tenant else None
    return Target(template, containers, has_gpu, tenant, subject)
