"""What a pod costs, computed in one place: the GPUs it holds against its tenant's quota.

Admission (a pod, a workload's template, a scale-up) and the cluster cache (a pod seen by
the watch) both charge a pod through :func:`pod_cost`, so what admission counts and what
the cluster later shows can never disagree: the effective request per GPU resource (as
ResourceQuota counts it: the larger of the app containers with restartable init
"sidecars" and the largest plain init container), the GPU-equivalents the policy's
weights make of it, and the one product the pod is pinned to, if it is pinned to one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from webhook.engine import devices, messages
from webhook.engine import spot as spot_engine
from webhook.engine.borrowed import charged_to
from webhook.engine.cost import Charge, Cost
from webhook.engine.decision import Checker, Quiet
from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.gpu import check_maximums, check_requests, shared_part, weighted
from webhook.engine.pinning import check_pinned
from webhook.engine.placement import Placement
from webhook.engine.target import Target, read_target
from webhook.engine.users import recorded_on
from webhook.engine.waiting import is_gated
from webhook.k8s import claims as claims_wire
from webhook.k8s import podgroups
from webhook.k8s.identity import ObjectId
from webhook.k8s.objects import MalformedObject
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def pod_cost(check: Checker, policy: CompiledPolicy, target: Target) -> Cost:
    """Check the template's GPU requests, maximums and pinning (reporting to ``check``)
    and return what one of its pods costs: its containers' GPUs and the devices of the
    claims made for it alone from ResourceClaimTemplates. A claim it shares
    (``resourceClaimName``) is charged once, when the claim is created, not with each pod."""
    counts = check_requests(check, target.containers, None)
    claimed: dict[str, float] = {}
    claimed_gpus = 0.0
    products: set[str | None] = set()
    for use in target.gpu_claims:
        if not use.per_pod or use.requests is None:
            continue
        dc = devices.cost(check, policy, use.requests, f'resource claim "{use.entry.name}"',
                          target.seen)
        for r, n in dc.resources.items():
            claimed[r] = claimed.get(r, 0.0) + n
        claimed_gpus += dc.gpus
        products.add(dc.product)
    kai = target.kai
    if kai is not None:
        # A KAI-Scheduler fraction (annotations): the share of a device it asks, counted
        # as the policy's KAI resource, towards the per-pod cap as a claim's devices are.
        if kai.problem is not None:
            check.report(Rule.GPU_QUANTITY, messages.bad_kai_fraction(kai.problem))
        assert policy.kai is not None
        weight = policy.weight(policy.kai.resource)
        claimed[policy.kai.resource] = claimed.get(policy.kai.resource, 0.0) + kai.gpus
        claimed_gpus += kai.gpus * weight
    effective = check_maximums(check, policy, target.containers, counts, claimed_gpus)
    product = check_pinned(check, policy, target.template, target.gpu_containers)
    gpus = weighted(policy, effective) + claimed_gpus
    shared = shared_part(policy, effective,
                         check.tenant.name if check.tenant is not None else None) + (
        kai.gpus * policy.weight(policy.kai.resource)
        if kai is not None and policy.kai is not None else 0.0)
    if not target.gpu_containers and len(products) == 1:
        product = products.pop()  # DRA alone: the product its claims are pinned to
    for r, n in claimed.items():
        effective[r] = effective.get(r, 0.0) + n
    on_spot = 0.0
    if policy.spot is not None and spot_engine.checked(
            check, policy, target.template,
            Placement(target.template.spec, target.template.spec_pointer)):
        # Spot GPUs count apart: in full against the spot cap, and weighted against the
        # tenant's other GPU caps.
        on_spot = gpus
        tenant = check.tenant
        if tenant is not None and tenant.spot is not None:
            gpus *= tenant.spot.weight
    return Cost(product, effective, gpus, on_spot, shared)


def unknown_templates(check: Checker, target: Target) -> None:
    """A tenant's pod naming a ResourceClaimTemplate the webhook has not seen: what it
    costs is unknown, so it is not admitted blind (rule unknown-claim)."""
    if target.tenant is None:
        return
    for name, why in target.unseen_templates:
        check.report(Rule.UNKNOWN_CLAIM, messages.template_unknown(name, why))


def charge_of_pod(pod: Mapping[str, Any], policy: CompiledPolicy,
                  labels: Mapping[str, str] | None = None,
                  claims: ClaimLookup = no_claims,
                  node_product: Callable[[str], str | None] | None = None) -> Charge | None:
    """The charge of a pod seen in the cluster, or None when it holds no GPU quota (no
    GPU, terminal phase, no tenant, malformed). The same :func:`pod_cost` as admission,
    with the findings dropped: the rules ran when the pod was admitted. A bound pod is
    charged to its node's product when ``node_product`` knows the node."""
    return charge_and_unknown(pod, policy, labels, claims, node_product or no_node)[0]


def no_node(name: str) -> str | None:
    return None


