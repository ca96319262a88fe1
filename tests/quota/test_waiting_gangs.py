"""Training gangs in a waiting tenant (``tenants[].overQuota: wait``): a workload that does
not fit now is admitted with the words that say its pods wait, each of its pods is gated
(even one that would fit alone) unless its gang's reservation holds a slot for it, and
the line knows which workload each pod's gang is and where to read its size."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import orjson
import pytest
from fakeapi import FakeAPI
from kit import validating
from quotakit import admit, ledger_replica, pod
from test_waiting import waiting_policy

from webhook.admission.webhooks import mutating
from webhook.engine.charge import charge_of_pod
from webhook.engine.cost import Charge
from webhook.engine.waiting import is_gated
from webhook.k8s.review import parse_review, request_review
from webhook.quota.line import GangOf, gang_of
from webhook.quota.store import Held, MemoryStore


def pytorchjob(name: str = "ddp", workers: int = 3) -> dict[str, Any]:
    """A PyTorchJob of one master and ``workers`` workers, one A100 each."""
    spec = pod("t", gpus=1)["spec"]
    replica = {"template": {"spec": spec}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}"},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, **copy.deepcopy(replica)},
                "Worker": {"replicas": workers, **copy.deepcopy(replica)}}}}


def operator_pod(job: str, i: int) -> dict[str, Any]:
    """A pod as the training operator creates it (owned by the PyTorchJob and labelled
    with its name), as it reaches the mutating webhook: pinned already, no uid yet."""
    p = pod(f"{job}-worker-{i}", gpus=1)
    del p["metadata"]["uid"]
    p["metadata"]["labels"] = {"training.kubeflow.org/job-name": job}
    p["metadata"]["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1",
                                         "kind": "PyTorchJob", "name": job,
                                         "uid": f"uid-{job}", "controller": True}]
    return p


def _req(obj: dict[str, Any]) -> Any:
    return parse_review(orjson.dumps(request_review(copy.deepcopy(obj))))


def busy(store: MemoryStore, gpus: int) -> None:
    p = waiting_policy()
    for i in range(gpus):
        obj = pod(f"other-{i}", gpus=1)
        store.pod_seen(obj["metadata"]["uid"], charge_of_pod(obj, p))


# --- which gang a pod is in ---------------------------------------------------------------


def _meta(labels: dict[str, str], *owners: tuple[str, str, str]) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "labels": labels, "ownerReferences": [
        {"apiVersion": v, "kind": k, "name": n, "uid": f"uid-{n}", "controller": True}
        for v, k, n in owners]}}


@pytest.mark.parametrize(("pod_", "want"), [
    # A Kubeflow job's pods: owned by it and labelled with its name.
    (_meta({"training.kubeflow.org/job-name": "ddp"}, ("kubeflow.org/v1", "PyTorchJob", "ddp")),
     GangOf("ns/training.kubeflow.org/job-name=ddp", "PyTorchJob", "kubeflow.org", "v1",
            "pytorchjobs", "ns", "ddp")),
    # An MPIJob of the MPI operator's v2beta1: read at the version its controller wrote.
    (_meta({"training.kubeflow.org/job-name": "mpi"},
           ("kubeflow.org/v2beta1", "MPIJob", "mpi")),
     GangOf("ns/training.kubeflow.org/job-name=mpi", "MPIJob", "kubeflow.org", "v2beta1",
            "mpijobs", "ns", "mpi")),
    # A Volcano Job is a "Job" of its own group, never taken for a batch Job.
    (_meta({}, ("batch.volcano.sh/v1alpha1", "Job", "vc")),
     GangOf("ns/volcano.sh/job-name=vc", "Job", "batch.volcano.sh", "v1alpha1", "jobs",
            "ns", "vc")),
    # A JobSet's pods are owned by its child Jobs: the JobSet is the gang, not the Job.
    (_meta({"jobset.sigs.k8s.io/jobset-name": "llm"}, ("batch/v1", "Job", "llm-workers-0")),
     GangOf("ns/jobset.sigs.k8s.io/jobset-name=llm", "JobSet", "jobset.x-k8s.io",
            "v1alpha2", "jobsets", "ns", "llm")),
    # A LeaderWorkerSet starts each group as one gang.
    (_meta({"leaderworkerset.sigs.k8s.io/name": "serve",
            "leaderworkerset.sigs.k8s.io/group-index": "1"},
           ("apps/v1", "StatefulSet", "serve-1")),
     GangOf("ns/leaderworkerset.sigs.k8s.io/name=serve/1", "LeaderWorkerSet",
            "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "ns", "serve")),
    (_meta({}, ("batch/v1", "Job", "plain")),
     GangOf("uid-plain", "Job", "batch", "v1", "jobs", "ns", "plain")),
    (_meta({}, ("apps/v1", "ReplicaSet", "web-1")), None),
    ({"metadata": {"namespace": "ns", "labels": None}}, None),
])
def test_a_pods_gang_is_the_training_workload_that_starts_it(
        pod_: dict[str, Any], want: GangOf | None) -> None:
    assert gang_of(pod_) == want


# --- the workload's CREATE --------------------------------------------------------------


def test_a_gang_that_does_not_fit_now_is_admitted_to_wait_in_a_waiting_tenant() -> None:
    store = MemoryStore()
    busy(store, 4)  # 1 of the tenant's 5 GPU pods free; the gang of 4 needs 4
    d = admit(store, waiting_policy(), pytorchjob())
    assert d.allowed, d.message
    (warning,) = d.warnings
    assert "but only 1 of tenant team-a's 5 GPU pods" in warning
    assert "its gang of 4 pods needs 4 GPU pods" in warning
    assert "Its pods wait behind the scheduling gate gpu-webhook.dev/quota" in warning
    assert "compete" not in warning  # that is deny mode's word
    assert store.view().tenant("team-a").gpus == 4  # nothing reserved


# --- its pods at the mutating webhook ----------------------------------------------------


def test_a_training_pod_goes_through_the_line_even_when_it_fits_alone() -> None:
    # 2 a100 GPUs free: the first two of the gang's four pods would fit one by one and
    # then hold GPUs the other two wait for.
    store = MemoryStore()
    busy(store, 4)
    p = waiting_policy()
    assert admit(store, p, pytorchjob()).allowed  # not reserved: it does not fit
    req = _req(operator_pod("ddp", 0))
    d = mutating(req, p, store=store)
    assert d.allowed and is_gated(req.object), d.patch
    assert any("this pod of pytorchjob.kubeflow.org/ddp (1 GPUs)" in w
               and "releases its gang's pods together" in w for w in d.warnings), d.warnings
    # Gated, it is admitted uncharged: the leader charges the gang whole on release.
    assert validating(_req(req.object), p, store=store).allowed
    assert store.view().tenant("team-a").gpus == 4


def test_a_training_pod_with_a_slot_of_its_gangs_reservation_is_not_gated() -> None:
    store, p = MemoryStore(), waiting_policy()
    assert admit(store, p, pytorchjob()).warnings == []  # fits now: reserved whole
    req = _req(operator_pod("ddp", 0))
    d = mutating(req, p, store=store)
    assert d.allowed and not is_gated(req.object), d.patch


# --- its release, when its gang was reserved after all -----------------------------------


def test_a_released_pod_draws_its_gangs_slot_instead_of_being_charged_again(
        api: FakeAPI) -> None:
    # The gang reserved whole at its creation, on one replica; its pods gated on another
    # that had not read the ledger since (it knew of no slot). Released, each pod takes a
    # slot of its gang's reservation, as at admission: the tenant is charged once.
    def held(i: int) -> Held:
        charge = Charge("team-a", "team-a", "pytorchjob/ddp", "a100", {"nvidia.com/gpu": 1}, 1)
        return Held(key=f"uid-ddp-{i}", charge=charge, name=f"team-a/ddp-worker-{i}",
                    fits=lambda view: view.tenant("team-a").gpus + 1 <= 8,
                    gangs=("uid-ddp", "team-a/training.kubeflow.org/job-name=ddp"))

    async def run(store: Any) -> None:
        slots = [(Charge("team-a", "team-a", "pytorchjob/ddp", "a100",
                         {"nvidia.com/gpu": 1}, 1), 4)]
        assert await store.reserve_gang("uid-ddp", ("uid-ddp",), slots,
                                        lambda view: True, 300.0, 10.0)
        busy = Charge("team-a", "team-a", "pod/x", "a100", {"nvidia.com/gpu": 4}, 4)
        assert await store.reserve("running", busy, lambda view: True, 10.0)
        assert store.view().tenant("team-a").gpus == 8  # 4 running + 4 reserved: full
        # Full, yet released: each pod is checked without the slot it replaces.
        assert await store.reserve_in_order("team-a", [[held(i) for i in range(4)]],
                                            10.0) == [0]
        assert store.view().tenant("team-a").gpus == 8  # the slots replaced, not added to
        # A fifth pod of the gang finds no slot left and no room.
        assert await store.reserve_in_order("team-a", [[held(4)]], 10.0) == []

    for store in (MemoryStore(), ledger_replica(api)):
        asyncio.run(run(store))
