"""Training workloads at ``kubectl apply`` on a real API server, with the kinds' CRDs
installed (trimmed from their published YAML, ``tests/e2e/crds/``): a Volcano Job, a
JobSet and a PyTorchJob whose gang can never fit the tenant's quota are refused with the
message; a fitting one has every template completed, tolerated and pinned. No job
controller runs: what is checked is the webhook's answer and the stored object.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from controlplane.cluster import ControlPlane
from e2ekit import (
    Deployment,
    NamespaceFactory,
    apply,
    assert_denied,
    assert_gpu_template_patched,
    denial_prefix,
    get,
    wait_until,
)

pytestmark = pytest.mark.e2e

CRDS = Path(__file__).resolve().parent / "crds"


@pytest.fixture(scope="module", autouse=True)
def crds(control_plane: ControlPlane) -> None:
    control_plane.kubectl("apply", "-f", str(CRDS))
    for f in ("jobs.batch.volcano.sh", "jobsets.jobset.x-k8s.io",
              "pytorchjobs.kubeflow.org"):
        control_plane.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                              f"crd/{f}")

    def served() -> bool:
        out = control_plane.kubectl("api-resources", "--api-group=jobset.x-k8s.io",
                                    check=False)
        return "jobsets" in out.stdout
    wait_until("the CRDs are served", served)


def pod_spec(gpus: int) -> dict[str, Any]:
    return {"restartPolicy": "Never", "containers": [{
        "name": "train", "image": "pytorch/pytorch",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}


def volcano_job(name: str, workers: int, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": name},
            "spec": {"minAvailable": workers + 1, "schedulerName": "volcano", "tasks": [
                {"name": "master", "replicas": 1, "template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "m", "image": "busybox"}]}}},
                {"name": "worker", "replicas": workers,
                 "template": {"spec": pod_spec(gpus)}}]}}


def jobset(name: str, pods: int, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {
                "spec": {"parallelism": pods, "completions": pods,
                         "template": {"spec": pod_spec(gpus)}}}}]}}


def pytorchjob(name: str, workers: int, gpus: int) -> dict[str, Any]:
    role = {"restartPolicy": "OnFailure", "template": {"spec": pod_spec(gpus)}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": {**role, "replicas": 1},
                                             "Worker": {**role, "replicas": workers}}}}


# tenant gang: 16 GPUs
@pytest.mark.parametrize(("obj", "message"), [
    (volcano_job("vc", 3, 8),
     "volcano job {ns}/vc: its gang of 4 pods must start together, and its GPU pods "
     "(task worker 3 x 8) need 24 GPUs at once, but tenant gang's quota is 16 GPUs: it "
     "can never start."),
    (jobset("js", 3, 8),
     "jobset {ns}/js: its gang of 3 pods must start together, and its GPU pods "
     "(replicated job workers 3 x 8) need 24 GPUs at once, but tenant gang's quota is "
     "16 GPUs: it can never start."),
    (pytorchjob("pt", 2, 8),
     "pytorchjob {ns}/pt: its gang of 3 pods must start together, and its GPU pods "
     "(replica type Master 1 x 8 + replica type Worker 2 x 8) need 24 GPUs at once, "
     "but tenant gang's quota is 16 GPUs: it can never start."),
], ids=["volcano-job", "jobset", "pytorchjob"])
def test_a_gang_over_quota_is_refused_at_apply(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
    obj: dict[str, Any], message: str,
) -> None:
    ns = namespace("gang")
    out = apply(control_plane, ns, obj)
    assert_denied(out, denial_prefix(webhook.validating) + message.format(ns=ns),
                  "[rule quota, tenant gang]")


# tenant caps: 16 GPUs, 2 GPU pods, 3 a100 GPUs (tests/e2e/policies/e2e.yaml)
@pytest.mark.parametrize(("obj", "message"), [
    (volcano_job("vc-caps", 3, 8),
     "volcano job {ns}/vc-caps: its gang of 4 pods must start together, and its GPU pods "
     "(task worker 3 x 8) need 24 a100 GPUs at once, but tenant caps's quota is 3 a100 "
     "GPUs (the tightest of the 3 caps it exceeds): it can never start. Make the gang "
     "need at most 3 a100 GPUs (fewer pods, or fewer per pod), or ask the platform team "
     "for more quota. [rule quota, tenant caps]"),
    (pytorchjob("pt-caps", 2, 2),
     "pytorchjob {ns}/pt-caps: its gang of 3 pods must start together, and its GPU pods "
     "(replica type Master 1 x 2 + replica type Worker 2 x 2) need 6 a100 GPUs at once, "
     "but tenant caps's quota is 3 a100 GPUs (the tightest of the 2 caps it exceeds): it "
     "can never start. Make the gang need at most 3 a100 GPUs (fewer pods, or fewer per "
     "pod), or ask the platform team for more quota. [rule quota, tenant caps]"),
], ids=["volcano-job", "pytorchjob"])
def test_a_gang_over_several_caps_gets_one_answer(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
    obj: dict[str, Any], message: str,
) -> None:
    ns = namespace("caps")
    out = apply(control_plane, ns, obj)
    assert_denied(out, denial_prefix(webhook.validating) + message.format(ns=ns))
    # One denial: each cap's own "at most N" would name a gang another cap refuses.
    assert out.stderr.count("[rule quota") == 1, out.stderr


def templates(kind: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]
    if kind == "Job":
        return [t["template"]["spec"] for t in spec["tasks"]]
    if kind == "JobSet":
        return [r["template"]["spec"]["template"]["spec"] for r in spec["replicatedJobs"]]
    return [r["template"]["spec"] for r in spec["pytorchReplicaSpecs"].values()]


@pytest.mark.parametrize(("obj", "resource"), [
    (volcano_job("vc-fit", 2, 2), "jobs.batch.volcano.sh"),
    (jobset("js-fit", 2, 2), "jobsets.jobset.x-k8s.io"),
    (pytorchjob("pt-fit", 1, 2), "pytorchjobs.kubeflow.org"),
], ids=["volcano-job", "jobset", "pytorchjob"])
def test_a_fitting_workload_has_every_gpu_template_patched(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
    obj: dict[str, Any], resource: str,
) -> None:
    ns = namespace("research")
    out = apply(control_plane, ns, obj)
    assert out.returncode == 0, out.stderr
    stored = get(control_plane, ns, resource, obj["metadata"]["name"])
    gpu_specs = [s for s in templates(obj["kind"], stored)
                 if "limits" in s["containers"][0].get("resources", {})]
    assert gpu_specs
    for spec in gpu_specs:
        assert_gpu_template_patched(spec, "2")
    for spec in templates(obj["kind"], stored):
        if spec not in gpu_specs:
            assert "tolerations" not in spec  # the CPU master is left alone
