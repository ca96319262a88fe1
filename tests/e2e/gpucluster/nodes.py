"""The simulated GPU cluster's objects, from its description (``gpu-cluster.yaml``).

:func:`load` reads the description, :func:`objects` turns it into the Nodes (kwok fake
nodes with GPU Feature Discovery labels, the GPU taint, capacity and allocatable),
ResourceSlices and DeviceClasses a real GPU cluster would have, and :func:`create`
puts them in a cluster and waits until kwok reports every node Ready and the node
lifecycle controller has lifted its ``node.kubernetes.io/*`` taints, so that the
scheduler sees the nodes as they are described. The tests, ``make demo`` and the scale
bench all build their cluster here.

Only the standard library and PyYAML: the demo runs it before anything else is needed.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

HERE = Path(__file__).resolve().parent
DESCRIPTION = HERE / "gpu-cluster.yaml"

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
DRA_DRIVER = "gpu.nvidia.com"
PRODUCT_LABEL = "nvidia.com/gpu.product"
# A fixed namespace for the uuid5 GPU ids: the same node always has the same GPU uuids.
_UUID_NS = uuid.UUID("6f1c0d3e-2b7a-4d55-9a10-5e0c2f9b7a11")


class Kubectl(Protocol):
    """What this module needs of a control plane: kubectl as admin
    (``tests/e2e/controlplane/cluster.py``'s ``ControlPlane`` is one)."""

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]: ...


@dataclass(frozen=True)
class NodeInfo:
    """What a test needs to know about one node: its GPU product and rack."""

    name: str
    group: str
    product: str | None
    rack: str | None
    resources: dict[str, int] = field(default_factory=dict)
    dra: bool = False


@dataclass
class Cluster:
    """A parsed description: the spec as written, and each node it expands to."""

    spec: dict[str, Any]
    nodes: list[NodeInfo]

    @property
    def rack_label(self) -> str:
        return str(self.spec["rackLabel"])

    @property
    def gpu_taint(self) -> dict[str, str]:
        return dict(self.spec["gpuTaint"])

    def node(self, name: str) -> NodeInfo:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def product_of(self, model: str) -> str:
        return str(self.spec["gpuModels"][model]["product"])

    def names(self, *, product: str | None = None, rack: str | None = None,
              resource: str | None = None) -> set[str]:
        """The nodes with this product label, rack and extended resource (each optional)."""
        return {n.name for n in self.nodes
                if (product is None or n.product == product)
                and (rack is None or n.rack == rack)
                and (resource is None or n.resources.get(resource, 0) > 0)}


def load(path: Path = DESCRIPTION, *, gpu_nodes: int | None = None) -> Cluster:
    """Read a description. ``gpu_nodes`` scales it for the bench: the plain GPU groups
    (no MIG, sharing or DRA) are multiplied in proportion so that they hold that many
    nodes in all, keeping their products and racks."""
    doc = yaml.safe_load(path.read_text())
    if doc.get("kind") != "SimulatedGPUCluster":
        raise ValueError(f"{path}: kind must be SimulatedGPUCluster, got {doc.get('kind')!r}")
    spec: dict[str, Any] = doc["spec"]
    if gpu_nodes is not None:
        spec = _scaled(spec, gpu_nodes)
    return Cluster(spec, _expand(spec))


def _plain_gpu(group: dict[str, Any]) -> bool:
    return "gpu" in group and "resources" not in group and not group.get("dra")


