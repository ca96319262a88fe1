"""The mutating webhook's decision: complete GPU requests, add tolerations and node
affinity, strip GPU tolerations from non-GPU pods, close the routes to a GPU that skip
the GPU request in tenants' pods (``webhook.engine.routes``: the NVIDIA runtime's
variable, privilege, ``/dev``, ``nodeName``, PriorityClasses, ephemeral containers, DRA
device-taint tolerations), and deny what core validation would otherwise reject with a
terse message.

The object in the request is edited in place while the patch is recorded (see
``webhook.k8s.patch``); callers that still need the original must pass a copy.
Mutation is idempotent: running it on its own output yields an empty patch.

A training workload's templates (one per role) are each completed, tolerated and pinned
at their own pointers, as a Deployment's one template is. A role made up from resource
fields (a TrainJob's resourcesPerNode, an Argo step) is only checked: its pods are
completed and pinned when they are created.
"""

from __future__ import annotations

from webhook.engine import claims as claims_engine
from webhook.engine import holding, messages, spot, users
from webhook.engine.charge import unknown_templates
from webhook.engine.claims import is_claim
from webhook.engine.decision import (
    PROVENANCE_ANNOTATION,
    Checker,
    Decision,
    Finding,
    malformed,
)
from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.gpu import check_requests
from webhook.engine.pinning import requirements
from webhook.engine.placement import Placement
from webhook.engine.routes import pods as route_pods
from webhook.engine.routes.devicetaints import claim_tolerations
from webhook.engine.routes.ephemeral import ephemeral, is_ephemeral
from webhook.engine.routes.rules import RULES as ROUTE_RULES
from webhook.engine.routes.sights import Sights, no_sights
from webhook.engine.target import NamespaceLabels, Target, no_labels, no_tenant, prepare
from webhook.engine.tolerations import add_missing, tolerated_gpu_taints
from webhook.k8s.objects import MalformedObject, child_map
from webhook.k8s.patch import Patch
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode, Rule, TolerationPolicy

# Rules this phase reports in every mode; the others it leaves to the validating webhook.
OWNED = frozenset({
    Rule.TENANT_REQUIRED, Rule.GPU_QUANTITY, Rule.REQUESTS_MATCH_LIMITS,
    Rule.ALLOWED_RESOURCES, Rule.ALLOWED_PRODUCTS, Rule.TOPOLOGY, Rule.NON_GPU_TOLERATIONS,
    Rule.SPOT_PLACEMENT,
}) | ROUTE_RULES | holding.RULES


def mutate(req: AdmissionRequest, policy: CompiledPolicy,
           labels: NamespaceLabels = no_labels, claims: ClaimLookup = no_claims,
           sights: Sights = no_sights) -> Decision:
    if is_claim(req):
        d = claims_engine.mutate(req, policy, labels)
        return d.adding(claim_tolerations(
            req, policy, labels, claims_engine.CLAIM_CONTROLLER_USERS).findings)
    if is_ephemeral(req):
        return ephemeral(req, policy, labels, sights)
    targets = prepare(req, policy, labels, claims)
    if isinstance(targets, Decision):
        return targets
    patch = Patch()
    findings: list[Finding] = []
    all_changes: list[str] = []
    if targets.has_gpu and targets.tenant is None and not policy.unassigned_allowed:
        # The namespace's rule is the object's, not each template's: said once.
        whole = targets.subject if len(targets.roles) > 1 else targets.roles[0].target.subject
        told = Checker(policy, None, whole, OWNED)
        told.report(Rule.TENANT_REQUIRED, no_tenant(req.namespace, policy, labels))
        findings.extend(told.findings)
    for rt in targets.roles:
        target = rt.target
        check = Checker(policy, target.tenant, target.subject, OWNED)
        changes: list[str] = []
        try:
            unknown_templates(check, target)
            if target.has_gpu:
                if rt.role.patchable:
                    _gpu_pod(check, policy, target, patch, changes)
                    if users.record(req, target, patch):
                        changes.append("requested-by")
                else:
                    check_requests(check, target.containers, None)
            elif rt.role.patchable:
                _non_gpu_pod(check, policy, target, patch, changes)
            if rt.role.patchable:
                # After the tolerations are stripped: whether the pod can reach a GPU node
                # is read from the tolerations it keeps.
                route_pods.pod(check, policy, target, patch, changes, sights, req.username)
                # After the routes: a PriorityClass the tenant's default gave picks the
                # kind of work of a maximum runtime.
                if target.has_gpu:
                    holding.pod(check, policy, target, patch, changes, req.namespace)
            if changes:
                # Inside the try: a metadata that is not a mapping is only found here
                # when no rule before needed the pod's labels (a non-GPU pod stripped).
                _annotate(target, changes, patch)
        except MalformedObject as exc:
            return malformed(target.subject, exc)
        findings.extend(check.findings)
        all_changes.extend(c for c in changes if c not in all_changes)
    if not targets.is_pod and targets.has_gpu and targets.tenant is not None:
        held = Checker(policy, targets.tenant, targets.subject, OWNED)
        try:
            holding.workload(held, targets, req, patch, all_changes)
        except MalformedObject as exc:
            return malformed(targets.subject, exc)
        findings.extend(held.findings)
    return Decision.of(findings, tenant=targets.tenant.name if targets.tenant else None,
                       patch=patch.ops, mutations=all_changes)


