"""The core gang API on a simulated cluster of its own: PodGroups
(``scheduling.k8s.io/v1beta1``) and pods that join them (``spec.schedulingGroup``),
through the real kube-apiserver, kube-scheduler (its gang scheduling plugin) and kwok
nodes, with the gates Kubernetes 1.37 ships off turned on as a cluster that uses them
would.

A PodGroup of 4 pods x 2 GPUs (``minCount: 4``): under a 6-GPU cap in ``deny`` every pod
is refused, the first with the gang's numbers, and none is created; in ``overQuota:
wait`` all four wait behind the quota gate and none runs; under an 8-GPU cap all four
run, the gang reserved at the first pod and charged once (a fifth pod of the group is
then over the cap). A CompositePodGroup of two such PodGroups of 2 pods is one gang of
4: refused whole over the 6-GPU cap, running whole under the 8-GPU one. Two pods sharing
their PodGroup's claim of one GPU (the claim the resourceclaim controller makes once for
the group) run on the DRA node, charged one GPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from e2ekit import apply, wait_until
from gpucluster.fixtures import (
    SCHEDULE_TIMEOUT,
    a100_cluster,
    own_policy,
    own_sim,
    pod,
    pods,
    running,
    started,
)
from gpucluster.sim import SimCluster
from kubernetes import client as k8s

from webhook.engine import messages

pytestmark = pytest.mark.e2e

# What the core gang API needs in Kubernetes 1.37: the gate GenericWorkload (beta, off by
# default; k8s.io/kubernetes pkg/features/kube_features.go) on the API server and the
# scheduler, and the API version it serves (beta APIs are off unless asked for). A
# release that changes these fails the served-API check below, not a silent skip.
KUBERNETES = "v1.37"
# DRAWorkloadResourceClaims (beta, off by default in 1.37): a PodGroup's claims, made
# once for the whole group by the resourceclaim controller. CompositePodGroup (alpha in
# 1.37, served at v1alpha3; it needs TopologyAwareWorkloadScheduling, alpha): PodGroups
# grouped into a gang of gangs.
GATES = ("--feature-gates=GenericWorkload=true,DRAWorkloadResourceClaims=true,"
         "TopologyAwareWorkloadScheduling=true,CompositePodGroup=true")
API = "scheduling.k8s.io/v1beta1"
COMPOSITE_API = "scheduling.k8s.io/v1alpha3"

GPU_CLASS = "gpu.nvidia.com"
CLUSTER = a100_cluster("podgroups-sim", "a100-gang", 2, 8)
# One node of 8 A100s published by NVIDIA's DRA driver only, and its DeviceClass as the
# driver installs it (as tests/e2e/gpucluster/gpu-cluster.yaml describes them).
CLUSTER["spec"]["nodeGroups"].append({"name": "dra-a100", "count": 1, "rack": "rack-a",
                                      "gpu": {"model": "a100", "count": 8},
                                      "resources": {}, "dra": True})
CLUSTER["spec"]["deviceClasses"] = [{
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": GPU_CLASS},
    "spec": {"selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && "
        "device.attributes['gpu.nvidia.com'].type == 'gpu'")}}]}}]
POLICY = own_policy("podgroups-sim", """\
    - name: deny6
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: deny6}
      quota: {gpus: 6}
    - name: wait6
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: wait6}
      quota: {gpus: 6}
      overQuota: wait
    - name: fit8
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: fit8}
      quota: {gpus: 8}
    - name: gangs8
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: gangs8}
      quota: {gpus: 8}
""", spec=f"""\
  deviceClasses:
    {GPU_CLASS}: {{gpus: 1}}
