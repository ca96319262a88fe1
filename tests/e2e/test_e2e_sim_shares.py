"""Parts of a GPU through DRA on the simulated cluster, with the real scheduler: the real
H200 of tests/e2e/gpucluster/real/h200 is published shareable (allowMultipleAllocations,
memory 143771Mi), and claims of 20Gi of its memory (capacity.requests, Kubernetes'
consumable capacity, beta and on by default since 1.36) are allocated one device
together, each charged 20Gi of 143771Mi, about 1/7 of a GPU, by what the ResourceSlice
says. A tenant not allowed the H200 never gets it, whatever its claim's selector says:
the webhook's product selector leaves the scheduler no device to give. A claim of the
first available of a whole GPU or a share is charged, once allocated, the one it got.

And a plain ``nvidia.com/gpu`` request served by DRA (a DeviceClass's
``extendedResourceName``, KEP-5004: GA and locked on in 1.37) on that H200: the scheduler
makes a claim for the pod itself; the pod is charged its one GPU, the claim nothing.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from e2ekit import GPU_TOLERATION, short_id, to_yaml, wait_until
from gpucluster.fixtures import SimNamespaceFactory, wait_event
from gpucluster.sim import SimCluster
from kubernetes import client as k8s

pytestmark = pytest.mark.e2e

H200_NODE = "h200-dra-0"


def memory_claim(name: str, memory: str, *selectors: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com",
                               "capacity": {"requests": {"memory": memory}}}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"tolerations": [GPU_TOLERATION],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "serve", "image": "registry.local/serve:1",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def apply(sim: SimCluster, ns: str, obj: dict[str, Any], *flags: str) -> tuple[int, str]:
    out = sim.cp.kubectl("apply", *flags, "-n", ns, "-f", "-", input=to_yaml(obj),
                         check=False)
    return out.returncode, out.stdout + out.stderr


def whole_claim(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": count}}]}}}


def first_available(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                {"name": "whole", "deviceClassName": "gpu.nvidia.com"},
                {"name": "part", "deviceClassName": "gpu.nvidia.com",
                 "capacity": {"requests": {"memory": "20Gi"}}}]}]}}}


def used(sim: SimCluster, ns: str) -> str:
    """What the tenant sharing has in use, as the webhook's refusal of a dry-run claim of
    two whole GPUs more says it ("0.57 in use")."""
    code, out = apply(sim, ns, whole_claim("probe", 2), "--dry-run=server")
    assert code != 0, out
    m = re.search(r"tenant sharing would use [0-9.]+ of its 2 GPUs: ([0-9.]+) in use", out)
    assert m is not None, out
    return m.group(1)


def results(sim: SimCluster, ns: str, claim: str) -> list[dict[str, Any]]:
    out = sim.cp.kubectl("get", "resourceclaim", claim, "-n", ns, "-o",
                         "jsonpath={.status.allocation.devices.results}", check=False).stdout
    found: list[dict[str, Any]] = json.loads(out) if out.strip() else []
    return found


EXTENDED_CLASS = "extended.gpu.nvidia.com"


def extended_class() -> dict[str, Any]:
    """A DeviceClass serving plain nvidia.com/gpu requests from the H200's device."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": EXTENDED_CLASS},
            "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel": {
                "expression": "device.driver == 'gpu.nvidia.com' && "
                              "device.attributes['gpu.nvidia.com'].type == 'gpu' && "
                              "device.attributes['gpu.nvidia.com'].productName == "
                              "'NVIDIA H200'"}}]}}


