"""Fixtures and helpers of the tests that run on the simulated GPU cluster.

``sim`` (session): one :class:`~gpucluster.sim.SimCluster` (scheduler, controllers, kwok
nodes, the webhook with ``policy.yaml``), separate from the suite's controller-free
control plane, and started only when a test asks for it. ``sim_namespace(tenant)``: a
fresh namespace joined to ``tenant``, deleted when the test ends, and waited for until its
pods are gone (so their GPUs are free for the next test): with a namespace controller and
kwok, deletion finishes here.

The helpers read what the cluster did through the Kubernetes client (pods, nodes,
events), polling on conditions with a deadline, never sleeping for an ordering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2ekit import short_id, wait_until
from gpucluster.sim import SimCluster
from kubernetes import client as k8s
from kubernetes import config as k8s_config

# The simulated cluster starts its pods in a second or two, but the machine is shared
# (2 cores, other suites running): deadlines are generous, and only ever waited out on
# failure.
SCHEDULE_TIMEOUT = 90.0

EXEMPT = "sim-exempt"  # policy.yaml: exemptions.namespaces (the webhook never sees it)


@contextmanager
def started(cluster: SimCluster) -> Iterator[SimCluster]:
    """``cluster`` started, and stopped when the block ends."""
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def core_api(cluster: SimCluster) -> k8s.CoreV1Api:
    """The Kubernetes client's core API, as admin on ``cluster``."""
    return k8s.CoreV1Api(k8s_config.new_client_from_config(
        config_file=str(cluster.cp.kubeconfig)))


@contextmanager
def namespaces(cluster: SimCluster, core: k8s.CoreV1Api, name: Callable[[str | None], str]
               ) -> Iterator[Callable[[str | None], str]]:
    """``make(tenant)``: a fresh namespace of the tenant (named by ``name``) on
    ``cluster``; each is deleted when the block ends, and its pods waited for."""
    made: list[str] = []

    def make(tenant: str | None) -> str:
        made.append(cluster.namespace(name(tenant), tenant))
        return made[-1]

    yield make
    for ns in made:
        cluster.cp.kubectl("delete", "namespace", ns, "--wait=false")
    # Waiting for the pods is enough: once they are gone their GPUs are free for the next
    # test. The namespace itself goes a few seconds later (the namespace controller
    # requeues it after its pods' deletion); every test makes new ones.
    for ns in made:
        wait_until(f"the pods of namespace {ns} to be deleted",
                   lambda n=ns: not pods(core, n), timeout=SCHEDULE_TIMEOUT, every=0.3)


# ------------------------------------------------------------ a cluster of a module's own


