"""The charge of a pod and its claims never depends on the order in which the cluster
cache sees them: the namespace (its tenant label), the ResourceSlice (what the shared
device holds), the claim template (what the pod's claim asks), the pod, a shared claim
(allocated or not) and the pod using it, and each watch's end of listing, in any order,
leave the tenant charged the same. The control plane's relist (``on_relabel``, a pods
resync online) is played by delivering the pods again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.engine import devices
from webhook.k8s.claims import CLAIM, TEMPLATE
from webhook.k8s.slices import SLICE
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_file
from webhook.quota.cache import ClusterState

ROOT = Path(__file__).resolve().parents[2]
POLICY = compile_policy(load_file(str(ROOT / "tests" / "e2e" / "gpucluster" / "policy.yaml")))
SELECTOR = devices.selector(POLICY, "gpu.nvidia.com", ["NVIDIA-H200"])
H200 = 143771 * 2**20
NS = "team-x"


def spec(memory: str) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": SELECTOR}}],
        "capacity": {"requests": {"memory": memory}}}}]}}


def meta(name: str, uid: str) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "uid": uid,
            "managedFields": [{"manager": "kubectl", "operation": "Update"}]}


NAMESPACE = {"metadata": {"name": NS, "labels": {"gpu.example.com/tenant": "sharing"}}}
SLICE_OBJ = {"metadata": {"name": "h200-dra-0-gpu.nvidia.com"}, "spec": {
    "driver": "gpu.nvidia.com", "nodeName": "h200-dra-0",
    "pool": {"name": "h200-dra-0", "generation": 1, "resourceSliceCount": 1},
    "devices": [{"name": "gpu-0", "allowMultipleAllocations": True,
                 "attributes": {"productName": {"string": "NVIDIA H200"}},
                 "capacity": {"memory": {"value": "143771Mi"}}}]}}
TEMPLATE_OBJ = {"metadata": meta("kv", "t-1"), "spec": {"spec": spec("20Gi")}}
CLAIM_OBJ = {"metadata": meta("shared", "c-1"), "spec": spec("30Gi")}
ALLOCATED = {**CLAIM_OBJ, "status": {"allocation": {"devices": {"results": [{
    "request": "gpu", "driver": "gpu.nvidia.com", "pool": "h200-dra-0", "device": "gpu-0",
    "consumedCapacity": {"memory": "30Gi"}}]}}}}


def pod(name: str, uid: str, entry: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid},
            "spec": {"resourceClaims": [{"name": "gpu", **entry}],
                     "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]},
            "status": {"phase": "Running"}}


POD_T = pod("uses-template", "p-1", {"resourceClaimTemplateName": "kv"})
POD_C = pod("uses-claim", "p-2", {"resourceClaimName": "shared"})

# (watch, event type, object)
EVENTS: list[tuple[str, str, dict[str, Any]]] = [
    ("ns", "ADDED", NAMESPACE), ("ns", "SYNCED", {}),
    (SLICE, "ADDED", SLICE_OBJ), (SLICE, "SYNCED", {}),
    (TEMPLATE, "ADDED", TEMPLATE_OBJ), (TEMPLATE, "SYNCED", {}),
    (CLAIM, "ADDED", CLAIM_OBJ), (CLAIM, "SYNCED", {}),
    ("pods", "ADDED", POD_T), ("pods", "ADDED", POD_C), ("pods", "SYNCED", {}),
]
EXPECTED = (20 + 30) * 2**30 / H200  # the template's claim and the shared one


def replay(order: list[int], allocate_at: int | None) -> float:
    state = ClusterState(lambda: POLICY)
    state.watch_claims(slices=True)
    seen: dict[str, dict[str, Any]] = {}

    def relist() -> None:
        for obj in list(seen.values()):
            state.pod_event("MODIFIED", obj)

    state.on_relabel = relist
    state.on_templates_synced = relist
    handlers = {"ns": state.namespace_event, "pods": state.pod_event,
                SLICE: state.claim_event(SLICE), TEMPLATE: state.claim_event(TEMPLATE),
                CLAIM: state.claim_event(CLAIM)}
    for step, i in enumerate(order):
        watch, typ, obj = EVENTS[i]
        if watch == "pods" and typ == "ADDED":
            seen[obj["metadata"]["uid"]] = obj
        handlers[watch](typ, obj)
        if allocate_at == step:  # the scheduler writes the shared claim's allocation
            handlers[CLAIM]("MODIFIED", ALLOCATED)
    return state.pods.tenant("sharing").gpus


def test_in_the_order_a_cluster_usually_lists_them() -> None:
    assert replay(list(range(len(EVENTS))), None) == pytest.approx(EXPECTED)


@settings(max_examples=300, deadline=None)
@given(order=st.permutations(range(len(EVENTS))),
       allocate_at=st.none() | st.integers(0, len(EVENTS) - 1))
def test_the_charge_never_depends_on_the_order_of_events(order: list[int],
                                                         allocate_at: int | None) -> None:
    assert replay(order, allocate_at) == pytest.approx(EXPECTED)