""")
GATE = "gpu-webhook.dev/quota"


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    work = tmp_path_factory.mktemp("podgroups-sim")
    with started(own_sim(work, CLUSTER, POLICY,
                         apiserver_args=[GATES,
                                         f"--runtime-config={API}=true,{COMPOSITE_API}=true"],
                         component_args={"kube-scheduler": [GATES],
                                         "kube-controller-manager": [GATES]})) as cluster:
        assert cluster.cp.version.startswith(KUBERNETES), cluster.cp.version
        served = cluster.cp.kubectl("api-resources", f"--api-group={API.split('/')[0]}",
                                    "-o", "name").stdout.split()
        assert {"podgroups.scheduling.k8s.io",
                "compositepodgroups.scheduling.k8s.io"} <= set(served), served
        yield cluster


def podgroup(name: str, min_count: int) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}}


def members(group: str, n: int, gpus: int = 2, first: int = 0) -> list[dict[str, Any]]:
    out = []
    for i in range(first, first + n):
        obj = pod(f"{group}-{i}", gpus)
        obj["spec"]["schedulingGroup"] = {"podGroupName": group}
        out.append(obj)
    return out


def gated(p: Any) -> bool:
    return any(g.name == GATE for g in p.spec.scheduling_gates or ())


def test_a_gang_that_can_never_fit_is_refused_whole_at_its_first_pod(
        own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Any) -> None:
    ns = tenant_ns("deny6")
    assert apply(own_cluster.cp, ns, podgroup("train", 4)).returncode == 0
    out = apply(own_cluster.cp, ns, *members("train", 4))
    assert out.returncode != 0
    said = messages.group_never_fits("PodGroup train", "tenant deny6", "GPUs", 4, 2, 6)
    assert said in out.stderr, out.stderr
    assert out.stderr.count(said) == 4  # each pod told the same, none created
    assert pods(api, ns) == []


def test_a_waiting_gang_over_the_cap_waits_whole_none_of_it_runs(
        own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Any) -> None:
    ns = tenant_ns("wait6")
    assert apply(own_cluster.cp, ns, podgroup("train", 4)).returncode == 0
    out = apply(own_cluster.cp, ns, *members("train", 4))
    assert out.returncode == 0, out.stderr
    # The leader reads the PodGroup (its minCount) and holds the whole gang in line.
    wait_until("the leader to line up the gang of 4",
               lambda: any(e.reason == "WaitingForQuota" and "gang of 4 pods" in e.message
                           for e in api.list_namespaced_event(ns).items),
               timeout=SCHEDULE_TIMEOUT, every=0.3)
    found = pods(api, ns)
    assert len(found) == 4 and all(gated(p) for p in found), [
        (p.metadata.name, p.spec.scheduling_gates) for p in found]
    assert not [p for p in found if p.spec.node_name]


def test_a_gang_that_fits_runs_whole_and_is_charged_once(
        own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Any) -> None:
    ns = tenant_ns("fit8")
    assert apply(own_cluster.cp, ns, podgroup("train", 4)).returncode == 0
    out = apply(own_cluster.cp, ns, *members("train", 4))
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr  # no warning: the gang was read and reserved
    found = running(api, ns, 4)
    assert {p.metadata.name for p in found} == {f"train-{i}" for i in range(4)}
    # 8 of 8 GPUs held by the four: a fifth pod of the group finds no slot and no room.
    extra = apply(own_cluster.cp, ns, *members("train", 1, first=4))
    assert extra.returncode != 0
    assert "tenant fit8 would use 10 of its 8 GPUs: 8 in use" in extra.stderr, extra.stderr


def one_gpu_template(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}}]}}}}


def claim_member(group: str, i: int, template: str) -> dict[str, Any]:
    obj = pod(f"{group}-{i}", 0)
    spec = obj["spec"]
    for c in spec["containers"]:
        c["resources"] = {"claims": [{"name": "gpu"}]}
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    spec["schedulingGroup"] = {"podGroupName": group}
    return obj


def test_pods_sharing_their_podgroups_claim_are_charged_it_once(
        own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Any) -> None:
    ns = tenant_ns("fit8")
    group = podgroup("shared", 2)
    group["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    out = apply(own_cluster.cp, ns, one_gpu_template("one-gpu"), group)
    assert out.returncode == 0, out.stderr
    out = apply(own_cluster.cp, ns, *(claim_member("shared", i, "one-gpu") for i in range(2)))
    assert out.returncode == 0, out.stderr
    found = running(api, ns, 2)
    # One claim, made for the group (owned by the PodGroup), allocated one device.
    claims = json.loads(own_cluster.cp.kubectl(
        "get", "resourceclaims", "-n", ns, "-o", "json").stdout)["items"]
    assert len(claims) == 1, [c["metadata"]["name"] for c in claims]
    [owner] = claims[0]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("PodGroup", "shared")
    assert len(claims[0]["status"]["allocation"]["devices"]["results"]) == 1
    assert {p.spec.node_name for p in found} == {"dra-a100-0"}
    # Charged once: 1 of the tenant's 8 GPUs in use, not 1 per pod.
    probe = apply(own_cluster.cp, ns, pod("probe", 8), dry_run=True)
    assert probe.returncode != 0
    assert "tenant fit8 would use 9 of its 8 GPUs: 1 in use" in probe.stderr, probe.stderr


def composite_gang(name: str, groups: int, pods: int) -> list[dict[str, Any]]:
    """A CompositePodGroup whose ``groups`` PodGroups (of ``pods`` pods each) must start
    together, its PodGroups, and their pods of 2 GPUs, as a workload controller makes
    them (the Workload they name need not exist for the API server)."""
    ref = {"workloadName": name, "templateName": "workers"}
    out: list[dict[str, Any]] = [{
        "apiVersion": COMPOSITE_API, "kind": "CompositePodGroup", "metadata": {"name": name},
        "spec": {"workloadRef": ref,
                 "schedulingPolicy": {"gang": {"minGroupCount": groups}}}}]
    for g in range(groups):
        group = podgroup(f"{name}-{g}", pods)
        group["spec"].update(parentCompositePodGroupName=name, workloadRef=ref)
        out.append(group)
    return out


def test_a_composite_podgroup_is_refused_or_runs_as_one_gang_of_gangs(
        own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Any) -> None:
    # A tenant of its own for the fitting half: no other test's pods or claims still
    # leaving its namespaces.
    over, fits = tenant_ns("deny6"), tenant_ns("gangs8")
    for ns in (over, fits):
        out = apply(own_cluster.cp, ns, *composite_gang("llm", 2, 2))
        assert out.returncode == 0, out.stderr
    # 2 PodGroups x 2 pods x 2 GPUs = 8 at once: over 6, refused at the first pod of
    # either group, and at every pod after it.
    out = apply(own_cluster.cp, over, *members("llm-0", 2), *members("llm-1", 2))
    said = messages.group_never_fits("CompositePodGroup llm", "tenant deny6", "GPUs", 4, 2,
                                     6, composite=True)
    assert out.stderr.count(said) == 4, out.stderr
    assert pods(api, over) == []
    # Under 8: the whole gang of gangs runs, reserved at its first pod, charged once.
    out = apply(own_cluster.cp, fits, *members("llm-0", 2), *members("llm-1", 2))
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert len(running(api, fits, 4)) == 4
    extra = apply(own_cluster.cp, fits, *members("llm-1", 1, first=2))
    assert "tenant gangs8 would use 10 of its 8 GPUs: 8 in use" in extra.stderr, extra.stderr
