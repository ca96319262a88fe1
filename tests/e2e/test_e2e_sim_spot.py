"""Spot capacity on a simulated cluster: the real scheduler binds the pods the webhook
mutated on kwok nodes labelled as Karpenter labels spot and on-demand capacity
(tests/e2e/gpucluster/spot-cluster.yaml, policy spot-policy.yaml beside it).

Fault-tolerant pods are bound to spot nodes only; every other GPU pod is bound to
on-demand nodes only, and waits for one rather than take a free spot node, even the
untainted one that a missing toleration alone would not keep it off. A spot-only
tenant's Deployment runs on spot nodes through the same template path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2ekit import apply
from gpucluster.fixtures import (
    deployment,
    node_labels,
    pod,
    pods,
    running,
    started,
)
from gpucluster.fixtures import wait_event as wait_for_event
from gpucluster.sim import SimCluster
from kubernetes import client as k8s

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent / "gpucluster"
CAPACITY = "karpenter.sh/capacity-type"
FAULT_TOLERANT = {"gpu-webhook.dev/fault-tolerant": "true"}


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    with started(SimCluster(tmp_path_factory.mktemp("gpu-sim-spot"),
                            policy=HERE / "spot-policy.yaml",
                            description=HERE / "spot-cluster.yaml")) as cluster:
        yield cluster


def capacity_of(api: k8s.CoreV1Api, found: list[Any]) -> dict[str, str]:
    """pod name -> its node's capacity-type label."""
    return {p.metadata.name: node_labels(api, p.spec.node_name).get(CAPACITY, "-")
            for p in found}


def test_fault_tolerant_pods_run_on_spot_and_others_never_do(
    own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Callable[[str], str],
) -> None:
    ns = tenant_ns("research")
    on_demand = {"a100-on-demand-0"}
    # Four 4-GPU pods that are not fault tolerant, one tolerating the spot taint itself
    # (stripped): the one on-demand node holds two; spot nodes are free, and unused.
    others = [pod(f"serve-{i}", 4) for i in range(3)]
    others.append(pod("serve-3", 4, tolerations=[{"key": CAPACITY, "operator": "Exists"}]))
    out = apply(own_cluster.cp, ns, *others)
    assert out.returncode == 0, out.stderr
    bound = running(api, ns, 2)
    assert {p.spec.node_name for p in bound} == on_demand
    pending = [p for p in pods(api, ns) if p.status.phase == "Pending"]
    assert len(pending) == 2
    event = wait_for_event(api, ns, "Pod", pending[0].metadata.name, "FailedScheduling")
    # The scheduler's own account: the free spot nodes are ruled out by the affinity
    # the webhook added (the untainted one) and by the spot taint (the other).
    assert "didn't match Pod's node affinity/selector" in event.message, event.message

    # Four fault-tolerant 4-GPU pods: bound to the two spot nodes, tainted or not.
    tolerant = [pod(f"sweep-{i}", 4, labels=FAULT_TOLERANT) for i in range(4)]
    out = apply(own_cluster.cp, ns, *tolerant)
    assert out.returncode == 0, out.stderr
    found = running(api, ns, 6)
    where = capacity_of(api, found)
    assert {where[f"sweep-{i}"] for i in range(4)} == {"spot"}
    assert {p.spec.node_name for p in found if p.metadata.name.startswith("sweep")} == {
        "a100-spot-0", "a100-spot-tainted-0"}
    assert {v for k, v in where.items() if k.startswith("serve")} == {"on-demand"}
    # The two others still wait: on-demand is full and spot is not theirs.
    still = [p for p in pods(api, ns) if p.status.phase == "Pending"]
    assert sorted(p.metadata.name for p in still) == sorted(p.metadata.name for p in pending)


def test_a_spot_only_tenants_deployment_runs_on_spot_nodes(
    own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Callable[[str], str],
) -> None:
    ns = tenant_ns("sweeps")
    out = apply(own_cluster.cp, ns, deployment("hpo", 4, 4))
    assert out.returncode == 0, out.stderr
    found = running(api, ns, 4)
    assert set(capacity_of(api, found).values()) == {"spot"}
