"""The first step both webhooks share: is this request ours, and what does it hold?

It decides the cheap cases (other kinds, DELETE, exempt users and namespaces) before
any rule runs, and otherwise finds the pod template, its GPU containers and the tenant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.engine.decision import Decision, malformed, subject_of
from webhook.k8s.objects import MalformedObject
from webhook.k8s.resources import ContainerGPUs, gpu_containers
from webhook.k8s.review import AdmissionRequest
from webhook.k8s.workloads import PodTemplate, pod_template
from webhook.policy.compiled import CompiledPolicy, TenantRules

NamespaceLabels = Callable[[str], Mapping[str, str] | None]


def no_labels(namespace: str) -> Mapping[str, str] | None:
    return None


@dataclass(frozen=True, slots=True)
class Target:
    template: PodTemplate
    containers: list[ContainerGPUs]
    has_gpu: bool
    tenant: TenantRules | None
    subject: str


def prepare(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels
            ) -> Target | Decision:
    """The request's pod template, or the final decision when no rule applies (skipped,
    saying why) or the object cannot be read (denied, saying where)."""
    if req.sub_resource:
        return Decision.skip("subresource")
    if req.kind == "Pod" and req.group == "":
        if req.operation != "CREATE":
            return Decision.skip("operation")  # a pod's resources and placement are immutable
    elif req.operation not in ("CREATE", "UPDATE"):
        return Decision.skip("operation")
    obj = req.object
    if obj is None:
        return Decision.skip("operation")
    if policy.is_exempt(req.namespace, req.username, req.groups):
        return Decision.skip("exempt")
    subject = subject_of(req.kind, req.namespace, obj, req.name)
    try:
        target = read_target(req.group, req.kind, req.namespace, obj, subject, policy, labels)
    except MalformedObject as exc:
        # Fail closed with a clear reason: the API server would refuse this object anyway.
        return malformed(subject, exc)
    return target if target is not None else Decision.skip("kind")


def read_target(group: str, kind: str, namespace: str, obj: dict[str, Any], subject: str,
                policy: CompiledPolicy, labels: NamespaceLabels) -> Target | None:
    """The pod template of an object of this kind, its GPU containers and tenant; None
    for a kind without a pod template. Raises MalformedObject."""
    template = pod_template(group, kind, obj)
    if template is None:
        return None
    containers = gpu_containers(template.spec, template.spec_pointer, policy.is_gpu)
    has_gpu = any(c.names for c in containers)
    tenant = policy.tenant_for(namespace, labels(namespace)) if namespace else None
    return Target(template, containers, has_gpu, tenant, subject)
