"""Parts of GPUs asked through DRA, charged by what they consume: a claim of some of a
shareable device's memory (``capacity.requests``) holds that share of the device as the
ResourceSlice publishes it, a partition (``consumesCounters``) the share of its counter
set; once the scheduler allocates the claim, its charge is what it took of the device it
got, on that device's product. The slices are the simulated cluster's real H200
(tests/e2e/gpucluster), the policy the one the cluster runs with."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from webhook.admission import webhooks
from webhook.engine import devices
from webhook.k8s.claims import CLAIM
from webhook.k8s.review import parse_review, request_review
from webhook.k8s.slices import SLICE
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_file
from webhook.quota.claims import ClaimCache
from webhook.quota.store import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
POLICY = compile_policy(load_file(str(ROOT / "tests" / "e2e" / "gpucluster" / "policy.yaml")))
H200_MIB = 143771  # what NVML says of the real H200's memory (real/h200/nvml.json)
GI, MI = 2**30, 2**20
H200_SELECTOR = devices.selector(POLICY, "gpu.nvidia.com", ["NVIDIA-H200"])


def labels(ns: str) -> dict[str, str]:
    return {"gpu.example.com/tenant": ns}


def h200_slice(name: str = "h200-dra-0", *, shareable: bool = True,
               memory: str = f"{H200_MIB}Mi") -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": "gpu-0",
        "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"}},
        "capacity": {"memory": {"value": memory}}}
    if shareable:
        device["allowMultipleAllocations"] = True
    return {"apiVersion": "resource.k8s.io/v1", "kind": SLICE,
            "metadata": {"name": f"{name}-gpu.nvidia.com"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": name,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [device]}}


def memory_claim(name: str, memory: str = "20Gi", uid: str | None = None,
                 namespace: str = "sharing") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": CLAIM,
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                         "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "selectors": [{"cel": {"expression": H200_SELECTOR}}],
                "capacity": {"requests": {"memory": memory}}}}]}}}


def allocated(claim: dict[str, Any], pool: str, device: str = "gpu-0",
              consumed: str | None = "20Gi", request: str = "gpu") -> dict[str, Any]:
    result: dict[str, Any] = {"request": request, "driver": "gpu.nvidia.com", "pool": pool,
                              "device": device}
    if consumed is not None:
        result["consumedCapacity"] = {"memory": consumed}
        result["shareID"] = "6a3c1f0e-share"
    return {**claim, "status": {"allocation": {"devices": {"results": [result]}}}}


def cache(*slices: dict[str, Any]) -> ClaimCache:
    """The claims' cache, watching ResourceSlices; given ``slices``, it has seen them
    (and the end of the first list)."""
    c = ClaimCache(lambda: POLICY, labels)
    c.watch_slices()
    for s in slices:
        c.event(SLICE, "ADDED", s)
    if slices:
        c.event(SLICE, "SYNCED", {})
    return c


def charged(c: ClaimCache, name: str) -> tuple[float, str | None]:
    ch = c.charges[f"uid-{name}"]
    return ch.gpus, ch.product


def test_20gi_of_a_shareable_h200_is_charged_as_that_share_of_it() -> None:
    c = cache(h200_slice())
    c.event(CLAIM, "ADDED", memory_claim("kv-cache"))
    gpus, product = charged(c, "kv-cache")
    assert gpus == pytest.approx(20 * GI / (H200_MIB * MI))  # 0.1424...: about 1/7
    assert 0.14 < gpus < 0.143 and product == "h200"


def test_before_the_slices_are_seen_a_capacity_request_is_charged_a_whole_device() -> None:
    c = cache()
    c.event(CLAIM, "ADDED", memory_claim("kv-cache"))
    assert charged(c, "kv-cache") == (1.0, "h200")  # the device is not known yet
    c.event(SLICE, "ADDED", h200_slice())
    assert charged(c, "kv-cache")[0] == 1.0  # slices not listed yet: charged at SYNCED
    updates = c.event(SLICE, "SYNCED", {})
    assert [u for u, _ in updates] == ["uid-kv-cache"]
    assert charged(c, "kv-cache")[0] == pytest.approx(0.1424, abs=1e-4)


def test_a_product_with_a_device_that_is_not_shareable_charges_a_whole_one() -> None:
    # The scheduler may give the request the unshared device, whole.
    c = cache()
    c.event(SLICE, "ADDED", h200_slice())
    c.event(SLICE, "ADDED", h200_slice("h200-other", shareable=False))
    c.event(SLICE, "SYNCED", {})
    c.event(CLAIM, "ADDED", memory_claim("kv-cache"))
    assert charged(c, "kv-cache")[0] == 1.0


def test_the_smallest_shareable_device_of_the_product_sets_the_share() -> None:
    c = cache()
    c.event(SLICE, "ADDED", h200_slice())
    c.event(SLICE, "ADDED", h200_slice("h200-small", memory="80Gi"))
    c.event(SLICE, "SYNCED", {})
    c.event(CLAIM, "ADDED", memory_claim("kv-cache"))
    assert charged(c, "kv-cache")[0] == pytest.approx(0.25)


def test_an_allocated_claim_is_charged_what_it_took_of_the_device_it_got() -> None:
    c = cache(h200_slice())
    # The device's requestPolicy rounded 20Gi up to 24Gi: consumedCapacity says so.
    c.event(CLAIM, "MODIFIED", allocated(memory_claim("kv-cache"), "h200-dra-0",
                                         consumed="24Gi"))
    assert charged(c, "kv-cache") == (pytest.approx(24 * GI / (H200_MIB * MI)), "h200")


def test_a_whole_device_allocated_for_a_request_without_capacity_is_one_gpu() -> None:
    c = cache(h200_slice())
    whole = memory_claim("whole")
    del whole["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    c.event(CLAIM, "MODIFIED", allocated(whole, "h200-dra-0", consumed=None))
    assert charged(c, "whole") == (1.0, "h200")


def partition_slice() -> dict[str, Any]:
    """A GPU published as partitions (KEP-4815, as NVIDIA's driver does for dynamic
    MIG): one counter set per GPU, each MIG device consuming from it."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": SLICE,
            "metadata": {"name": "h200-parts"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "h200-parts",
                     "pool": {"name": "h200-parts", "generation": 1, "resourceSliceCount": 1},
                     "sharedCounters": [{"name": "gpu-0-counter-set", "counters": {
                         "memory": {"value": "140Gi"},
                         "multiprocessors": {"value": "132"},
                         **{f"memory-slice-{i}": {"value": "1"} for i in range(8)}}}],
                     "devices": [{
                         "name": "gpu-0-mig-1g18gb-19-0",
                         "attributes": {"type": {"string": "mig"},
                                        "profile": {"string": "1g.18gb"},
                                        "productName": {"string": "NVIDIA H200"}},
                         "consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": {
                             "memory": {"value": "16Gi"},
                             "multiprocessors": {"value": "16"},
                             "memory-slice-0": {"value": "1"}}}]}]}}


