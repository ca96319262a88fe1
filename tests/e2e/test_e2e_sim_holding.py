"""How GPUs are held, on the simulated GPU cluster: tenant ``holding`` of
``gpucluster/policy.yaml`` (notebooks run 8 seconds at most, 16 CPUs per GPU, pods routed
to Kueue's queue ``holding``), through kubectl, the real kube-apiserver, kube-scheduler
and controllers.

kwok plays the kubelet, and kwok does not play ``activeDeadlineSeconds`` (no stage or
code of kwok v0.8.0 reads it): ``tests/e2e/controlplane/kwok-stages.yaml`` adds a stage
that does what the kubelet does (the pod fails, reason ``DeadlineExceeded``, once it has
run that long after its start). What the webhook is shown to do is its own: the deadline
it gives the pod; what ends the pod here is that stage, standing in for the kubelet;
the GPUs coming free (the quota and the node) is the webhook's cache and the real
scheduler reading the failed pod.

No Kueue runs on the cluster: the queue label is what is shown, not Kueue's admission.
GPU memory is GFD's ``nvidia.com/gpu.memory`` in MiB on the sim's nodes
(``gpucluster/gpu-cluster.yaml``: A100 81920, H100 81559), so ``80Gi`` (81920 MiB) fits
the A100s and no H100.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2ekit import to_yaml, wait_until
from gpucluster.fixtures import (
    SCHEDULE_TIMEOUT,
    SimNamespaceFactory,
    deployment,
    node_labels,
    pod,
    requested_on,
    running,
    wait_event,
)
from gpucluster.sim import SimCluster
from kubernetes import client as k8s
from test_e2e_sim_dra import apply_now, dra_pod, template

pytestmark = pytest.mark.e2e

TENANT = "holding"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MEMORY = "gpu-webhook.dev/min-gpu-memory"
NOTEBOOK = {"app.kubernetes.io/component": "notebook"}


def apply(sim: SimCluster, ns: str, *objects: dict[str, Any]) -> Any:
    return sim.cp.kubectl("apply", "-n", ns, "-f", "-", input=to_yaml(*objects), check=False)


def with_cpu(p: dict[str, Any], cpu: str) -> dict[str, Any]:
    p["spec"]["containers"][0]["resources"]["limits"]["cpu"] = cpu
    return p


def test_a_one_gpu_pod_asking_for_64_cpus_is_refused_with_the_ratio(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    ns = sim_namespace(TENANT)
    done = apply(sim, ns, with_cpu(pod("greedy", 1), "64"))
    assert done.returncode != 0
    assert ("1 GPU with 64 CPUs: at most 16 CPUs per GPU in tenant holding, so at most "
            "16 CPUs for this pod") in done.stderr
    assert "[rule resources-per-gpu, tenant holding]" in done.stderr
    assert not core.list_namespaced_pod(ns).items
    # Within the ratio: 2 GPUs with 32 CPUs run.
    done = apply(sim, ns, with_cpu(pod("fair", 2), "32"))
    assert done.returncode == 0, done.stderr
    running(core, ns, 1)


def test_cpu_asked_at_pod_level_is_held_to_the_same_cap(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    # Pod-level resources (KEP-2837, gate PodLevelResources, beta and on by default since
    # 1.34, as v1.37 ships it): the scheduler reads spec.resources where set, so the cap
    # reads it too. With the gate off the API server would drop the field: admitted, and
    # this test fails rather than passing on nothing.
    assert sim.cp.version.startswith("v1.37"), sim.cp.version
    ns = sim_namespace(TENANT)
    p = pod("pod-level", 1)
    p["spec"]["resources"] = {"requests": {"cpu": "64"}}
    done = apply(sim, ns, p)
    assert done.returncode != 0
    assert ("1 GPU with 64 CPUs: at most 16 CPUs per GPU in tenant holding, so at most "
            "16 CPUs for this pod") in done.stderr
    assert not core.list_namespaced_pod(ns).items


def resize(sim: SimCluster, ns: str, name: str, cpu: str) -> Any:
    """``kubectl patch --subresource resize`` (in-place resize, GA in 1.35) of the first
    container's CPU."""
    body = {"spec": {"containers": [{"name": "train", "resources": {
        "requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}]}}
    return sim.cp.kubectl("patch", "pod", name, "-n", ns, "--subresource", "resize",
                          "--type", "strategic", "-p", json.dumps(body), check=False)


def test_a_running_gpu_pod_resized_past_its_cpu_per_gpu_is_refused(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    # In-place resize: gate InPlacePodVerticalScaling, GA in 1.35 (the pods/resize
    # subresource; a release without it answers 404 and this test fails).
    assert sim.cp.version.startswith("v1.37"), sim.cp.version
    ns = sim_namespace(TENANT)
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
             "spec": {"containers": [{"name": "train", "image": "web:1", "resources": {
                 "limits": {"cpu": "1"}}}]}}
    wait_until("the GPU pod to be admitted", lambda: apply(
        sim, ns, with_cpu(pod("train", 1), "8"), plain).returncode == 0,
        timeout=SCHEDULE_TIMEOUT, every=0.5)
    running(core, ns, 2)
    done = resize(sim, ns, "train", "64")
    assert done.returncode != 0
    assert (f"pod {ns}/train: cannot be resized to 64 CPUs: its 1 GPU allows at most 16 "
            "CPUs per GPU in tenant holding, so at most 16 CPUs. Resize to 16 CPUs or "
            "less") in done.stderr, done.stderr
    assert "[rule resources-per-gpu, tenant holding]" in done.stderr

    def cpu(name: str) -> str:
        return str(core.read_namespaced_pod(name, ns).spec.containers[0]
                   .resources.limits["cpu"])
    assert cpu("train") == "8"
    done = resize(sim, ns, "train", "12")
    assert done.returncode == 0, done.stderr
    assert cpu("train") == "12"
    # A pod without GPUs is never sent: resized as it asks.
    done = resize(sim, ns, "web", "48")
    assert done.returncode == 0, done.stderr
    assert cpu("web") == "48"


def test_every_gpu_pod_of_a_tenant_routed_to_kueue_gets_the_queue_label(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    ns = sim_namespace(TENANT)
    done = apply(sim, ns, deployment("serve", 3, 1), pod("solo", 1))
    assert done.returncode == 0, done.stderr
    pods = running(core, ns, 4)
    assert {p.metadata.name for p in pods} >= {"solo"}
    assert all(p.metadata.labels.get(QUEUE_LABEL) == TENANT for p in pods), \
        {p.metadata.name: p.metadata.labels for p in pods}
    # The Deployment itself carries it too (Kueue reads a workload's own label).
    got = json.loads(sim.cp.kubectl("get", "deployment", "serve", "-n", ns, "-o",
                                    "json").stdout)
    assert got["metadata"]["labels"][QUEUE_LABEL] == TENANT


def test_a_pod_asking_for_80gib_of_gpu_memory_lands_only_on_nodes_that_have_it(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    ns = sim_namespace(TENANT)
    asked = [pod(f"llm-{i}", 1, labels={MEMORY: "80Gi"}) for i in range(3)]
    # An H100 is allowed (and free): alone it runs; asking 80Gi as well, no node has both.
    h100 = pod("h100", 1, labels={"gpu.example.com/product": "h100"})
    both = pod("h100-80gi", 1, labels={"gpu.example.com/product": "h100", MEMORY: "80Gi"})
    # 5 of the tenant's 8 GPUs: the pods of the test before it are gone from the API
    # server, but each replica's cache sees them go a moment later and counts them until
    # then. A refused create leaves nothing behind, and applying again creates only what
    # is missing: asked again until every pod is admitted.
    wait_until("the pods to be admitted", lambda: apply(
        sim, ns, *asked, h100, both).returncode == 0, timeout=SCHEDULE_TIMEOUT, every=0.5)
    placed = running(core, ns, 4)
    for p in placed:
        labels = node_labels(core, p.spec.node_name)
        if p.metadata.name.startswith("llm-"):
            assert int(labels["nvidia.com/gpu.memory"]) >= 81920, (p.spec.node_name, labels)
        else:
            assert p.metadata.name == "h100"
            assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    event = wait_event(core, ns, "Pod", "h100-80gi", "FailedScheduling")
    assert "didn't match Pod's node affinity/selector" in event.message
    p = core.read_namespaced_pod("h100-80gi", ns)
    terms = p.spec.affinity.node_affinity.\
        required_during_scheduling_ignored_during_execution.node_selector_terms
    assert all(any(e.key == "nvidia.com/gpu.memory" and e.operator == "Gt"
                   and e.values == ["81919"] for e in t.match_expressions) for t in terms)


def test_a_notebook_past_its_maximum_runtime_is_ended_and_its_gpus_come_free(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    ns = sim_namespace(TENANT)
    # The notebook asks for all of the tenant's 8 GPUs: the pods of the tests before it are
    # gone from the API server, but each replica's cache sees them go a moment later, and
    # until then counts them. A refused create leaves nothing behind: asked again.
    wait_until("the notebook to be admitted",
               lambda: apply(sim, ns, pod("notebook", 8, labels=NOTEBOOK)).returncode == 0,
               timeout=SCHEDULE_TIMEOUT, every=0.5)
    (nb,) = running(core, ns, 1)
    assert nb.spec.active_deadline_seconds == 8
    assert nb.metadata.annotations["gpu-webhook.dev/max-runtime"].startswith(
        "8s (8s, kind notebooks): the kubelet ends the pod and frees its GPUs 8s after")
    node = nb.spec.node_name
    # The tenant's 8 GPUs are the notebook's while it runs: the quota says so.
    hostname = {"kubernetes.io/hostname": node}
    after = pod("after", 8)
    after["spec"]["nodeSelector"] = hostname
    refused = apply(sim, ns, after)
    assert refused.returncode != 0 and "[rule quota, tenant holding]" in refused.stderr

    def ended() -> bool:
        status = core.read_namespaced_pod("notebook", ns).status
        return status.phase == "Failed" and status.reason == "DeadlineExceeded"

    wait_until("the notebook to fail with DeadlineExceeded", ended, timeout=SCHEDULE_TIMEOUT,
               every=0.3)
    assert requested_on(core, node, "nvidia.com/gpu") == 0
    # Its GPUs are free: the same 8 on the same node, for the tenant's next pod (the
    # webhook's cache sees the failed pod within moments: retried until it does).
    outcome: list[Any] = []

    def admitted() -> bool:
        outcome[:] = [apply(sim, ns, after)]
        return bool(outcome[0].returncode == 0)

    wait_until("the next 8-GPU pod to be admitted", admitted, timeout=SCHEDULE_TIMEOUT,
               every=0.5)
    placed = running(core, ns, 1, selector="")
    assert any(p.metadata.name == "after" and p.spec.node_name == node for p in placed)


def test_a_claim_asking_for_gpu_memory_is_allocated_only_a_device_that_has_it(
        sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory) -> None:
    """The CEL selector the webhook writes, evaluated by the real scheduler's DRA
    allocator on the sim's ResourceSlices (each A100 device: capacity memory 81920Mi)."""
    ns = sim_namespace(TENANT)
    for name, memory in (("fits", "80Gi"), ("more", "81921Mi")):
        t = template(name, 1)
        t["metadata"]["labels"] = {MEMORY: memory}
        done = apply(sim, ns, t)
        assert done.returncode == 0, done.stderr
    got = json.loads(sim.cp.kubectl("get", "resourceclaimtemplate", "fits", "-n", ns,
                                    "-o", "json").stdout)
    selectors = got["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert {"cel": {"expression": "device.capacity['gpu.nvidia.com'].memory"
                                  ".compareTo(quantity('81920Mi')) >= 0"}} in selectors
    assert "created" in apply_now(sim, ns, dra_pod("fits", "fits"))
    assert "created" in apply_now(sim, ns, dra_pod("more", "more"))
    (p,) = running(core, ns, 1)
    assert p.metadata.name == "fits"
    assert node_labels(core, p.spec.node_name)["nvidia.com/gpu.memory"] == "81920"
    event = wait_event(core, ns, "Pod", "more", "FailedScheduling")
    assert "cannot allocate all claims" in event.message, event.message

