"""The charges the pod cache keeps by shape (``webhook.quota.charges``): a pod the watch
shows is charged what it would be charged afresh, whatever pods of its shape, other
names, other uids and other bookkeeping came before it.

Each case feeds the cache (``ClusterState``, as every replica's pod watch does) a fuzzed
pod under one name, then the same shape under another name and uid, with other
bookkeeping (resourceVersion, managedFields times, status beside the phase), and holds
the second pod's charge to ``charge_and_unknown`` of it, made with nothing kept.
"""

from __future__ import annotations

import copy
from typing import Any

from fuzzkit import NAMESPACES, POLICY, POLICY_FILE, PRODUCT_LABEL, pod_templates
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.engine.charge import charge_and_unknown
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text
from webhook.quota.cache import ClusterState

WARN: CompiledPolicy = compile_policy(load_text(
    POLICY_FILE.read_text().replace("  mode: enforce\n", "  mode: warn\n", 1), "warn.yaml"))
TENANT_LABELS = [None, {"gpu.example.com/tenant": "inference"}, {"team": "x"}]
OWNERS = [
    None,
    {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-1",
     "controller": True},
    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "rs-1",
     "controller": True},
    {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-a-controller", "uid": "cm-1"},
]
PHASES = [None, "Pending", "Running", "Succeeded", "Failed"]
PRODUCTS = [None, "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"]


def watched(template: dict[str, Any], namespace: str, name: str, uid: str, owner: Any,
            node: str | None, phase: str | None, stamp: int) -> dict[str, Any]:
    """The template as the pod watch shows a pod of it."""
    meta = {**copy.deepcopy(template["metadata"]), "name": name, "namespace": namespace,
            "uid": uid, "resourceVersion": str(100 + stamp),
            "creationTimestamp": f"2026-12-05T10:00:0{stamp}Z",
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "time": f"2026-12-05T10:00:0{stamp}Z"}]}
    if owner is not None:
        meta["ownerReferences"] = [owner]
        if owner["kind"] == "ReplicaSet":
            meta.setdefault("labels", {})["pod-template-hash"] = "5d8f"
    spec = copy.deepcopy(template["spec"])
    if node is not None:
        spec["nodeName"] = node
    status: dict[str, Any] = {"podIP": f"10.0.0.{stamp}", "conditions": [
        {"type": "Ready", "status": "True" if stamp else "False"}]}
    if phase is not None:
        status["phase"] = phase
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": status}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod_templates(), st.sampled_from(NAMESPACES), st.sampled_from(TENANT_LABELS),
       st.sampled_from(OWNERS), st.sampled_from([None, "gpu-1"]), st.sampled_from(PRODUCTS),
       st.sampled_from(PHASES), st.sampled_from(PHASES),
       st.sampled_from([POLICY, WARN]), st.booleans())
def test_a_pod_is_charged_what_it_would_be_charged_afresh(
        template: dict[str, Any], namespace: str, labels: dict[str, str] | None,
        owner: Any, node: str | None, product: str | None, phase: str | None,
        then: str | None, policy: CompiledPolicy, same_pod: bool) -> None:
    state = ClusterState(lambda: policy)
    state.pod_event("SYNCED", {})
    if labels is not None:
        state.namespace_event("ADDED", {"metadata": {"name": namespace, "labels": labels}})
    state.namespace_event("SYNCED", {})
    if product is not None:
        state.node_event("ADDED", {"metadata": {"name": "gpu-1",
                                                "labels": {PRODUCT_LABEL: product}}})
    first = watched(template, namespace, "first", "uid-1", owner, node, phase, 0)
    # The same pod again (a status change), or another pod of its shape.
    name, uid = ("first", "uid-1") if same_pod else ("second", "uid-2")
    second = watched(template, namespace, name, uid, owner, node, then, 1)
    state.pod_event("ADDED", first)
    state.pod_event("MODIFIED" if same_pod else "ADDED", second)
    fresh, _ = charge_and_unknown(second, policy, labels, state.claim_lookup,
                                  state.node_products.get)
    assert state.pods.charge(uid) == fresh
    if fresh is not None and not same_pod and phase == then:
        assert state.charges.hits == 1  # the second pod was charged from the first's shape


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "research", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {
                "limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}}]}}


def test_a_pod_without_a_controller_is_held_by_its_own_name() -> None:
    # The owner is what a denial names as holding the GPUs ("pod/b holds 2").
    state = ClusterState(lambda: POLICY)
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    state.pod_event("ADDED", gpu_pod("a", 2))
    state.pod_event("ADDED", gpu_pod("b", 2))
    a, b = state.pods.charge("uid-a"), state.pods.charge("uid-b")
    assert a is not None and b is not None
    assert (a.owner, b.owner, b.gpus) == ("pod/a", "pod/b", 2)
    assert state.charges.hits == 1


def test_a_new_policy_or_a_relabelled_node_is_never_answered_from_what_was_kept() -> None:
    state = ClusterState(lambda: policy)
    policy = POLICY
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    state.node_event("ADDED", {"metadata": {"name": "gpu-1", "labels": {
        PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}}})
    pod = gpu_pod("a", 2)
    pod["spec"]["nodeName"] = "gpu-1"
    state.pod_event("ADDED", pod)
    charged = state.pods.charge("uid-a")
    assert charged is not None and charged.product == "a100"
    state.node_event("MODIFIED", {"metadata": {"name": "gpu-1", "labels": {
        PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}}})
    state.pod_event("MODIFIED", pod)
    charged = state.pods.charge("uid-a")
    assert charged is not None and charged.product == "h100"
    # A new policy that renames the tenant: the pod is charged to the new name.
    policy = compile_policy(load_text(
        POLICY_FILE.read_text().replace("name: research\n", "name: researchers\n", 1),
        "other.yaml"))
    state.pod_event("MODIFIED", pod)
    assert state.pods.charge("uid-a") == charge_and_unknown(
        pod, policy, None, state.claim_lookup, state.node_products.get)[0]
    assert state.pods.charge("uid-a") != charged


def test_pods_naming_resource_claims_are_always_charged_afresh() -> None:
    state = ClusterState(lambda: POLICY)
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    for name in ("a", "b"):
        pod = gpu_pod(name, 1)
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared"}]
        state.pod_event("ADDED", pod)
    assert (state.charges.hits, len(state.charges)) == (0, 0)
