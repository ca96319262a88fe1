"""No GPU without a charge, on the simulated GPU cluster: the routes to a GPU that skip
the GPU request, tried as a tenant would, through kubectl, the real kube-apiserver, its
admission plugins, kube-scheduler (its preemption) and controllers.

Each route is shown twice where it can be: in ``sim-exempt`` (a namespace the policy
exempts: what a tenant could do without the webhook) and in a tenant's namespace (what it
can do now). Every GPU node of the cluster is tainted; a pod that tolerates every taint
lands on one whatever it asks for. The session's cluster (``gpucluster.fixtures.sim``):
no cluster of its own (one test adds a CPU node for itself and removes it).
"""

from __future__ import annotations

from typing import Any

import pytest
from e2ekit import GPU_TOLERATION, short_id, to_yaml, wait_until
from gpucluster.fixtures import (
    EXEMPT,
    SCHEDULE_TIMEOUT,
    SimNamespaceFactory,
    node_labels,
    pod,
    running,
)
from gpucluster.sim import SimCluster
from kubernetes import client as k8s
from test_e2e_sim_dra import apply_now, dra_pod, template

pytestmark = pytest.mark.e2e

CUDA = "nvidia/cuda:12.4.1-base-ubuntu22.04"  # ENV NVIDIA_VISIBLE_DEVICES=all
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
EVERYTHING = {"operator": "Exists"}