def _scaled(spec: dict[str, Any], gpu_nodes: int) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    plain = [g for g in spec["nodeGroups"] if _plain_gpu(g)]
    total = sum(int(g["count"]) for g in plain)
    counts = [int(g["count"]) * gpu_nodes // total for g in plain]
    counts[0] += gpu_nodes - sum(counts)  # rounding goes to the first group
    for g, c in zip(plain, counts, strict=True):
        g["count"] = c
    return spec


def _expand(spec: dict[str, Any]) -> list[NodeInfo]:
    models = spec["gpuModels"]
    out: list[NodeInfo] = []
    for group in spec["nodeGroups"]:
        gpu = group.get("gpu")
        product = str(models[gpu["model"]]["product"]) if gpu else None
        if "resources" in group:
            resources = {str(k): int(v) for k, v in (group["resources"] or {}).items()}
        elif gpu:
            resources = {"nvidia.com/gpu": int(gpu["count"])}
        else:
            resources = {}
        for i in range(int(group["count"])):
            out.append(NodeInfo(f"{group['name']}-{i}", str(group["name"]), product,
                                group.get("rack"), resources, bool(group.get("dra"))))
    return out


def _group(spec: dict[str, Any], name: str) -> dict[str, Any]:
    for g in spec["nodeGroups"]:
        if g["name"] == name:
            return dict(g)
    raise KeyError(name)


def node_object(cluster: Cluster, info: NodeInfo) -> dict[str, Any]:
    """The Node as a GPU node registers itself, labelled by GPU Feature Discovery."""
    spec = cluster.spec
    group = _group(spec, info.group)
    labels: dict[str, str] = {
        "kubernetes.io/hostname": info.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    if info.rack:
        labels[cluster.rack_label] = info.rack
    taints: list[dict[str, str]] = []
    gpu = group.get("gpu")
    if gpu:
        model = spec["gpuModels"][gpu["model"]]
        # The GPU operator's label (from Node Feature Discovery), on every GPU node.
        labels["nvidia.com/gpu.present"] = "true"
        if "real" in model:
            # A real machine's GFD labels, exactly as GFD wrote them.
            labels.update(real_labels(model, group))
        else:
            labels.update({
                PRODUCT_LABEL: str(model["product"]),
                "nvidia.com/gpu.count": str(gpu["count"]),
                "nvidia.com/gpu.memory": str(model["memoryMiB"]),
                "nvidia.com/gpu.family": str(model["family"]),
            })
        taints.append(cluster.gpu_taint)
    # A group's own taints (spot capacity, say), besides the GPU taint.
    taints.extend(dict(t) for t in group.get("taints") or [])
    labels.update({str(k): str(v) for k, v in (group.get("labels") or {}).items()})
    capacity = {str(k): str(v) for k, v in spec["nodeCapacity"].items()}
    capacity.update({k: str(v) for k, v in info.resources.items()})
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": info.name,
            "labels": labels,
            # kwok plays the kubelet of annotated nodes only (--manage-nodes-with-...).
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": taints} if taints else {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }
    return node


def real_labels(model: dict[str, Any], group: dict[str, Any]) -> dict[str, str]:
    """The GFD labels of a real machine (``real/<model>/gfd-labels-mig-<strategy>.txt``),
    for the group's MIG strategy (``migStrategy``, default none). The machine's GPU count
    must be the group's: the labels say how many GPUs the node has."""
    strategy = str(group.get("migStrategy") or "none")
    path = HERE / str(model["real"]) / f"gfd-labels-mig-{strategy}.txt"
    labels: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            labels[key] = value
    if labels.get("nvidia.com/gpu.count") != str(group["gpu"]["count"]):
        raise ValueError(f"node group {group['name']}: {path.name} is of a node with "
                         f"{labels.get('nvidia.com/gpu.count')} GPUs, the group has "
                         f"{group['gpu']['count']}")
    return labels


def real_nvml(model: dict[str, Any]) -> dict[str, Any]:
    """What NVML reports on the real machine of a model (``real/<model>/nvml.json``)."""
    doc: dict[str, Any] = json.loads((HERE / str(model["real"]) / "nvml.json").read_text())
    return doc


def driver_version(text: str) -> str:
    """A version as NVIDIA's DRA driver publishes it: parsed by Masterminds/semver (which
    coerces leading zeros and fills missing parts), printed as semver: ``580.159.04`` ->
    ``580.159.4``, ``9.0`` -> ``9.0.0``."""
    parts = [int(p) for p in text.split(".")]
    parts += [0] * (3 - len(parts))
    return ".".join(str(p) for p in parts[:3])


def pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's PCI bus id as the driver publishes it (go-nvlib's GetPCIBusID): lower case,
    the 8-digit domain's leading ``0000`` cut to the 4-digit BDF form."""
    bus = nvml_bus_id.lower()
    return bus[4:] if bus.startswith("0000") and bus != "0000" else bus


def nvml_device(nvml: dict[str, Any], gpu: dict[str, Any], name: str, gpu_uuid: str,
                shareable: bool) -> dict[str, Any]:
    """One full-GPU device as NVIDIA's DRA kubelet plugin builds it from NVML
    (``cmd/gpu-kubelet-plugin/deviceinfo.go``, ``GpuInfo.Attributes`` and
    ``fullGpuCapacity``): strings as NVML says them, versions as semver, the CUDA driver
    version from NVML's integer (13000 -> 13.0 -> 13.0.0), the PCI bus id under
    Kubernetes' standard attribute, memory as a binary quantity of the bytes. A
    shareable device is allocated to several claims at once, each taking some of its
    memory (``allowMultipleAllocations``, Kubernetes' consumable capacity)."""
    cuda = int(nvml["cudaDriverVersion"])
    device: dict[str, Any] = {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu_uuid},
            "productName": {"string": str(gpu["productName"])},
            "brand": {"string": str(gpu["brand"])},
            "architecture": {"string": str(gpu["architecture"])},
            "cudaComputeCapability": {"version": driver_version(gpu["cudaComputeCapability"])},
            "driverVersion": {"version": driver_version(nvml["driverVersion"])},
            "cudaDriverVersion": {"version": driver_version(f"{cuda // 1000}.{cuda % 1000 // 10}")},
            "resource.kubernetes.io/pciBusID": {"string": pci_bus_id(gpu["pcieBusID"])},
        },
        "capacity": {"memory": {"value": binary_quantity(int(gpu["memoryBytes"]))}},
    }
    if shareable:
        device["allowMultipleAllocations"] = True
    return device