def test_a_partition_is_charged_the_share_of_its_counter_set_it_takes() -> None:
    c = cache(partition_slice())
    mig = memory_claim("slice")
    mig["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": "mig.nvidia.com"}
    c.event(CLAIM, "MODIFIED", allocated(mig, "h200-parts", "gpu-0-mig-1g18gb-19-0",
                                         consumed=None))
    # 1 of 8 memory slices is the most it takes (16 of 132 SMs, 16Gi of 140Gi are less).
    assert charged(c, "slice") == (pytest.approx(0.125), "h200")


def test_a_first_available_claim_is_charged_the_subrequest_and_product_it_got() -> None:
    c = cache(h200_slice())
    either = memory_claim("either")
    either["spec"]["devices"]["requests"][0] = {"name": "gpu", "firstAvailable": [
        {"name": "whole", "deviceClassName": "gpu.nvidia.com", "count": 2},
        {"name": "part", "deviceClassName": "gpu.nvidia.com",
         "capacity": {"requests": {"memory": "40Gi"}}}]}
    c.event(CLAIM, "ADDED", either)
    assert charged(c, "either")[0] == 2.0  # before allocation: the largest alternative
    c.event(CLAIM, "MODIFIED", allocated(either, "h200-dra-0", consumed="40Gi",
                                         request="gpu/part"))
    assert charged(c, "either") == (pytest.approx(40 * GI / (H200_MIB * MI)), "h200")


def test_admission_charges_a_capacity_claim_its_share_against_the_quota() -> None:
    # The sharing tenant has 2 GPUs: fourteen 20Gi claims fit (14 x 0.1424 = 1.994), a
    # fifteenth does not.
    c = cache(h200_slice())
    store = MemoryStore()

    def admit(name: str) -> Any:
        obj = memory_claim(name)
        req = parse_review(orjson.dumps(request_review(obj, uid=f"req-{name}")))
        return asyncio.run(webhooks.validating(
            req, POLICY, webhooks.Cluster(labels, store, claims=c.lookup)))

    for i in range(14):
        d = admit(f"part-{i}")
        assert d.allowed, d.message
    assert store.view().tenant("sharing").gpus == pytest.approx(14 * 20 * GI / (H200_MIB * MI))
    over = admit("part-14")
    assert not over.allowed
    assert "tenant sharing would use 2.137 of its 2 GPUs: 1.994 in use" in over.message


def test_counter_sets_in_a_slice_of_their_own_count_for_the_pools_devices() -> None:
    # From Kubernetes 1.35 NVIDIA's driver publishes a pool's counter sets and its devices
    # in different slices: the share is found across them.
    whole = partition_slice()
    sets = {**whole, "metadata": {"name": "h200-parts-counters"},
            "spec": {**whole["spec"], "devices": [],
                     "pool": {**whole["spec"]["pool"], "resourceSliceCount": 2}}}
    parts = {**whole, "spec": {k: v for k, v in whole["spec"].items() if k != "sharedCounters"}}
    c = cache()
    c.event(SLICE, "ADDED", parts)
    c.event(SLICE, "ADDED", sets)
    c.event(SLICE, "SYNCED", {})
    mig = memory_claim("slice")
    mig["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": "mig.nvidia.com"}
    c.event(CLAIM, "MODIFIED", allocated(mig, "h200-parts", "gpu-0-mig-1g18gb-19-0",
                                         consumed=None))
    assert charged(c, "slice") == (pytest.approx(0.125), "h200")
    # The counter set gone, the partition is held whole (what it takes is not known).
    c.event(SLICE, "DELETED", sets)
    assert charged(c, "slice") == (1.0, "h200")
