"""The simulated cluster's H200 nodes are the real machine of tests/e2e/gpucluster/real/h200:
their GPU Feature Discovery labels are exactly the ones GFD wrote there, and their
ResourceSlice devices carry what NVIDIA's DRA driver publishes from its NVML facts, in
the driver's formats (versions as semver, memory as a binary quantity). No control plane:
the objects are built, not created."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "e2e" / "gpucluster" / "real" / "h200"


def _nodes() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpucluster_nodes", ROOT / "tests" / "e2e" / "gpucluster" / "nodes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


nodes = _nodes()
CLUSTER = nodes.load()


def gfd(strategy: str) -> dict[str, str]:
    lines = (REAL / f"gfd-labels-mig-{strategy}.txt").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip())


def labels_of(name: str) -> dict[str, str]:
    labels: dict[str, str] = nodes.node_object(CLUSTER, CLUSTER.node(name))["metadata"]["labels"]
    return labels


@pytest.mark.parametrize(("node", "strategy"), [("h200-dra-0", "none"), ("h200-mig-0", "mixed")])
def test_an_h200_nodes_gfd_labels_are_exactly_the_real_machines(node: str, strategy: str) -> None:
    labels = labels_of(node)
    real = gfd(strategy)
    gfd_written = {k: v for k, v in labels.items()
                   if k.startswith("nvidia.com/") and k != "nvidia.com/gpu.present"}
    assert gfd_written == real
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"


def test_the_mig_node_offers_the_real_profile_names_as_resources() -> None:
    node = nodes.node_object(CLUSTER, CLUSTER.node("h200-mig-0"))
    mig = {k: v for k, v in node["status"]["allocatable"].items() if "mig-" in k}
    assert mig == {"nvidia.com/mig-1g.18gb": "7"}
    # The profile and its instance count are the real GPU's (mig-profiles.txt).
    profiles = {line.split()[0]: int(line.split()[2])
                for line in (REAL / "mig-profiles.txt").read_text().splitlines()
                if line and not line.startswith("#")}
    assert profiles["1g.18gb"] == 7


def device() -> dict[str, Any]:
    slice_ = nodes.resource_slice(CLUSTER, CLUSTER.node("h200-dra-0"))
    assert slice_["spec"]["driver"] == "gpu.nvidia.com"
    (dev,) = slice_["spec"]["devices"]
    out: dict[str, Any] = dev
    return out


def test_the_dra_device_has_the_attributes_the_driver_publishes_from_nvml() -> None:
    nvml = json.loads((REAL / "nvml.json").read_text())
    gpu = nvml["gpus"][0]
    dev = device()
    assert dev["name"] == "gpu-0"
    assert dev["attributes"] == {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu["uuid"]},
        "productName": {"string": "NVIDIA H200"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        # semver, as the driver prints NVML's strings (Masterminds/semver coerces "04").
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.159.4"},
        "cudaDriverVersion": {"version": "13.0.0"},  # NVML's 13000
        "resource.kubernetes.io/pciBusID": {"string": "0000:00:06.0"},
    }
    # Memory as a quantity of the bytes NVML reports: 150754820096 B = 143771 MiB.
    assert dev["capacity"] == {"memory": {"value": "143771Mi"}}
    assert gpu["memoryBytes"] == 143771 * 2**20
    assert dev["allowMultipleAllocations"] is True


def test_a_group_whose_gpu_count_is_not_the_real_machines_is_refused() -> None:
    group = {"name": "h200-x8", "gpu": {"model": "h200", "count": 8}}
    with pytest.raises(ValueError, match=r"h200-x8: gfd-labels-mig-none\.txt is of a node with 1"):
        nodes.real_labels(CLUSTER.spec["gpuModels"]["h200"], group)
