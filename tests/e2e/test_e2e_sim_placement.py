"""Placement on the simulated GPU cluster: the real scheduler binds the pods the webhook
mutated, on kwok nodes labelled as GPU Feature Discovery labels real ones
(tests/e2e/gpucluster/gpu-cluster.yaml, policy tests/e2e/gpucluster/policy.yaml).

Each tenant's pods are bound only to nodes of its allowed products and racks, checked on
the nodes' labels as the API server returns them. The control cases show why: a GPU pod the
webhook does not touch has no toleration for the GPU taint and is never scheduled, and a
tenant pinned to one rack leaves a pod pending rather than use free GPUs in another.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2ekit import GPU_TOLERATION, apply, short_id, to_yaml, wait_until
from gpucluster.fixtures import (
    EXEMPT,
    SimNamespaceFactory,
    node_labels,
    pod,
    pods,
    requested_on,
    running,
    wait_event,
)
from gpucluster.sim import SimCluster
from kubernetes import client as k8s

pytestmark = pytest.mark.e2e

PRODUCT = "nvidia.com/gpu.product"
RACK = "topology.example.com/gpu-rack"
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def placed(core: k8s.CoreV1Api, found: list[Any]) -> dict[str, tuple[str, str | None]]:
    """pod name -> (its node's product label, its node's rack label)."""
    out = {}
    for p in found:
        labels = node_labels(core, p.spec.node_name)
        out[p.metadata.name] = (labels.get(PRODUCT, "-"), labels.get(RACK))
    return out


def test_research_pods_run_on_a100_by_default_and_h100_when_asked_in_racks_a_and_b(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
) -> None:
    ns = sim_namespace("research")
    default = [pod(f"train-{i}", 2) for i in range(4)]
    h100 = [pod(f"h100-{i}", 2, labels={"gpu.example.com/product": "h100"}) for i in range(2)]
    out = apply(sim.cp, ns, *default, *h100)
    assert out.returncode == 0, out.stderr

    where = placed(core, running(core, ns, 6))
    assert {where[f"train-{i}"][0] for i in range(4)} == {A100}
    assert {where[f"h100-{i}"][0] for i in range(2)} == {H100}
    assert {rack for _, rack in where.values()} <= {"rack-a", "rack-b"}


def test_a_tenant_pinned_to_rack_b_waits_for_rack_b_while_rack_a_has_free_a100s(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
) -> None:
    ns = sim_namespace("vision")  # tenant vision: A100 in rack-b only
    rack_b = sim.cluster.names(product=A100, rack="rack-b")
    rack_a = sim.cluster.names(product=A100, rack="rack-a")
    # One 8-GPU pod fills a node: one pod more than rack-b's A100 nodes.
    big = [pod(f"big-{i}", 8) for i in range(len(rack_b) + 1)]
    out = apply(sim.cp, ns, *big)
    assert out.returncode == 0, out.stderr

    found = running(core, ns, len(rack_b))
    assert {p.spec.node_name for p in found} == rack_b
    pending = [p for p in pods(core, ns) if p.status.phase == "Pending"]
    assert len(pending) == 1
    event = wait_event(core, ns, "Pod", pending[0].metadata.name, "FailedScheduling")
    # The scheduler's own account: the rack-b A100s are full, and every other node is
    # ruled out by the node affinity the webhook injected, not by a lack of GPUs.
    assert f"{len(rack_b)} Insufficient nvidia.com/gpu" in event.message
    assert "didn't match Pod's node affinity/selector" in event.message
    # ... while the rack-a A100s, which the pod may not use, have GPUs free.
    assert sum(requested_on(core, n, "nvidia.com/gpu") for n in rack_a) < 8 * len(rack_a)
    terms = pending[0].spec.affinity.node_affinity \
        .required_during_scheduling_ignored_during_execution.node_selector_terms
    assert all(any(e.key == RACK and e.values == ["rack-b"] for e in t.match_expressions)
               for t in terms)


def test_time_sliced_and_mig_pods_land_on_the_nodes_that_have_them(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
) -> None:
    inference = sim_namespace("inference")  # L4, nvidia.com/gpu.shared allowed
    notebooks = sim_namespace("notebooks")  # A100 MIG slices
    out = apply(sim.cp, inference, *(pod(f"serve-{i}", 1, "nvidia.com/gpu.shared")
                                     for i in range(3)))
    assert out.returncode == 0, out.stderr
    out = apply(sim.cp, notebooks, *(pod(f"nb-{i}", 1, "nvidia.com/mig-1g.10gb")
                                     for i in range(2)))
    assert out.returncode == 0, out.stderr

    shared = running(core, inference, 3)
    assert {p.spec.node_name for p in shared} == sim.cluster.names(
        resource="nvidia.com/gpu.shared")
    assert {product for product, _ in placed(core, shared).values()} == {"NVIDIA-L4"}
    mig = running(core, notebooks, 2)
    assert {p.spec.node_name for p in mig} == sim.cluster.names(
        resource="nvidia.com/mig-1g.10gb")
    assert {product for product, _ in placed(core, mig).values()} == {A100}


def test_a_gpu_pod_without_the_injected_toleration_is_never_scheduled_on_gpu_nodes(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
    exempt: list[str],
) -> None:
    ns = sim_namespace("research")
    name = f"bare-{short_id()}"
    exempt.append(name)
    # The same pod, as a developer writes it, in a namespace the webhook leaves alone
    # and in a research namespace.
    out = apply(sim.cp, EXEMPT, pod(name, 1))
    assert out.returncode == 0, out.stderr
    out = apply(sim.cp, ns, pod(name, 1))
    assert out.returncode == 0, out.stderr

    mutated = running(core, ns, 1)[0]
    assert GPU_TOLERATION in [{"key": t.key, "operator": t.operator, "effect": t.effect}
                              for t in mutated.spec.tolerations or []]
    event = wait_event(core, EXEMPT, "Pod", name, "FailedScheduling")
    assert "untolerated taint" in event.message and "nvidia.com/gpu" in event.message
    bare = core.read_namespaced_pod(name, EXEMPT)
    assert bare.spec.node_name is None and bare.status.phase == "Pending"
    assert not any(t.key == "nvidia.com/gpu" for t in bare.spec.tolerations or [])


def test_the_scheduler_allocates_dra_gpus_from_the_resource_slices(
    sim: SimCluster, core: k8s.CoreV1Api, exempt: list[str],
) -> None:
    name = f"dra-{short_id()}"
    exempt.append(name)
    template = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": 2,
            "selectors": [{"cel": {"expression":
                "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"}}],
        }}]}}},
    }
    claim_pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"tolerations": [GPU_TOLERATION],
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
                 "containers": [{"name": "train", "image": "registry.local/train:1",
                                 "resources": {"claims": [{"name": "gpu"}]}}]},
    }
    out = sim.cp.kubectl("apply", "-n", EXEMPT, "-f", "-",
                         input=to_yaml(template, claim_pod), check=False)
    assert out.returncode == 0, out.stderr

    # The resourceclaim controller makes the pod's claim from the template; the
    # scheduler allocates it from the H100 node's ResourceSlice and binds the pod there.
    def bound() -> bool:
        p = core.read_namespaced_pod(name, EXEMPT)
        return p.status.phase == "Running"

    wait_until(f"DRA pod {name} to run", bound, timeout=90)
    p = core.read_namespaced_pod(name, EXEMPT)
    assert p.spec.node_name == "dra-h100-0"
    claim_name = p.status.resource_claim_statuses[0].resource_claim_name
    claim = sim.cp.kubectl("get", "resourceclaim", claim_name, "-n", EXEMPT,
                           "-o", "jsonpath={.status.allocation.devices.results}").stdout
    assert claim.count('"driver":"gpu.nvidia.com"') == 2
    assert '"pool":"dra-h100-0"' in claim
    sim.cp.kubectl("delete", "resourceclaimtemplate", name, "-n", EXEMPT, "--wait=false")
