"""ResourceClaim and ResourceClaimTemplate creations: both webhooks' decisions.

A claim's spec is immutable once created, so everything happens at CREATE:

- the mutating webhook ANDs the tenant's product selector into each GPU request
  (:func:`webhook.engine.devices.pin`) and refuses, in enforce mode, GPU classes the
  tenant may not use, ``adminAccess`` and a faked extended-resource annotation;
- the validating webhook enforces those, the per-pod maximum (every pod using the claim
  holds all of its devices) and, for a ResourceClaim, the quota: a claim is charged once,
  when it is created (keyed by its uid), however many pods share it, and freed when it is
  deleted. A template costs nothing by itself: each pod that uses it is charged its
  devices when the pod is created (:mod:`webhook.engine.charge`).

Two kinds of claims are not charged, since their pod already was: the claim the
resourceclaim controller makes from a template for one pod, and the claim the scheduler
makes for a plain ``nvidia.com/gpu`` request that a DeviceClass serves (KEP-5004). Both
are recognised by annotation *and* by who creates them, so a user cannot escape quota by
writing the annotation (kubernetes/kubernetes#135404).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.engine import devices, holding, messages
from webhook.engine.cost import Ask
from webhook.engine.decision import PROVENANCE_ANNOTATION, Checker, Decision, malformed
from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.handoff import ClaimQuota, Reservation, Validation
from webhook.engine.target import NamespaceLabels, no_tenant
from webhook.k8s import claims, podgroups
from webhook.k8s.claims import DeviceRequest
from webhook.k8s.objects import MalformedObject, child_map
from webhook.k8s.patch import Patch
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule
from webhook.policy.tenantrules import TenantRules

# Rules the mutating webhook reports in every mode for claims (validating: enforce only).
MUTATE_OWNED = frozenset({Rule.TENANT_REQUIRED, Rule.ALLOWED_DEVICE_CLASSES,
                          Rule.DEVICE_ADMIN_ACCESS, Rule.EXTENDED_RESOURCE_CLAIM})
VALIDATE_CLAIM_OWNED = frozenset({Rule.MAX_PER_POD, Rule.QUOTA, Rule.ALLOWED_PRODUCTS})

# Who makes the claims that are not charged again (see the module docstring).
CLAIM_CONTROLLER_USERS = frozenset({
    "system:kube-controller-manager",
    "system:serviceaccount:kube-system:resource-claim-controller",
})


def is_claim(req: AdmissionRequest) -> bool:
    return req.group == claims.GROUP and req.kind in (claims.CLAIM, claims.TEMPLATE)


@dataclass(frozen=True, slots=True)
class ClaimTarget:
    kind: str
    obj: dict[str, Any]
    requests: list[DeviceRequest]
    tenant: TenantRules | None
    subject: str
    charged_elsewhere: bool  # made for one pod, by the controller or the scheduler
    fakes_extended: bool  # carries the scheduler's annotation, made by someone else


def prepare(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels
            ) -> ClaimTarget | Decision:
    if req.operation != "CREATE" or req.object is None:
        return Decision.skip("operation")  # the spec is immutable after CREATE
    if policy.is_exempt(req.namespace, req.username, req.groups):
        return Decision.skip("exempt")
    obj = req.object
    raw = obj.get("metadata")
    meta: dict[str, Any] = raw if isinstance(raw, dict) else {}
    name = req.ident.shown(req.name) or "*"
    subject = f"{req.kind.lower()} {req.namespace}/{name}"
    try:
        found = claims.claim_spec(req.kind, obj)
        requests = claims.device_requests(*found) if found is not None else []
        annotations = child_map(meta, "annotations", "/metadata") or {}
    except MalformedObject as exc:
        return malformed(subject, exc)
    if not any(devices.is_gpu_request(policy, r) for r in requests):
        return Decision.skip("no-gpu")
    tenant = policy.tenant_for(req.namespace, labels(req.namespace)) if req.namespace else None
    by_scheduler = req.username == claims.SCHEDULER_USER
    extended = claims.EXTENDED_RESOURCE_ANNOTATION in annotations
    for_pod = claims.made_for_a_pod(annotations, by_scheduler,
                                    req.username in CLAIM_CONTROLLER_USERS,
                                    podgroups.owned_by_group(meta))
    return ClaimTarget(req.kind, obj, requests, tenant, subject, for_pod,
                       extended and not by_scheduler)


def mutate(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels
           ) -> Decision:
    target = prepare(req, policy, labels)
    if isinstance(target, Decision):
        return target
    check = Checker(policy, target.tenant, target.subject, MUTATE_OWNED)
    _rules(check, policy, target, req, labels)
    patch = Patch()
    changes: list[str] = []
    if not target.charged_elsewhere and devices.pin(policy, target.tenant, target.requests,
                                                    patch, target.obj):
        changes.append("gpu-device-selector")
    if not target.charged_elsewhere and holding.claim_selectors(
            policy, target.obj, target.requests, patch):
        changes.append("gpu-capability")
    if changes:
        _annotate(target.obj, changes, patch)
    return check.decide(patch.ops, changes)


def validate(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels,
             claims_seen: ClaimLookup = no_claims) -> Validation:
    """``claims_seen``: what the watches hold, the ResourceSlices among them (a claim of
    part of a device is charged its share of the devices it may get)."""
    target = prepare(req, policy, labels)
    if isinstance(target, Decision):
        return Validation(target)
    check = Checker(policy, target.tenant, target.subject, VALIDATE_CLAIM_OWNED)
    cost = _rules(check, policy, target, req, labels, claims_seen)
    tenant = target.tenant
    if tenant is None or target.charged_elsewhere:
        return Validation(check.decide())
    if tenant.max_per_pod is not None and cost.gpus > tenant.max_per_pod:
        check.report(Rule.MAX_PER_POD,
                     messages.claim_per_pod_max(cost.gpus, tenant.name, tenant.max_per_pod))
    values = devices.product_values(policy, tenant)
    if values is not None and any(
            a.device_class in policy.device_classes
            and not (devices.pinned_values(policy, a) or {"-"}) <= set(values)
            for r in target.requests for a in r.alternatives):
        attribute = next(iter(policy.device_classes.values())).product_attribute
        check.report(Rule.ALLOWED_PRODUCTS, messages.claim_unpinned(
            attribute, tenant.name,
            [policy.product_name(v) or v for v in values]))
    if target.kind != claims.CLAIM or check.denied or not tenant.has_quota:
        return Validation(check.decide())
    claim = req.ident.name or req.name
    owner = f"resourceclaim/{claim}"
    per = cost.as_cost()
    ask = Ask(tenant=tenant.name, namespace=req.namespace, cost=per, pods=1, is_pod=True,
              pods_added=1, kind=target.kind, counts_pods=False)
    reservation = None
    if not req.dry_run:
        # A name no pod can have (":"), so a claim never stands for a pod of its name.
        name = f"{req.namespace}/resourceclaim:{claim}"
        reservation = Reservation(key=req.ident.uid or name,
                                  charge=per.charge(tenant.name, req.namespace, owner, pods=0),
                                  name=name)
    return Validation(check.decide(), ClaimQuota(tenant=tenant, subject=target.subject,
                                                 ask=ask, reservation=reservation))


def _rules(check: Checker, policy: CompiledPolicy, target: ClaimTarget,
           req: AdmissionRequest, labels: NamespaceLabels,
           claims_seen: ClaimLookup = no_claims) -> devices.DeviceCost:
    if target.tenant is None and not policy.unassigned_allowed:
        check.report(Rule.TENANT_REQUIRED, no_tenant(req.namespace, policy, labels))
    if target.fakes_extended:
        check.report(Rule.EXTENDED_RESOURCE_CLAIM, messages.fake_extended_resource_claim(
            claims.EXTENDED_RESOURCE_ANNOTATION))
    return devices.cost(check, policy, target.requests, claims=claims_seen)


def _annotate(obj: dict[str, Any], changes: list[str], patch: Patch) -> None:
    meta = child_map(obj, "metadata", "")
    ann = child_map(meta, "annotations", "/metadata") if meta is not None else None
    before = ann.get(PROVENANCE_ANNOTATION) if ann is not None else None
    names = [n for n in str(before).split(",") if n] if isinstance(before, str) else []
    names += [c for c in changes if c not in names]
    value = ",".join(names)
    if value != before:
        patch.put(obj, "", ("metadata", "annotations", PROVENANCE_ANNOTATION), value)
