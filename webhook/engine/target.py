"""The first step both webhooks share: is this request ours, and what does it hold?

It decides the cheap cases (other kinds, DELETE, exempt users and namespaces) before
any rule runs, and otherwise finds the pod templates (one per role of a training
workload), their GPU containers and the tenant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.engine import messages
from webhook.engine.decision import Decision, malformed, subject_of
from webhook.engine.devices import ClaimLookup, is_gpu_request, no_claims, unseen_reason
from webhook.engine.shares import KAIAsk, kai_ask
from webhook.k8s import podgroups
from webhook.k8s.claims import (
    CLAIM,
    TEMPLATE,
    DeviceRequest,
    PodClaim,
    claim_spec,
    device_requests,
    pod_claims,
)
from webhook.k8s.objects import MalformedObject
from webhook.k8s.resources import ContainerGPUs, gpu_containers
from webhook.k8s.review import AdmissionRequest
from webhook.k8s.workloads import PodTemplate, Role, Workload, pod_template, read_workload
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.tenantrules import TenantRules

NamespaceLabels = Callable[[str], Mapping[str, str] | None]


def no_labels(namespace: str) -> Mapping[str, str] | None:
    return None


def no_tenant(namespace: str, policy: CompiledPolicy, labels: NamespaceLabels) -> str:
    """Why a namespace's GPU request has no tenant: it belongs to none, or (with no
    cluster to read its labels from) tenants chosen by labels could not be tried."""
    unread = policy.selector_tenants() if labels(namespace) is None else []
    return messages.no_tenant(namespace, policy.name, unread)


@dataclass(frozen=True, slots=True)
class ClaimUse:
    """One of a pod's ``spec.resourceClaims``, with the device requests of the claim or
    template it names (None when the webhook has not seen it)."""

    entry: PodClaim
    requests: list[DeviceRequest] | None
    gpu: bool  # it asks a GPU device class
    unseen: str | None = None  # why it is unseen, when the lookup said (devices.unseen_reason)
    # It matches a claim of the pod's PodGroup: the one claim made for the whole group
    # from the template (webhook.k8s.podgroups.shared_claims), not one for this pod.
    by_group: bool = False

    @property
    def per_pod(self) -> bool:
        """A template's claim is made for this pod alone (and charged with it); a named
        claim, or a PodGroup's claim, may be shared, and is charged once, when it is
        created."""
        return self.entry.template is not None and not self.by_group


@dataclass(frozen=True, slots=True)
class Target:
    template: PodTemplate
    containers: list[ContainerGPUs]
    has_gpu: bool  # GPUs by container resources or by DRA claims
    tenant: TenantRules | None
    subject: str
    claims: tuple[ClaimUse, ...] = ()
    gpu_containers: bool = False  # GPUs by container resources (the device plugin)
    seen: ClaimLookup = no_claims  # what the watches hold (slices: shares of devices)
    kai: KAIAsk | None = None  # a KAI-Scheduler fraction by annotation (gpuResources.kai)

    @property
    def gpu_claims(self) -> list[ClaimUse]:
        return [c for c in self.claims if c.requests is not None and c.gpu]

    @property
    def unknown_templates(self) -> list[str]:
        return [c.entry.template for c in self.claims
                if c.requests is None and c.entry.template is not None]

    @property
    def unseen_templates(self) -> list[tuple[str, str | None]]:
        """The unknown templates with why each is unseen (None: not asked)."""
        return [(c.entry.template, c.unseen) for c in self.claims
                if c.requests is None and c.entry.template is not None]


@dataclass(frozen=True, slots=True)
class RoleTarget:
    """One role of a workload (the only one of a Pod or Deployment) and its target."""

    role: Role
    target: Target


@dataclass(frozen=True, slots=True)
class Targets:
    """Every pod template of the request's object, in the object's order."""

    workload: Workload
    roles: list[RoleTarget]
    tenant: TenantRules | None
    subject: str  # the object: "volcano job team-a/llm", "deployment team-a/web, pod template"

    @property
    def has_gpu(self) -> bool:
        return any(r.target.has_gpu for r in self.roles)

    @property
    def is_pod(self) -> bool:
        return len(self.roles) == 1 and self.roles[0].target.template.is_pod


def prepare(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels,
            claims: ClaimLookup = no_claims) -> Targets | Decision:
    """The request's pod templates, or the final decision when no rule applies (skipped,
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
    try:
        workload = read_workload(req.group, req.kind, obj, policy.workload_kinds)
        if workload is None:
            return Decision.skip("kind")
        return read_targets(workload, req.namespace, obj, req.name, policy, labels, claims)
    except MalformedObject as exc:
        # Fail closed with a clear reason: the API server would refuse this object anyway.
        return malformed(subject_of(req.kind, req.namespace, obj, req.name), exc)