def a100_cluster(name: str, group: str, nodes: int, gpus: int) -> dict[str, Any]:
    """A simulated cluster of one group of A100 nodes in rack-a (``nodes`` of ``gpus``
    GPUs each), for a module that needs a cluster and policy of its own."""
    return {
        "apiVersion": "gpu-webhook.dev/v1alpha1", "kind": "SimulatedGPUCluster",
        "metadata": {"name": name},
        "spec": {
            "rackLabel": "topology.example.com/gpu-rack",
            "gpuTaint": {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            "nodeCapacity": {"cpu": "96", "memory": "1Ti", "pods": "110",
                             "ephemeral-storage": "4Ti"},
            "gpuModels": {"a100": {"product": "NVIDIA-A100-SXM4-80GB",
                                   "nvmlName": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920,
                                   "family": "ampere"}},
            "nodeGroups": [{"name": group, "count": nodes, "rack": "rack-a",
                            "gpu": {"model": "a100", "count": gpus}}],
        },
    }


def own_policy(name: str, tenants: str, spec: str = "") -> str:
    """The GPUPolicy of such a module: the GPU taint tolerated, the control plane's
    namespaces exempt, the e2e probe's tenant ``research``, then ``tenants`` (YAML list
    items indented as under ``tenants:``); ``spec``: more of the spec (indented as under
    ``spec:``)."""
    return f"""\
apiVersion: gpu-webhook.dev/v1alpha1
kind: GPUPolicy
metadata: {{name: {name}}}
spec:
{spec}  tolerations:
    - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}
  exemptions:
    namespaces: [kube-system, gpu-webhook]
  tenants:
    - name: research          # the e2e probe's namespace (e2ekit.wait_installed)
      namespaceSelector:
        matchLabels: {{gpu.example.com/tenant: research}}
""" + tenants


def own_sim(work: Path, cluster: dict[str, Any], policy: str, **options: Any) -> SimCluster:
    """Such a module's simulated cluster in ``work``: its description and policy written
    there (``options`` as SimCluster takes them); started by the caller
    (``with started(own_sim(...))``)."""
    (work / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    (work / "policy.yaml").write_text(policy)
    return SimCluster(work, policy=work / "policy.yaml", description=work / "cluster.yaml",
                      **options)


@pytest.fixture(scope="session")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    """The simulated GPU cluster with the webhook installed, for the whole session."""
    with started(SimCluster(tmp_path_factory.mktemp("gpu-sim"))) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def core(sim: SimCluster) -> k8s.CoreV1Api:
    """The Kubernetes client's core API, as admin on the simulated cluster."""
    return core_api(sim)


SimNamespaceFactory = Callable[[str | None], str]


@pytest.fixture
def sim_namespace(sim: SimCluster, core: k8s.CoreV1Api) -> Iterator[SimNamespaceFactory]:
    with namespaces(sim, core, lambda t: f"sim-{t or 'none'}-{short_id()}") as make:
        yield make


# The fixtures of a module that starts a cluster of its own: it defines the module-scoped
# fixture ``own_cluster`` (``with started(own_sim(...)) as cluster: yield cluster``), and
# its tests ask for these.


@pytest.fixture(scope="module")
def api(own_cluster: SimCluster) -> k8s.CoreV1Api:
    """The Kubernetes client's core API, as admin on the module's ``own_cluster``."""
    return core_api(own_cluster)


@pytest.fixture
def tenant_ns(own_cluster: SimCluster, api: k8s.CoreV1Api) -> Iterator[SimNamespaceFactory]:
    """``tenant_ns(tenant)``: a fresh namespace of the tenant on the module's
    ``own_cluster``, deleted (and its pods waited for) when the test ends, so that the
    next test starts with the nodes' GPUs free."""
    with namespaces(own_cluster, api, lambda t: f"{t}-{short_id()}") as make:
        yield make


@pytest.fixture
def exempt(sim: SimCluster) -> Iterator[list[str]]:
    """The exempt namespace; the pods a test names in the list are deleted after it."""
    sim.namespace(EXEMPT, None)
    made: list[str] = []
    yield made
    for name in made:
        sim.cp.kubectl("delete", "pod", name, "-n", EXEMPT, "--wait=false",
                       "--ignore-not-found")


# --------------------------------------------------------------------------- reading


def pods(core: k8s.CoreV1Api, namespace: str, selector: str = "") -> list[Any]:
    items: list[Any] = core.list_namespaced_pod(namespace, label_selector=selector).items
    return items


def running(core: k8s.CoreV1Api, namespace: str, count: int, selector: str = "",
            timeout: float = SCHEDULE_TIMEOUT) -> list[Any]:
    """Wait until ``count`` pods (matching ``selector``) are Running and return them."""
    found: list[Any] = []

    def ok() -> bool:
        nonlocal found
        found = [p for p in pods(core, namespace, selector) if p.status.phase == "Running"]
        return len(found) >= count

    wait_until(f"{count} running pods in {namespace} ({selector or 'all'})", ok,
               timeout=timeout, every=0.3)
    return found


def node_labels(core: k8s.CoreV1Api, name: str) -> dict[str, str]:
    labels: dict[str, str] = core.read_node(name).metadata.labels or {}
    return labels


def events(core: k8s.CoreV1Api, namespace: str, kind: str, name: str) -> list[Any]:
    """Events about one object (``kubectl describe`` shows the same)."""
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    items: list[Any] = core.list_namespaced_event(namespace, field_selector=selector).items
    return items


def wait_event(core: k8s.CoreV1Api, namespace: str, kind: str, name: str, reason: str,
               timeout: float = SCHEDULE_TIMEOUT) -> Any:
    """Wait for an event with ``reason`` about the object and return it."""
    found: list[Any] = []

    def ok() -> bool:
        found[:] = [e for e in events(core, namespace, kind, name) if e.reason == reason]
        return bool(found)

    wait_until(f"a {reason} event on {kind} {namespace}/{name}", ok, timeout=timeout,
               every=0.3)
    return found[0]


def requested_on(core: k8s.CoreV1Api, node: str, resource: str) -> int:
    """Devices of ``resource`` that the pods bound to ``node`` (and not ended) hold."""
    held = 0
    for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
        if p.status.phase in ("Succeeded", "Failed"):
            continue
        for c in p.spec.containers:
            held += int(((c.resources.requests or {}) if c.resources else {}).get(resource, 0))
    return held


# --------------------------------------------------------------------------- objects


def pod_spec(count: int | str = 1, resource: str = "nvidia.com/gpu",
             tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A developer's pod spec: one container asking for ``count`` of ``resource`` by limit
    (the webhook completes the request), no toleration and no affinity of its own."""
    spec: dict[str, Any] = {"containers": [{
        "name": "train", "image": "registry.local/train:1",
        "resources": {"limits": {resource: str(count)}}}]}
    if tolerations:
        spec["tolerations"] = tolerations
    return spec


def pod(name: str, count: int | str = 1, resource: str = "nvidia.com/gpu",
        labels: dict[str, str] | None = None,
        tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": pod_spec(count, resource, tolerations)}


def deployment(name: str, replicas: int, count: int,
               resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": pod_spec(count, resource)}}}


def job(name: str, parallelism: int, count: int, run_for: str) -> dict[str, Any]:
    """A Job of ``parallelism`` pods of ``count`` GPUs that each run for ``run_for``
    (kwok's pod-complete stage reads the annotation, tests/e2e/controlplane/kwok-stages.yaml)."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": parallelism, "completions": parallelism,
                     "template": {
                         "metadata": {"annotations": {"sim.gpu-webhook.dev/run-for": run_for}},
                         "spec": {**pod_spec(count), "restartPolicy": "Never"}}}}
