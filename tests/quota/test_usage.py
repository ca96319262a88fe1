"""Quota arithmetic: what a pod is charged and how usage adds up per tenant."""

from __future__ import annotations

import pytest
from quotakit import pod, policy

from webhook.engine.charge import charge_of_pod, owner_of
from webhook.k8s.identity import ObjectId
from webhook.quota.usage import Usage


@pytest.mark.parametrize(
    ("init", "main", "expected"),
    [
        ([], 2, 2.0),
        # A plain init container runs alone: the pod is charged the larger of the two.
        ([{"name": "warm", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}}}],
         2, 4.0),
        ([{"name": "warm", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
         2, 2.0),
        # A restartable sidecar runs beside the app containers: it adds up.
        ([{"name": "side", "image": "x", "restartPolicy": "Always",
           "resources": {"limits": {"nvidia.com/gpu": 1}}}], 2, 3.0),
        # An init container after a sidecar runs with that sidecar.
        ([{"name": "side", "image": "x", "restartPolicy": "Always",
           "resources": {"limits": {"nvidia.com/gpu": 1}}},
          {"name": "warm", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}}}],
         2, 5.0),
    ],
)
def test_charge_uses_the_effective_request(init: list, main: int, expected: float) -> None:
    charge = charge_of_pod(pod("p", gpus=main, init=init), policy())
    assert charge is not None
    assert charge.resources == {"nvidia.com/gpu": expected}
    assert charge.gpus == expected


def test_weights_turn_mig_slices_into_gpu_equivalents() -> None:
    charge = charge_of_pod(pod("nb", gpus=4, resource="nvidia.com/mig-1g.10gb"), policy())
    assert charge is not None
    assert charge.resources == {"nvidia.com/mig-1g.10gb": 4.0}
    assert charge.gpus == 0.5


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_terminal_pods_hold_no_quota(phase: str) -> None:
    assert charge_of_pod(pod("done", phase=phase), policy()) is None


@pytest.mark.parametrize("phase", ["Pending", "Running", None])
def test_live_pods_hold_quota(phase: str | None) -> None:
    assert charge_of_pod(pod("live", phase=phase), policy()) is not None


def test_pods_outside_tenants_and_without_gpus_are_not_charged() -> None:
    assert charge_of_pod(pod("x", namespace="elsewhere"), policy()) is None
    cpu = pod("cpu")
    cpu["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}}
    assert charge_of_pod(cpu, policy()) is None


def test_product_comes_from_the_pinned_node_affinity() -> None:
    assert charge_of_pod(pod("a", product="A100"), policy()).product == "a100"  # type: ignore[union-attr]
    assert charge_of_pod(pod("h", product="H100"), policy()).product == "h100"  # type: ignore[union-attr]
    assert charge_of_pod(pod("n", product=None), policy()).product is None  # type: ignore[union-attr]


def test_a_tenant_spans_its_namespaces_and_each_namespace_keeps_its_own_total() -> None:
    p = policy()
    usage = Usage()
    for name, ns, n in [("a", "team-a", 2), ("b", "team-a-dev", 1), ("c", "team-b", 3)]:
        usage.put(name, charge_of_pod(pod(name, ns, n), p))
    assert usage.tenant("team-a").gpus == 3
    assert usage.tenant("team-a").pods == 2
    assert usage.namespace("team-a-dev").gpus == 1
    assert usage.tenant("team-b").resources == {"nvidia.com/gpu": 3.0}
    usage.put("a", None)  # the pod is gone
    assert usage.tenant("team-a").gpus == 1
    assert usage.tenant("team-a").products == {"a100": 1.0}
    usage.put("b", charge_of_pod(pod("b", "team-a-dev", 2), p))  # the pod changed
    assert usage.tenant("team-a").gpus == 2
    assert usage.namespace("team-a-dev").pods == 1


def test_owner_names_follow_the_controller() -> None:
    job_pod = pod("llm-0", owner=("Job", "llm-pretrain"))
    assert owner_of(ObjectId.of(job_pod)) == "job/llm-pretrain"
    rs_pod = pod("web-5d8f-abc", owner=("ReplicaSet", "web-5d8f"))
    rs_pod["metadata"]["labels"] = {"pod-template-hash": "5d8f"}
    assert owner_of(ObjectId.of(rs_pod)) == "deployment/web"
    assert owner_of(ObjectId.of(pod("notebook-x"))) == "pod/notebook-x"