def read_targets(workload: Workload, namespace: str, obj: dict[str, Any], name: str,
                 policy: CompiledPolicy, labels: NamespaceLabels,
                 claims: ClaimLookup = no_claims) -> Targets:
    """Each role's target, named for messages. Raises MalformedObject."""
    tenant = policy.tenant_for(namespace, labels(namespace)) if namespace else None
    single = len(workload.roles) == 1 and workload.roles[0].name is None
    subject = subject_of(workload.kind, namespace, obj, name)
    if not single:
        # "volcano job team-a/llm": the role's own subject says which template.
        subject = subject_of(workload.noun, namespace, obj, name).removesuffix(
            ", pod template")
    roles = []
    for role in workload.roles:
        here = subject if single else (
            f"{subject}, {workload.role_word + ' ' if workload.role_word else ''}"
            f"{role.name}" + (", pod template" if role.patchable else ""))
        roles.append(RoleTarget(role, template_target(role.template, here, tenant,
                                                      policy, namespace, claims)))
    return Targets(workload, roles, tenant, subject)


def read_target(group: str, kind: str, namespace: str, obj: dict[str, Any], subject: str,
                policy: CompiledPolicy, labels: NamespaceLabels,
                claims: ClaimLookup = no_claims) -> Target | None:
    """The pod template of an object of this kind, its GPU containers, DRA claims and
    tenant; None for a kind without a pod template. Raises MalformedObject."""
    template = pod_template(group, kind, obj)
    if template is None:
        return None
    tenant = policy.tenant_for(namespace, labels(namespace)) if namespace else None
    return template_target(template, subject, tenant, policy, namespace, claims)


def template_target(template: PodTemplate, subject: str, tenant: TenantRules | None,
                    policy: CompiledPolicy, namespace: str = "",
                    claims: ClaimLookup = no_claims) -> Target:
    """One pod template's GPU containers and DRA claims. Raises MalformedObject."""
    containers = gpu_containers(template.spec, template.spec_pointer, policy.is_gpu)
    kai = kai_ask(policy, template.metadata)
    # A KAI fraction is a share of a node's device-plugin GPU: placed as those are.
    by_containers = any(c.names for c in containers) or kai is not None
    entries = pod_claims(template.spec, template.spec_pointer)
    shared = _group_claims(template, entries, namespace, claims)
    uses = tuple(_claim_use(e, namespace, policy, claims, (e.name, e.claim, e.template) in shared)
                 for e in entries)
    has_gpu = by_containers or any(u.gpu for u in uses)
    return Target(template, containers, has_gpu, tenant, subject, uses, by_containers,
                  claims, kai)


def _group_claims(template: PodTemplate, entries: list[PodClaim], namespace: str,
                  claims: ClaimLookup) -> frozenset[podgroups.SharedClaim]:
    """The claims of the PodGroup the pod joins, when any of its entries names a
    template and the PodGroup is seen (the watch, or a read before the review)."""
    if not any(e.template for e in entries):
        return frozenset()
    group = podgroups.group_of({"spec": template.spec})
    if group is None:
        return frozenset()
    return podgroups.shared_claims(claims(podgroups.KIND, namespace, group))


def _claim_use(entry: PodClaim, namespace: str, policy: CompiledPolicy,
               claims: ClaimLookup, by_group: bool = False) -> ClaimUse:
    kind, name = ((TEMPLATE, entry.template) if entry.template is not None
                  else (CLAIM, entry.claim))
    obj = claims(kind, namespace, name) if name else None
    if obj is None:
        why = unseen_reason(claims, kind, namespace, name) if name else None
        return ClaimUse(entry, None, False, why, by_group)
    try:
        found = claim_spec(kind, dict(obj))
        requests = device_requests(*found) if found is not None else []
    except MalformedObject:
        # A stored claim the API server accepted is well formed; one that is not
        # counts as unseen, never as free.
        return ClaimUse(entry, None, False, by_group=by_group)
    return ClaimUse(entry, requests, any(is_gpu_request(policy, r) for r in requests),
                    by_group=by_group)
