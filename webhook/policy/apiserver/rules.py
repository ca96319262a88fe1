"""The rules of the webhook configurations (:mod:`webhook.policy.apiserver.webhooks`): which
resources and operations each webhook is sent (the built-in training kinds, from their
table, and the kinds the policy configures among them), and the namespaces each routes
webhook takes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from webhook.k8s import podgroups
from webhook.k8s.workloads import CRD_KINDS
from webhook.policy.model import GPUPolicy, WorkloadKind

GROUP = "gpu-webhook.dev"
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server

RULES: list[dict[str, Any]] = [
    # A pod's resources and placement are immutable: only its creation matters.
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
     "resources": ["pods"], "scope": "Namespaced"},
    # Workloads are checked at `kubectl apply`, so a developer sees the problem there and
    # not as an event on a ReplicaSet.
    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["deployments", "replicasets", "statefulsets", "daemonsets"],
     "scope": "Namespaced"},
    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["jobs", "cronjobs"], "scope": "Namespaced"},
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["replicationcontrollers"], "scope": "Namespaced"},
]


# DRA claims and templates: their spec is immutable, so only their creation matters.
# Registered for v1; with matchPolicy Equivalent the API server converts a request made
# through another version (v1beta1's flat request fields) to v1 before sending it.
CLAIM_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
     "resources": ["resourceclaims", "resourceclaimtemplates"], "scope": "Namespaced"},
]


def workload_rules(configured: Iterable[WorkloadKind] = ()) -> list[dict[str, Any]]:
    """Rules for the training kinds and the configured ones: one per group and versions."""
    by: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for b in CRD_KINDS:
        by.setdefault((b.group, b.versions), []).append(b.resource)
    for w in configured:
        resources = by.setdefault((w.group, tuple(w.versions)), [])
        if w.resource not in resources:
            resources.append(w.resource)
    return [{"apiGroups": [g], "apiVersions": list(v), "operations": ["CREATE", "UPDATE"],
             "resources": r, "scope": "Namespaced"} for (g, v), r in by.items()]


def release_rules(configured: Iterable[WorkloadKind] = ()) -> list[dict[str, Any]]:
    """DELETE of the kinds that can have a gang: what its reservation still holds is
    freed when the workload is deleted."""
    by: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for b in CRD_KINDS:
        if b.reserves:
            by.setdefault((b.group, b.versions), []).append(b.resource)
    # The core gang API: a PodGroup's (or a CompositePodGroup's) reservation, made at its
    # first pod (webhook.admission.groups).
    by[(podgroups.GROUP, (podgroups.VERSION,))] = [podgroups.RESOURCE]
    by[(podgroups.GROUP, (podgroups.COMPOSITE_VERSION,))] = [podgroups.COMPOSITE_RESOURCE]
    for w in configured:
        if w.gang == "all" or w.gang_minimum is not None:
            resources = by.setdefault((w.group, tuple(w.versions)), [])
            if w.resource not in resources:
                resources.append(w.resource)
    return [{"apiGroups": [g], "apiVersions": list(v), "operations": ["DELETE"],
             "resources": r, "scope": "Namespaced"} for (g, v), r in by.items()]


# Every pod of a tenant's namespaces, for the routes to a GPU that skip the GPU request
# (webhook.engine.routes): a pod's creation, and the ephemeral containers added to it
# (``kubectl debug``), a subresource that a rule of ``pods`` alone does not match.
ROUTE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
     "resources": ["pods"], "scope": "Namespaced"},
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
     "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"},
]

# Tenants chosen by label each get a routes webhook of their own selector; past this many
# distinct selectors one webhook takes every namespace not excluded.
MAX_ROUTE_SELECTORS = 8


def natively_mutated(policy: GPUPolicy) -> list[str]:
    """The namespaces, named by their tenant, whose GPU pods need no change beyond those
    the native admission policies make (GPU requests completed, tolerations added,
    ``NVIDIA_VISIBLE_DEVICES``: ``webhook.admission.native``): no products in the policy,
    no topology pinning, spot placement, capabilities, maximum runtime, per-user record, waiting
    gate, borrowing label or default PriorityClass. In admission mode native their Pods
    are not sent to the mutating GPU webhook (those with DRA claims or KAI fractions
    still are: what a claim asks is known only to it). A tenant chosen by a selector is
    always sent: a matchCondition sees the namespace's name, not its labels.
    ``tests/deploy/test_native_render.py`` draws pods for such tenants through the
    mutating webhook and checks that it changes nothing else."""
    spec = policy.spec
    # Where the policy names products, a pod's own node affinity that offers several is
    # narrowed to one (webhook.engine.pinning), whatever its tenant allows.
    if (spec.products.aliases or spec.products.request.label
            or spec.products.request.annotation or spec.spot
            or spec.gpu_capabilities or spec.resources_per_gpu
            or spec.gpu_resources.hami or spec.gpu_resources.kai):
        return []
    out: list[str] = []
    for t in spec.tenants:
        if (t.allowed_products or t.default_product or t.topology or t.spot or t.cohort
                or t.max_runtime or t.user_quota or t.quota_schedule or t.routing
                or t.resources_per_gpu or t.over_quota.value != "deny"
                or (t.priority is not None and t.priority.default_class)):
            continue
        out.extend(t.namespaces)
    return sorted(set(out))


def route_scopes(policy: GPUPolicy, excluded: list[str]
                 ) -> list[tuple[str, dict[str, Any], list[str] | None]]:
    """(webhook name, namespaceSelector, namespaces by name or None) of the routes
    webhooks: the tenants' namespaces by name in one (``request.namespace in [...]``),
    the tenants chosen by one label each in one per label key (``key In [values]``:
    the usual ``gpu.example.com/tenant: <tenant>``), and one per other distinct
    namespaceSelector; the selector ones leave out the namespaces named (so no pod is
    sent twice). Past 8 selectors one webhook takes every namespace not excluded."""
    spec = policy.spec
    named = sorted({ns for t in spec.tenants for ns in t.namespaces} - set(excluded))
    by_key: dict[str, list[str]] = {}
    selectors: list[dict[str, Any]] = []
    for t in spec.tenants:
        sel = t.namespace_selector
        if sel is None:
            continue
        if len(sel.match_labels) == 1 and not sel.match_expressions:
            ((key, value),) = sel.match_labels.items()
            values = by_key.setdefault(key, [])
            if value not in values:
                values.append(value)
            continue
        dumped = sel.model_dump(by_alias=True, exclude_defaults=True)
        if dumped not in selectors:
            selectors.append(dumped)
    selectors = [{"matchExpressions": [{"key": key, "operator": "In",
                                        "values": sorted(values)}]}
                 for key, values in by_key.items()] + selectors
    out: list[tuple[str, dict[str, Any], list[str] | None]] = []
    if named:
        out.append(("routes", {"matchExpressions": [
            {"key": NAMESPACE_LABEL, "operator": "NotIn", "values": list(excluded)}]}, named))
    others = {"key": NAMESPACE_LABEL, "operator": "NotIn",
              "values": sorted({*excluded, *named})}
    if len(selectors) > MAX_ROUTE_SELECTORS:
        out.append(("routes-selected", {"matchExpressions": [others]}, None))
        return out
    for i, chosen in enumerate(selectors):
        # The exclusion first, as in every other webhook of the configuration.
        selector: dict[str, Any] = {"matchExpressions": [
            others, *chosen.get("matchExpressions", [])]}
        if chosen.get("matchLabels"):
            selector = {"matchLabels": chosen["matchLabels"], **selector}
        out.append((f"routes-{i + 1}", selector, None))
    return out


# GPUPolicy objects (cluster-scoped): what the loader refuses is refused at apply.
POLICY_RULES: list[dict[str, Any]] = [
    {"apiGroups": [GROUP], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["gpupolicies"], "scope": "Cluster"},
]


# The ConfigMap the replicas serve their policy from (deploy/base's configMapGenerator, the
# chart's policy.inline): an edit the loader refuses is refused at apply.
POLICY_CONFIGMAP = "gpu-webhook-policy"
POLICY_FILE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["configmaps"], "scope": "Namespaced"},
]


# The scale subresource: only the replica count changes, and only the validating webhook
# (quota) cares. The pods a scale-up adds are checked when they are created either way.
SCALE_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["UPDATE"],
     "resources": ["deployments/scale", "statefulsets/scale", "replicasets/scale"],
     "scope": "Namespaced"},
]


# A running pod's in-place resize (GA in 1.35): its CPU and memory change, never its
# GPUs; only the validating webhook's per-GPU caps (resourcesPerGpu) care. A rule of
# ``pods`` alone does not match a subresource.
RESIZE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
     "resources": ["pods/resize"], "scope": "Namespaced"},
]


def caps_resources(policy: GPUPolicy) -> bool:
    """Whether any tenant's CPU and memory per GPU are capped (``resourcesPerGpu``):
    only then is a GPU pod's resize sent."""
    return policy.spec.resources_per_gpu is not None or any(
        t.resources_per_gpu is not None for t in policy.spec.tenants)


# A pod's UPDATE that removes the quota gate (webhook.engine.waiting): only the webhook's
# own identity may, once it has charged the pod; every other pod update is not sent.
GATE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
     "resources": ["pods"], "scope": "Namespaced"},
]
