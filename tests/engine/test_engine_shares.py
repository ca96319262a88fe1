"""GPUs shared outside Kubernetes' own types, charged by the share of a GPU they take.

Time-slicing (``gpuResources.timeSlicing``): the NVIDIA device plugin advertises each GPU
as ``replicas`` units of a resource (``nvidia.com/gpu.shared`` with ``renameByDefault``);
one unit is charged 1/replicas of a GPU, against the caps whole GPUs count against.
"""

from __future__ import annotations

import pytest
from enginekit import container, gpus, gpus_charged, mutate_checked, pod, validated

from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import PolicyError, load_text
from webhook.policy.model import Rule

SHARED = "nvidia.com/gpu.shared"


def shares_policy(gpu_resources: str, tenant: str = "") -> CompiledPolicy:
    text = ("apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\nmetadata: {name: shares}\n"
            "spec:\n  gpuResources:\n" + gpu_resources +
            "  tenants:\n    - name: research\n      namespaces: [research]\n" + tenant)
    return compile_policy(load_text(text, "shares"))


TIME_SLICED = shares_policy("    timeSlicing: {nvidia.com/gpu.shared: 4}\n",
                            "      maxGpusPerPod: 1\n")


# --- time-slicing ---------------------------------------------------------------------

@pytest.mark.parametrize(("units", "charged"), [(1, 0.25), (2, 0.5), (4, 1.0)])
def test_a_time_sliced_unit_is_charged_one_replica_of_a_gpu(units: int, charged: float) -> None:
    assert gpus_charged(pod(container(limits=gpus(units, SHARED))), TIME_SLICED) == charged


def test_a_time_sliced_resource_is_a_gpu_resource_without_being_named() -> None:
    # Not in gpuResources.names, yet its pod gets the GPU pod's requests completed.
    m = mutate_checked(pod(container(limits=gpus(1, SHARED))), TIME_SLICED)
    assert m.decision.allowed
    assert m.patched["spec"]["containers"][0]["resources"]["requests"] == {SHARED: 1}


def test_maximums_count_time_sliced_units_in_gpu_equivalents() -> None:
    assert validated(pod(container(limits=gpus(4, SHARED))), TIME_SLICED).allowed
    five = validated(pod(container(limits=gpus(5, SHARED))), TIME_SLICED)
    assert not five.allowed
    assert Rule.MAX_PER_POD in {f.rule for f in five.findings}


def test_a_time_sliced_mig_slice_weighs_its_slice_over_the_replicas() -> None:
    p = shares_policy("    patterns: ['nvidia.com/mig-*']\n"
                      "    weights: {nvidia.com/mig-1g.10gb: 0.125}\n"
                      "    timeSlicing: {nvidia.com/mig-1g.10gb: 2}\n")
    assert gpus_charged(pod(container(limits=gpus(1, "nvidia.com/mig-1g.10gb"))), p) == 0.0625


def test_whole_gpus_beside_time_sliced_ones_weigh_one() -> None:
    both = pod(container(limits={**gpus(1), **gpus(2, SHARED)}))
    assert gpus_charged(both, TIME_SLICED) == 1.5


def test_without_time_slicing_the_resource_is_no_gpu() -> None:
    p = shares_policy("    names: [nvidia.com/gpu]\n")
    assert gpus_charged(pod(container(limits=gpus(1, SHARED))), p) == 0.0


@pytest.mark.parametrize("replicas", [0, 1025, "four"])
def test_replicas_out_of_range_are_refused(replicas: object) -> None:
    with pytest.raises(PolicyError, match="timeSlicing"):
        shares_policy(f"    timeSlicing: {{nvidia.com/gpu.shared: {replicas}}}\n")
