"""Deployments and Jobs on the simulated GPU cluster: their pods are created by the real
ReplicaSet and Job controllers, admitted (or refused) by the webhook, scheduled by the real
scheduler and run (and, for a Job, completed) by kwok.

What a developer sees: a Deployment's pods running on the product its tenant may use;
a Job whose pods do not fit the quota now, with the webhook's message in the Job's events,
that runs as soon as the Job holding the GPUs completes; ``kubectl scale`` and a gang that
could never fit refused at once, with the numbers.
"""

from __future__ import annotations

import pytest
from e2ekit import (
    MUTATED_ANNOTATION,
    absent,
    apply,
    assert_refused_at_create,
    assert_succeeded,
    denial_prefix,
    get,
    wait_until,
)
from gpucluster.fixtures import (
    SimNamespaceFactory,
    deployment,
    job,
    node_labels,
    pods,
    running,
    wait_event,
)
from gpucluster.sim import SimCluster
from kubernetes import client as k8s

pytestmark = pytest.mark.e2e

A100 = "NVIDIA-A100-SXM4-80GB"


def test_a_deployment_of_3_gpu_pods_runs_and_kubectl_scale_over_quota_is_refused(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
) -> None:
    assert sim.webhook is not None
    ns = sim_namespace("serving")  # tenant serving: 8 GPUs, A100 only
    out = apply(sim.cp, ns, deployment("llm", replicas=3, count=2))
    assert_succeeded(out, "deployment.apps/llm created")

    found = running(core, ns, 3, "app=llm")
    for p in found:
        assert p.metadata.owner_references[0].kind == "ReplicaSet"
        assert MUTATED_ANNOTATION in (p.metadata.annotations or {})
        assert p.spec.containers[0].resources.requests == {"nvidia.com/gpu": "2"}
        assert node_labels(core, p.spec.node_name)["nvidia.com/gpu.product"] == A100

    out = sim.cp.kubectl("scale", "deployment/llm", "-n", ns, "--replicas=5", check=False)
    assert out.returncode != 0
    assert out.stderr.strip() == "Error from server (Forbidden): " + denial_prefix(
        sim.webhook.scaling) + (
        f"deployment {ns}/llm, scaled from 3 to 5 replicas: asks for 5 pods x 2 = 10 GPUs "
        "at once, but tenant serving's quota is 8 GPUs: it can never run in full. Run at "
        "most 4 pods of this size, or fewer GPUs per pod. [rule quota, tenant serving]")
    assert get(sim.cp, ns, "deployment", "llm")["spec"]["replicas"] == 3
    assert len(pods(core, ns, "app=llm")) == 3


def test_a_job_over_quota_is_refused_in_its_events_and_runs_when_the_first_job_completes(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
) -> None:
    assert sim.webhook is not None
    ns = sim_namespace("batch")  # tenant batch: 8 GPUs
    # The first Job holds all 8 GPUs for a while (kwok completes its pods after
    # run-for); long enough that the second Job's first attempts meet a full quota.
    out = apply(sim.cp, ns, job("first", parallelism=2, count=4, run_for="20s"))
    assert out.returncode == 0, out.stderr
    running(core, ns, 2, "job-name=first")

    out = apply(sim.cp, ns, job("second", parallelism=1, count=4, run_for="1s"))
    # It fits the quota, just not now: created, with a warning kubectl prints.
    assert_succeeded(out, "job.batch/second created")
    assert ("asks for 1 pod x 4 GPUs, but only 0 of tenant batch's 8 GPUs are free now"
            in out.stderr)

    refused = wait_event(core, ns, "Job", "second", "FailedCreate")
    assert refused.message.startswith("Error creating: " + denial_prefix(sim.webhook.validating))
    assert "tenant batch would use 12 of its 8 GPUs" in refused.message
    assert refused.message.endswith("[rule quota, tenant batch]")
    assert pods(core, ns, "job-name=second") == []

    # The first Job's pods complete (kwok), its GPUs are free, and the Job controller's
    # next attempt is admitted: the second Job runs to completion.
    def complete(name: str) -> bool:
        status = get(sim.cp, ns, "job", name).get("status") or {}
        return any(c["type"] == "Complete" and c["status"] == "True"
                   for c in status.get("conditions") or [])

    wait_until("the second Job to complete", lambda: complete("second"), timeout=150,
               every=0.5)
    assert complete("first")
    first_done = max(c.state.terminated.finished_at
                     for p in pods(core, ns, "job-name=first")
                     for c in p.status.container_statuses)
    (second,) = pods(core, ns, "job-name=second")
    assert second.metadata.creation_timestamp >= first_done.replace(microsecond=0)
    assert node_labels(core, second.spec.node_name)["nvidia.com/gpu.product"] == A100


def test_a_gang_that_fits_runs_all_4_pods_and_one_that_never_fits_is_refused_at_apply(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
) -> None:
    assert sim.webhook is not None
    ns = sim_namespace("gang")  # tenant gang: 16 GPUs
    out = apply(sim.cp, ns, job("fits", parallelism=4, count=4, run_for="10m"))
    assert_succeeded(out, "job.batch/fits created")
    found = running(core, ns, 4, "job-name=fits")
    assert len({p.metadata.name for p in found}) == 4

    out = apply(sim.cp, ns, job("never", parallelism=4, count=5, run_for="1s"))
    assert_refused_at_create(
        out, sim.webhook.validating,
        f"job {ns}/never, pod template: asks for 4 pods x 5 = 20 GPUs at once, but "
        "tenant gang's quota is 16 GPUs: it can never run in full. Run at most 3 pods of "
        "this size, or fewer GPUs per pod. [rule quota, tenant gang]")
    assert absent(sim.cp, ns, "job", "never")