def cuda_pod(name: str, **spec: Any) -> dict[str, Any]:
    """A CUDA container asking for no GPU, tolerating every taint (as node agents do)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"tolerations": [EVERYTHING],
                     "containers": [{"name": "app", "image": CUDA}], **spec}}


def apply(sim: SimCluster, ns: str, *objects: dict[str, Any]) -> Any:
    return sim.cp.kubectl("apply", "-n", ns, "-f", "-", input=to_yaml(*objects), check=False)


def env_of(p: Any, ephemeral: bool = False) -> list[dict[str, str]]:
    containers = p.spec.ephemeral_containers if ephemeral else p.spec.containers
    return [{"name": e.name, "value": e.value} for e in containers[0].env or []]


def test_a_cuda_pod_asking_no_gpu_lands_on_a_gpu_node_with_the_variable_void(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
        exempt: list[str]) -> None:
    ns = sim_namespace("research")
    # Sent to a GPU node by its selector: tolerating every taint, it could land anywhere.
    done = apply(sim, ns, cuda_pod("prep", nodeSelector={"nvidia.com/gpu.present": "true"}))
    assert done.returncode == 0, done.stderr
    (p,) = running(core, ns, 1)
    assert node_labels(core, p.spec.node_name).get("nvidia.com/gpu.present") == "true"
    # Its image's NVIDIA_VISIBLE_DEVICES=all would have handed it the node's GPUs.
    assert env_of(p) == [VOID]
    assert "gpu-visible-devices" in p.metadata.annotations["gpu-webhook.dev/mutated"]
    # Untouched where the policy says so: an exempt namespace, and kube-system.
    for where in (EXEMPT, "kube-system"):
        name = f"control-{short_id()}"
        assert apply(sim, where, cuda_pod(name)).returncode == 0
        control = core.read_namespaced_pod(name, where)
        if where == EXEMPT:
            exempt.append(name)
        else:
            sim.cp.kubectl("delete", "pod", name, "-n", where, "--wait=false")
        assert env_of(control) == []
        assert "gpu-webhook.dev/mutated" not in (control.metadata.annotations or {})


def test_a_tenant_daemonset_runs_on_every_node_neutralized(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    ns = sim_namespace("research")
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
          "spec": {"selector": {"matchLabels": {"app": "agent"}},
                   "template": {"metadata": {"labels": {"app": "agent"}},
                                "spec": cuda_pod("agent")["spec"]}}}
    assert apply(sim, ns, ds).returncode == 0
    nodes = len(core.list_node().items)
    pods = running(core, ns, nodes, "app=agent")
    assert len({p.spec.node_name for p in pods}) == nodes
    assert all(env_of(p) == [VOID] for p in pods)


def test_node_name_to_a_gpu_node_is_refused_with_its_message(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
        exempt: list[str]) -> None:
    node = "a100-rack-a-0"
    bound = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bound"},
             "spec": {"nodeName": node, "containers": [{"name": "app", "image": CUDA}]}}
    # Without the rule: the scheduler is skipped, the GPU taint (NoSchedule) is not
    # checked by the kubelet, and the pod runs on the GPU node with no toleration.
    name = f"bound-{short_id()}"
    exempt.append(name)
    done = apply(sim, EXEMPT, {**bound, "metadata": {"name": name}})
    assert done.returncode == 0, done.stderr
    wait_until("the bound pod to run",
               lambda: core.read_namespaced_pod(name, EXEMPT).status.phase == "Running",
               timeout=SCHEDULE_TIMEOUT, every=0.3)
    # A tenant's: refused, the node known from the webhook's node watch.
    ns = sim_namespace("research")
    refused = apply(sim, ns, bound)
    assert refused.returncode != 0
    assert f'sets spec.nodeName "{node}", which skips the scheduler' in refused.stderr
    assert f'node "{node}" carries GPUs' in refused.stderr
    assert "[rule node-name, tenant research]" in refused.stderr


def test_kubectl_debug_on_a_running_gpu_pod_gets_a_neutralized_ephemeral_container(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    ns = sim_namespace("research")
    assert apply(sim, ns, pod("train", 1)).returncode == 0
    running(core, ns, 1)
    done = sim.cp.kubectl("debug", "-n", ns, "train", f"--image={CUDA}", "--container=dbg",
                          "--env=NVIDIA_VISIBLE_DEVICES=all", "--", "sleep", "infinity",
                          check=False)
    assert done.returncode == 0, done.stderr
    p = core.read_namespaced_pod("train", ns)
    assert [c.name for c in p.spec.ephemeral_containers] == ["dbg"]
    assert env_of(p, ephemeral=True) == [VOID]
    # The sysadmin profile makes it privileged: every GPU of the node. Refused.
    root = sim.cp.kubectl("debug", "-n", ns, "train", f"--image={CUDA}",
                          "--container=root", "--profile=sysadmin", "--", "sleep", "1",
                          check=False)
    assert root.returncode != 0
    assert 'ephemeral container "root": is privileged' in root.stderr


def test_a_tenants_high_priority_pod_cannot_preempt_another_tenants_in_quota_gpu_pod(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
        exempt: list[str]) -> None:
    urgent = f"sim-urgent-{short_id()}"
    sim.cp.kubectl("apply", "-f", "-", input=to_yaml({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": urgent}, "value": 1000000,
        "preemptionPolicy": "PreemptLowerPriority"}))
    try:
        # batch's pod, well within its quota of 8, on an A100 node.
        victims = sim_namespace("batch")
        assert apply(sim, victims, pod("mine", 1)).returncode == 0
        (mine,) = running(core, victims, 1)
        node = mine.spec.node_name

        def whole_node(name: str) -> dict[str, Any]:
            p = pod(name, 8, tolerations=[GPU_TOLERATION])
            p["spec"]["priorityClassName"] = urgent
            p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            return p

        # Another tenant's pod at the high class, for the whole node: refused.
        rival = sim_namespace("serving")
        refused = apply(sim, rival, whole_node("take"))
        assert refused.returncode != 0
        assert (f'runs at PriorityClass "{urgent}" (priority 1000000), above tenant '
                "serving's ceiling of 0") in refused.stderr
        assert core.read_namespaced_pod("mine", victims).metadata.deletion_timestamp is None

        # What it would have done (the same pod where the webhook does not govern): the
        # scheduler preempts batch's in-quota pod to make room.
        name = f"take-{short_id()}"
        exempt.append(name)
        assert apply(sim, EXEMPT, {**whole_node(name), "metadata": {"name": name}}
                     ).returncode == 0

        def preempted() -> bool:
            try:
                p = core.read_namespaced_pod("mine", victims)
            except k8s.ApiException as exc:
                return exc.status == 404
            return p.metadata.deletion_timestamp is not None

        wait_until("the scheduler to preempt batch's pod", preempted,
                   timeout=SCHEDULE_TIMEOUT, every=0.3)
    finally:
        sim.cp.kubectl("delete", "priorityclass", urgent, "--ignore-not-found")


def test_dra_pods_keep_working_and_claims_tolerating_device_taints_are_refused(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    ns = sim_namespace("dra")
    name = f"one-{short_id()}"
    assert apply(sim, ns, template(name, 1)).returncode == 0
    trainer = dra_pod("trainer", name)
    trainer["spec"]["containers"].append({"name": "sidecar", "image": CUDA})
    assert "created" in apply_now(sim, ns, trainer)
    wait_until("the DRA pod to run",
               lambda: core.read_namespaced_pod("trainer", ns).status.phase == "Running",
               timeout=SCHEDULE_TIMEOUT, every=0.3)
    p = core.read_namespaced_pod("trainer", ns)
    train, sidecar = p.spec.containers
    assert not train.env  # its devices come through the claim (CDI)
    assert [(e.name, e.value) for e in sidecar.env] == [("NVIDIA_VISIBLE_DEVICES", "void")]
    # A template whose request tolerates every device taint: refused at apply.
    tolerating = template(f"any-{short_id()}", 1)
    tolerating["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        EVERYTHING]
    refused = apply(sim, ns, tolerating)
    assert refused.returncode != 0
    assert "tolerates device taints (operator Exists with no key: every taint)" in \
        refused.stderr
    assert "[rule device-taint-tolerations, tenant dra]" in refused.stderr


def test_node_name_of_a_node_known_to_be_without_gpus_passes(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    # A CPU node of its own (kwok plays its kubelet), tainted so that no other test's
    # pod lands there; a pod bound by nodeName skips the taint anyway.
    name = f"cpu-{short_id()}"
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                         "annotations": {"kwok.x-k8s.io/node": "fake",
                                         "node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"taints": [{"key": "sim.gpu-webhook.dev/cpu-only",
                                 "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                       "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}}
    sim.cp.kubectl("create", "-f", "-", input=to_yaml(node))
    ns = sim_namespace("research")
    try:
        bound = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "on-cpu"},
                 "spec": {"nodeName": name, "containers": [{"name": "app", "image": CUDA}]}}
        def admitted() -> bool:  # the node watch is a moment behind the node's creation
            return apply(sim, ns, bound).returncode == 0

        wait_until("the webhook to know the CPU node", admitted, timeout=30, every=0.5)
        wait_until("the bound pod to run",
                   lambda: core.read_namespaced_pod("on-cpu", ns).status.phase == "Running",
                   timeout=SCHEDULE_TIMEOUT, every=0.3)
        assert env_of(core.read_namespaced_pod("on-cpu", ns)) == [VOID]
    finally:
        sim.cp.kubectl("delete", "pod", "on-cpu", "-n", ns, "--ignore-not-found",
                       "--timeout=60s", check=False)
        sim.cp.kubectl("delete", "node", name, "--ignore-not-found")