def charge_and_unknown(pod: Mapping[str, Any], policy: CompiledPolicy,
                       labels: Mapping[str, str] | None = None,
                       claims: ClaimLookup = no_claims,
                       node_product: Callable[[str], str | None] = no_node,
                       ident: ObjectId | None = None,
                       ) -> tuple[Charge | None, tuple[str, ...]]:
    """:func:`charge_of_pod`, and the ResourceClaimTemplates a live pod of a tenant
    names that ``claims`` does not hold (or holds unreadable): their devices are not in
    the charge.

    A pod bound to a node (``spec.nodeName``) is charged to the product of that node
    (``node_product``: the node's product label value, None when not known), whatever
    it was charged at admission: a pod allowed two products follows the one it got.
    ``ident``: the pod's identity when the caller has read it already."""
    if not isinstance(pod, dict):
        return None, ()
    status = pod.get("status") or {}
    if isinstance(status, dict) and status.get("phase") in TERMINAL_PHASES:
        return None, ()
    if is_gated(pod):
        return None, ()  # waiting for quota: it holds nothing until released, charged
    if ident is None:
        ident = ObjectId.of(pod)
    namespace = ident.namespace
    try:
        target = read_target("", "Pod", namespace, pod, "", policy, lambda _: labels,
                             claims)
    except MalformedObject:
        return None, ()
    if target is None or target.tenant is None:
        return None, ()
    unknown = tuple(target.unknown_templates)
    if not target.has_gpu:
        return None, unknown
    try:
        cost = pod_cost(Quiet(policy, target.tenant, "", frozenset()), policy, target)
    except MalformedObject:
        return None, unknown
    if not cost.resources:
        return None, unknown
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    if isinstance(node, str) and node:
        value = node_product(node)
        bound = policy.product_name(value) if value is not None else None
        if bound is not None:
            cost = replace(cost, product=bound)
    # The user recorded on the pod: its creator's, as admission wrote it (engine.users).
    user = recorded_on(ident) if target.tenant.user_quota is not None else None
    return (cost.charge(charged_to(target.tenant, pod), namespace, owner_of(ident), user=user),
            unknown)


def charge_of_claim(kind: str, claim: Mapping[str, Any], policy: CompiledPolicy,
                    labels: Mapping[str, str] | None = None,
                    claims: ClaimLookup = no_claims) -> Charge | None:
    """The charge of a ResourceClaim seen in the cluster, or None when it holds no GPU
    quota: not a claim of GPU classes, no tenant, malformed, or made for a pod that was
    charged instead (a template's claim for one pod, the scheduler's claim for a plain
    nvidia.com/gpu request). Those two are told by annotation and by who wrote the
    object (``metadata.managedFields``): the kube-controller-manager or the scheduler;
    admission charges the same annotations from anyone else, and so does this.

    Once allocated, a claim is charged what it holds of the devices it got, on their
    product (:func:`webhook.engine.devices.allocated`); before, what admission charged.
    ``claims`` says what the ResourceSlices publish (webhook.engine.capacity)."""
    if kind != claims_wire.CLAIM or not isinstance(claim, dict):
        return None
    meta = claim.get("metadata") or {}
    if not isinstance(meta, dict):
        return None
    namespace = str(meta.get("namespace") or "")
    tenant = policy.tenant_for(namespace, labels) if namespace else None
    if tenant is None or _made_for_a_pod(meta):
        return None
    try:
        found = claims_wire.claim_spec(kind, claim)
        requests = claims_wire.device_requests(*found) if found is not None else []
    except MalformedObject:
        return None
    results = claims_wire.allocation(claim)
    got = devices.allocated(policy, requests, results, claims) if results else None
    dc = got or devices.cost(Quiet(policy, tenant, "", frozenset()), policy, requests,
                             claims=claims)
    if not dc.resources:
        return None
    return dc.as_cost().charge(tenant.name, namespace, f"resourceclaim/{meta.get('name')}",
                               pods=0)


# The field managers of the control plane: the resourceclaim controller creates a
# template's claim for a pod, the scheduler creates an extended-resource claim and writes
# every claim's allocation. Any other manager means a user wrote the claim.
_CONTROL_PLANE = frozenset({"kube-controller-manager", "kube-scheduler"})


def _made_for_a_pod(meta: Mapping[str, Any]) -> bool:
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        return False
    managers = {str(m.get("manager")) for m in meta.get("managedFields") or ()
                if isinstance(m, dict) and m.get("operation") in ("Update", "Apply")}
    if not managers <= _CONTROL_PLANE:
        return False
    return claims_wire.made_for_a_pod(annotations, "kube-scheduler" in managers,
                                      "kube-controller-manager" in managers,
                                      podgroups.owned_by_group(meta))


def owner_of(pod: ObjectId) -> str:
    """A readable owner for messages: the Deployment behind a ReplicaSet, else the
    controller's kind/name, else the pod itself."""
    ref = pod.controller
    if ref is None:
        return "pod/" + (pod.shown() or "*")
    pth = pod.labels.get("pod-template-hash")
    if ref.kind == "ReplicaSet" and pth and ref.name.endswith("-" + pth):
        return "deployment/" + ref.name[: -len(pth) - 1]
    return f"{ref.kind.lower()}/{ref.name}"