def _gpu_pod(check: Checker, policy: CompiledPolicy, target: Target, patch: Patch,
             changes: list[str]) -> None:
    n_ops = len(patch.ops)
    check_requests(check, target.containers, patch)
    if len(patch.ops) > n_ops:
        changes.append("gpu-requests")
    spec, sptr = target.template.spec, target.template.spec_pointer
    if add_missing(spec, sptr, patch, policy.tolerations):
        changes.append("gpu-tolerations")
    # One Placement for the checks and the pins: the spec's node affinity is walked once.
    placement = Placement(spec, sptr)
    changed = False
    for r in requirements(check, policy, target.template, placement, target.gpu_containers):
        if check.mode(r.rule) is Mode.ENFORCE or not check.reported(r.rule):
            changed |= placement.pin(r.key, r.values, patch, r.keep)
    if changed:
        changes.append("gpu-node-affinity")
    if policy.spot is not None:
        changes.extend(spot.place(check, policy, target.template, placement, patch))
    # Last: it may double the terms every pin above was ANDed into.
    holding.capability(check, policy, target, patch, changes)


def _non_gpu_pod(check: Checker, policy: CompiledPolicy, target: Target, patch: Patch,
                 changes: list[str]) -> None:
    choice = policy.non_gpu_tolerations
    if choice is TolerationPolicy.ALLOW or target.claims:
        # A pod with DRA claims the webhook has not seen (or of other devices) may well
        # need the GPU nodes: its tolerations are its own business.
        return
    spec, sptr = target.template.spec, target.template.spec_pointer
    hits, found = tolerated_gpu_taints(spec, sptr, policy.tolerations)
    if not hits:
        return
    if choice is TolerationPolicy.DENY:
        check.report(Rule.NON_GPU_TOLERATIONS, messages.tolerates_gpu_taint(found))
        return
    patch.remove_indices(spec, "tolerations", sptr, hits)
    changes.append("strip-gpu-tolerations")


def _annotate(target: Target, changes: list[str], patch: Patch) -> None:
    """Record which changes were made, merged with any recorded by an earlier call."""
    holder, ptr = target.template.holder, target.template.pointer
    meta = child_map(holder, "metadata", ptr)
    ann = child_map(meta, "annotations", ptr + "/metadata") if meta is not None else None
    before = ann.get(PROVENANCE_ANNOTATION) if ann is not None else None
    names = [n for n in str(before).split(",") if n] if isinstance(before, str) else []
    for c in changes:
        if c not in names:
            names.append(c)
    value = ",".join(names)
    if value != before:
        patch.put(holder, ptr, ("metadata", "annotations", PROVENANCE_ANNOTATION), value)
