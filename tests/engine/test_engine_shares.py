"""GPUs shared outside Kubernetes' own types, charged by the share of a GPU they take.

Time-slicing (``gpuResources.timeSlicing``): the NVIDIA device plugin advertises each GPU
as ``replicas`` units of a resource (``nvidia.com/gpu.shared`` with ``renameByDefault``);
one unit is charged 1/replicas of a GPU, against the caps whole GPUs count against.
"""

from __future__ import annotations

import pytest
from enginekit import (
    GPU_TOLERATION,
    PRODUCT_LABEL,
    RACK_LABEL,
    VOID_ENTRY,
    container,
    example_policy,
    example_variant,
    gpus,
    gpus_charged,
    mutate_checked,
    node_terms,
    pod,
    validated,
)

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


# --- KAI-Scheduler --------------------------------------------------------------------

# The example policy (research: defaultProduct a100, racks, the void routes rule) with
# KAI fractions on, an A100 80GB's memory for gpu-memory.
KAI_ON = ("    patterns: [\"nvidia.com/mig-*\"]\n",
          "    patterns: [\"nvidia.com/mig-*\"]\n    kai: {deviceMemory: 81920}\n")


def kai_policy() -> CompiledPolicy:
    return example_variant(KAI_ON)


def kai_pod(*containers: dict[str, object], **annotations: str) -> dict[str, object]:
    return pod(*(containers or (container("vllm"),)), annotations=annotations)


@pytest.mark.parametrize(("annotations", "charged"), [
    ({"gpu-fraction": "0.5"}, 0.5),
    ({"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"}, 0.5),
    ({"gpu-memory": "20480"}, 0.25),                 # 20Gi of an 80Gi device
    ({"gpu-memory": "20480", "gpu-fraction-num-devices": "4"}, 1.0),
    ({"gpu-memory": "163840"}, 1.0),                 # never more than the device
])
def test_a_kai_fraction_is_charged_its_share_of_a_gpu(annotations: dict[str, str],
                                                      charged: float) -> None:
    assert gpus_charged(kai_pod(**annotations), kai_policy()) == pytest.approx(charged)


def test_without_kai_a_fraction_is_no_gpu_pod() -> None:
    assert gpus_charged(kai_pod(**{"gpu-fraction": "0.5"}), example_policy()) == 0.0


def test_a_kai_fraction_pod_is_placed_as_the_tenants_gpu_pods() -> None:
    m = mutate_checked(kai_pod(**{"gpu-fraction": "0.5"}), kai_policy())
    assert m.decision.allowed
    # Pinned to the tenant's default product and racks, given the GPU toleration...
    assert {"gpu-tolerations", "gpu-node-affinity"} <= set(m.decision.mutations)
    assert GPU_TOLERATION in m.patched["spec"]["tolerations"]
    keys = {e["key"] for t in node_terms(m.patched) for e in t["matchExpressions"]}
    assert {PRODUCT_LABEL, RACK_LABEL} <= keys
    # ...and its container, the one KAI gives the fraction, keeps the GPU: not void.
    assert VOID_ENTRY not in m.patched["spec"]["containers"][0].get("env", [])
    assert validated(m.patched, kai_policy()).allowed


def test_only_the_container_kai_gives_the_fraction_keeps_the_gpu() -> None:
    p = kai_pod(container("proxy"), container("vllm"),
                **{"gpu-fraction": "0.5", "gpu-fraction-container-name": "vllm"})
    m = mutate_checked(p, kai_policy())
    proxy, vllm = m.patched["spec"]["containers"]
    assert proxy.get("env") == [VOID_ENTRY]
    assert VOID_ENTRY not in vllm.get("env", [])
    first = mutate_checked(kai_pod(container("vllm"), container("proxy"),
                                   **{"gpu-memory": "4096"}), kai_policy())
    vllm, proxy = first.patched["spec"]["containers"]
    assert VOID_ENTRY not in vllm.get("env", [])
    assert proxy.get("env") == [VOID_ENTRY]


def test_kai_fractions_count_towards_the_per_pod_cap() -> None:
    # research: maxGpusPerPod 8; 9 devices of 0.5 each are 4.5 GPUs, 17 x 0.5 are 8.5.
    fine = kai_pod(**{"gpu-fraction": "0.5", "gpu-fraction-num-devices": "9"})
    over = kai_pod(**{"gpu-fraction": "0.5", "gpu-fraction-num-devices": "17"})
    assert validated(mutate_checked(fine, kai_policy()).patched, kai_policy()).allowed
    d = validated(mutate_checked(over, kai_policy()).patched, kai_policy())
    assert not d.allowed
    assert Rule.MAX_PER_POD in {f.rule for f in d.findings}


@pytest.mark.parametrize("annotations", [
    {"gpu-fraction": "1.5"}, {"gpu-fraction": "half"}, {"gpu-memory": "-1"},
    {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"},
])
def test_an_unreadable_kai_fraction_is_refused_and_charged_whole(
        annotations: dict[str, str]) -> None:
    p = kai_pod(**annotations)
    d = validated(mutate_checked(p, kai_policy()).patched, kai_policy())
    assert not d.allowed
    assert any(f.rule is Rule.GPU_QUANTITY and "KAI-Scheduler" in f.message
               for f in d.findings)
    assert gpus_charged(p, kai_policy()) >= 1.0


def test_hami_shares_only_the_gpus_of_the_tenants_it_names() -> None:
    text = ("apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\nmetadata: {name: s}\n"
            "spec:\n  gpuResources:\n    hami: {deviceMemory: 81920, tenants: [inference]}\n"
            "  tenants:\n    - {name: inference, namespaces: [inference]}\n"
            "    - {name: research, namespaces: [research]}\n")
    p = compile_policy(load_text(text, "s"))
    shared = hami_pod(1, memory=20480)
    assert gpus_charged(shared, p) == 1.0  # research: its nvidia.com/gpu are whole GPUs
    inference = {**shared, "metadata": {"name": "v", "namespace": "inference"}}
    assert gpus_charged(inference, p) == 0.25
    with pytest.raises(PolicyError, match="tenant 'serving' is not defined"):
        load_text(text.replace("tenants: [inference]", "tenants: [serving]"), "s")