def test_a_gpu_request_served_by_dra_is_charged_once(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
) -> None:
    # Gate DRAExtendedResource: GA and on in 1.37 (a release without it ignores
    # extendedResourceName, the pod never runs, and this test fails).
    assert sim.cp.version.startswith("v1.37"), sim.cp.version
    ns = sim_namespace("sharing")  # 1 GPU, pinned to h200
    sim.cp.kubectl("apply", "-f", "-", input=to_yaml(extended_class()))
    name = f"plain-{short_id()}"
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"containers": [{"name": "serve", "image": "registry.local/serve:1",
                                        "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
        code, out = apply(sim, ns, pod)
        assert code == 0 and "created" in out, out

        def running() -> bool:
            return core.read_namespaced_pod(name, ns).status.phase == "Running"

        wait_until("the nvidia.com/gpu pod to run on DRA", running, timeout=90, every=0.3)
        # No node has nvidia.com/gpu for an H200: the scheduler served it by DRA, writing
        # a claim of its own for the pod (pod.status.extendedResourceClaimStatus).
        raw = json.loads(sim.cp.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout)
        assert raw["spec"]["nodeName"] == H200_NODE
        status = raw["status"]["extendedResourceClaimStatus"]
        claim = status["resourceClaimName"]
        assert status["requestMappings"][0]["resourceName"] == "nvidia.com/gpu"
        got = json.loads(sim.cp.kubectl("get", "resourceclaim", claim, "-n", ns, "-o",
                                        "json").stdout)
        assert "resource.kubernetes.io/extended-resource-claim" in got["metadata"][
            "annotations"]
        (result,) = got["status"]["allocation"]["devices"]["results"]
        assert (result["pool"], result["device"]) == (H200_NODE, "gpu-0")
        # Charged once: the pod's 1 GPU, not again for the scheduler's claim (that would
        # be 2 in use of the tenant's 2).
        code, out = apply(sim, ns, whole_claim("probe", 2), "--dry-run=server")
        assert code != 0
        assert "tenant sharing would use 3 of its 2 GPUs: 1 in use" in out, out
    finally:
        # The device back for the tests after: the pod gone, the scheduler's claim with it.
        sim.cp.kubectl("delete", "pod", name, "-n", ns, "--ignore-not-found",
                       "--timeout=60s", check=False)
        sim.cp.kubectl("delete", "deviceclass", EXTENDED_CLASS, "--ignore-not-found")

    def claim_gone() -> bool:
        out = sim.cp.kubectl("get", "resourceclaims", "-n", ns, "-o", "name").stdout
        return not out.strip()

    wait_until("the scheduler's claim to be deleted with its pod", claim_gone, timeout=60)


def test_four_20gi_claims_share_one_h200_each_charged_a_seventh(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
) -> None:
    ns = sim_namespace("sharing")  # 1 GPU; confined to h200, its default product
    names = [f"kv-{i}-{short_id()}" for i in range(4)]
    for n in names:
        code, out = apply(sim, ns, memory_claim(n, "20Gi"))
        assert code == 0, out
        code, out = apply(sim, ns, claim_pod(n, n))
        assert code == 0 and "created" in out, out

    def all_running() -> bool:
        return all(core.read_namespaced_pod(n, ns).status.phase == "Running" for n in names)

    wait_until("the four pods to run", all_running, timeout=90, every=0.3)
    devices = set()
    for n in names:
        assert core.read_namespaced_pod(n, ns).spec.node_name == H200_NODE
        (result,) = results(sim, ns, n)
        devices.add((result["pool"], result["device"]))
        assert result["consumedCapacity"] == {"memory": "20Gi"}
    assert devices == {(H200_NODE, "gpu-0")}  # one device, four allocations

    # Each holds 20Gi of 143771Mi (0.1425): the four 0.57 of the tenant's 2 GPUs, as a
    # dry run of two whole GPUs more shows (nothing is kept).
    assert used(sim, ns) == "0.57"

    # A claim of the first available of a whole H200 or 20Gi of one: charged its largest
    # alternative at admission (1 GPU), then the 20Gi the scheduler gave it (the device is
    # shared, so not free whole): 0.57 + 0.142 = 0.712 in use.
    either = f"either-{short_id()}"
    code, out = apply(sim, ns, first_available(either))
    assert code == 0, out
    code, out = apply(sim, ns, claim_pod(either, either))
    assert code == 0, out

    def moved() -> bool:
        return used(sim, ns) == "0.712"

    wait_until("the claim's charge to follow the subrequest it got", moved, timeout=60)
    (result,) = results(sim, ns, either)
    assert result["request"] == "gpu/part" and result["device"] == "gpu-0"


def test_a_tenant_without_the_h200_never_gets_one_whatever_it_selects(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
) -> None:
    ns = sim_namespace("dra")  # allowed a100 and h100: the webhook pins its claims to them
    name = f"wants-h200-{short_id()}"
    h200 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"
    code, out = apply(sim, ns, memory_claim(name, "20Gi", h200))
    assert code == 0, out
    code, out = apply(sim, ns, claim_pod(name, name))
    assert code == 0, out
    # The scheduler finds no device both selectors admit: the pod waits, unallocated.
    wait_event(core, ns, "Pod", name, "FailedScheduling")
    assert core.read_namespaced_pod(name, ns).spec.node_name is None
    assert results(sim, ns, name) == []