def binary_quantity(n: int) -> str:
    """A byte count as Kubernetes prints a BinarySI quantity: the largest power of 1024
    that divides it (150754820096 -> 143771Mi)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = 1024 ** ("KMGTPE".index(suffix[0]) + 1)
        if n % unit == 0 and n >= unit:
            return f"{n // unit}{suffix}"
    return str(n)


def resource_slice(cluster: Cluster, info: NodeInfo) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's DRA driver publishes for a node: one device per GPU,
    attributes as its kubelet plugin names them (productName is the NVML name, with
    spaces, unlike the dashed node label). A model of a real machine (``real``) has
    that machine's devices, as the driver formats them (:func:`nvml_device`)."""
    group = _group(cluster.spec, info.group)
    model = cluster.spec["gpuModels"][group["gpu"]["model"]]
    devices = []
    for i in range(int(group["gpu"]["count"])):
        gpu_uuid = "GPU-" + str(uuid.uuid5(_UUID_NS, f"{info.name}/{i}"))
        if "real" in model:
            nvml = real_nvml(model)
            gpus = nvml["gpus"]
            real = gpus[i % len(gpus)]
            # The first node is the real machine (its GPUs' UUIDs); others are copies.
            own = str(real["uuid"]) if info.name.endswith("-0") and i < len(gpus) else gpu_uuid
            devices.append(nvml_device(nvml, real, f"gpu-{i}", own,
                                       bool(group.get("shareable"))))
            continue
        devices.append({
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": str(model["nvmlName"])},
                "uuid": {"string": gpu_uuid},
                "index": {"int": i},
                "architecture": {"string": str(model["family"]).title()},
            },
            "capacity": {"memory": {"value": f"{int(model['memoryMiB'])}Mi"}},
        })
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{info.name}-{DRA_DRIVER}"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": info.name,
            "pool": {"name": info.name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def objects(cluster: Cluster) -> list[dict[str, Any]]:
    """Every object of the cluster: DeviceClasses, Nodes, then ResourceSlices."""
    out: list[dict[str, Any]] = [dict(c) for c in cluster.spec.get("deviceClasses") or []]
    out += [node_object(cluster, n) for n in cluster.nodes]
    out += [resource_slice(cluster, n) for n in cluster.nodes if n.dra]
    return out


def _chunks(items: list[dict[str, Any]], size: int) -> Iterable[list[dict[str, Any]]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def create(cp: Kubectl, cluster: Cluster, *, timeout: float = 180.0) -> None:
    """Create the cluster's objects and wait until every node is schedulable as
    described: Ready (kwok), and no taint but its own (the node lifecycle controller
    removes ``node.kubernetes.io/not-ready`` once kwok reports Ready)."""
    objs = objects(cluster)
    # Batches keep each kubectl call's input small for the 500-node bench.
    for batch in _chunks(objs, 100):
        cp.kubectl("create", "-f", "-", input=yaml.safe_dump_all(batch), timeout=120)
    wait_nodes(cp, cluster, timeout=timeout)


def not_ready(cp: Kubectl, cluster: Cluster) -> list[str]:
    """Nodes of the cluster that are not yet Ready or carry a taint not described."""
    out = cp.kubectl("get", "nodes", "-o", "json", timeout=60).stdout
    seen: dict[str, dict[str, Any]] = {n["metadata"]["name"]: n for n in json.loads(out)["items"]}
    waiting = []
    for info in cluster.nodes:
        node = seen.get(info.name)
        if node is None:
            waiting.append(f"{info.name} (absent)")
            continue
        conditions = {c["type"]: c["status"]
                      for c in (node.get("status") or {}).get("conditions") or []}
        own = {cluster.gpu_taint["key"]} | {
            t["key"] for t in _group(cluster.spec, info.group).get("taints") or []}
        extra = [t["key"] for t in node["spec"].get("taints") or [] if t["key"] not in own]
        if conditions.get("Ready") != "True":
            waiting.append(f"{info.name} (Ready={conditions.get('Ready')})")
        elif extra:
            waiting.append(f"{info.name} (taints {extra})")
    return waiting


def wait_nodes(cp: Kubectl, cluster: Cluster, *, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    waiting = not_ready(cp, cluster)
    while waiting:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(waiting)} nodes not ready after {timeout:.0f}s: "
                                 f"{', '.join(waiting[:10])}")
        time.sleep(0.5)
        waiting = not_ready(cp, cluster)
