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


# --- HAMi -----------------------------------------------------------------------------

HAMI = shares_policy("    hami: {deviceMemory: 81920}\n",
                     "      maxGpusPerPod: 1\n      quota: {gpus: 2}\n")


def hami_pod(vgpus: int = 1, **shares: int) -> dict[str, object]:
    names = {"memory": "nvidia.com/gpumem", "percent": "nvidia.com/gpumem-percentage",
             "cores": "nvidia.com/gpucores"}
    limits = {"nvidia.com/gpu": vgpus, **{names[k]: v for k, v in shares.items()}}
    return pod(container(limits=limits))


@pytest.mark.parametrize(("vgpus", "shares", "charged"), [
    (1, {"memory": 20480, "cores": 10}, 0.25),       # 20Gi of 80Gi is the larger share
    (1, {"memory": 8192, "cores": 30}, 0.3),         # 30% of the cores is
    (2, {"memory": 20480}, 0.5),                     # per vGPU, each on its own device
    (1, {"percent": 50, "cores": 20}, 0.5),
    (1, {"memory": 163840}, 1.0),                    # never more than the device
    (1, {"cores": 30}, 1.0),                         # no memory named: HAMi gives it all
    (1, {}, 1.0),                                    # a plain vGPU: a whole device
])
def test_a_hami_vgpu_is_charged_its_larger_share_of_a_device(
        vgpus: int, shares: dict[str, int], charged: float) -> None:
    assert gpus_charged(hami_pod(vgpus, **shares), HAMI) == pytest.approx(charged)


def test_without_hami_the_same_pod_is_charged_whole_gpus() -> None:
    plain = shares_policy("    names: [nvidia.com/gpu]\n")
    assert gpus_charged(hami_pod(2, memory=20480), plain) == 2.0


def test_hami_memory_without_the_device_memory_is_charged_a_whole_device() -> None:
    p = shares_policy("    hami: {}\n")
    assert gpus_charged(hami_pod(1, memory=20480), p) == 1.0
    assert gpus_charged(hami_pod(1, percent=25), p) == 0.25


def test_maximums_count_hami_vgpus_by_their_share() -> None:
    # Four vGPUs of a quarter each are one GPU-equivalent: within maxGpusPerPod 1.
    assert validated(hami_pod(4, memory=20480), HAMI).allowed
    over = validated(hami_pod(4, memory=24576), HAMI)
    assert not over.allowed
    assert Rule.MAX_PER_POD in {f.rule for f in over.findings}


def test_a_bad_hami_share_is_refused_with_its_name() -> None:
    d = validated(hami_pod(1, memory="lots"), HAMI)  # type: ignore[arg-type]
    assert not d.allowed
    assert any(f.rule is Rule.GPU_QUANTITY and "nvidia.com/gpumem" in f.message
               for f in d.findings)


def test_hami_resource_must_be_a_gpu_resource() -> None:
    with pytest.raises(PolicyError, match=r"hami\.resource"):
        shares_policy("    names: [nvidia.com/gpu]\n    hami: {resource: nvidia.com/vgpu}\n")
