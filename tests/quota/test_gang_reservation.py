"""Gang reservations in the in-memory store: a gang that fits now is reserved whole
under its workload's uid; its pods (found by owner uid or their controller's label) draw
from it; of two gangs racing for the same free GPUs one is reserved whole and the other
not at all, and none of the other's pods gets in ahead of the first's; the slots no pod
took are released after the bound.
"""

from __future__ import annotations

import copy
from typing import Any

from quotakit import admit, pod, policy
from test_gang_quota import template, vcjob

from webhook.engine.charge import charge_of_pod
from webhook.quota.gang import GANG_BOUND_SECONDS
from webhook.quota.store import MemoryStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gang_pod(job: str, i: int, gpus: int = 2, *, by_label: bool = False) -> dict[str, Any]:
    """A pod as the Volcano controller makes it: owned by the job (uid-<job>), labelled."""
    p = pod(f"{job}-worker-{i}", gpus=gpus)
    meta = p["metadata"]
    meta["labels"] = {"volcano.sh/job-name": job}
    if not by_label:
        meta["ownerReferences"] = [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                                    "name": job, "uid": f"uid-{job}", "controller": True}]
    return p


def gpus_used(store: MemoryStore) -> float:
    return store.view().tenant("team-a").gpus


def test_a_gang_that_fits_is_reserved_whole_and_its_pods_draw_from_it() -> None:
    store = MemoryStore()
    d = admit(store, policy(), vcjob(("master", 1, 0), ("worker", 3, 2), name="a"))
    assert d.allowed and d.warnings == [], d.warnings
    assert gpus_used(store) == 6  # 3 x 2 reserved, the CPU master holds none
    for i in range(3):
        assert admit(store, policy(), gang_pod("a", i)).allowed
        assert gpus_used(store) == 6  # each pod takes a slot: nothing more counted
    # A fourth pod of the same shape finds no free slot: it is checked as any pod
    # (6 of the 6 A100s are held: refused).
    assert not admit(store, policy(), gang_pod("a", 3)).allowed


def test_two_gangs_racing_one_is_reserved_whole_never_both_half() -> None:
    store = MemoryStore()
    a = admit(store, policy(), vcjob(("worker", 2, 2), name="a"))
    b = admit(store, policy(), vcjob(("worker", 2, 2), name="b"))
    assert a.allowed and a.warnings == []
    # b is admitted (it can fit some day) but not reserved, and it is told so.
    assert b.allowed and any("No GPUs are reserved for it" in w for w in b.warnings)
    assert gpus_used(store) == 4
    # b's pods do not get in ahead of a's: only 2 A100s are free (6 - 4 reserved).
    assert admit(store, policy(), gang_pod("b", 0)).allowed
    assert not admit(store, policy(), gang_pod("b", 1)).allowed
    # a's pods are admitted from its reservation whatever b's pods took.
    assert all(admit(store, policy(), gang_pod("a", i)).allowed for i in range(2))


def test_pods_found_by_their_controllers_label() -> None:
    store = MemoryStore()
    assert admit(store, policy(), vcjob(("worker", 3, 2), name="a")).allowed
    for i in range(3):
        assert admit(store, policy(), gang_pod("a", i, by_label=True)).allowed
    assert gpus_used(store) == 6


def test_untaken_slots_are_released_after_the_bound() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    assert admit(store, policy(), vcjob(("worker", 3, 2), name="a")).allowed
    assert admit(store, policy(), gang_pod("a", 0)).allowed
    clock.now += GANG_BOUND_SECONDS
    # The pod's own reservation expired too (its TTL is shorter); once seen it counts as
    # itself, and the two slots nobody took are free again.
    seen = gang_pod("a", 0)
    store.pod_seen(seen["metadata"]["uid"], charge_of_pod(seen, policy()))
    assert gpus_used(store) == 2
    assert "uid-a" not in store.gangs


def test_a_dry_run_or_an_update_reserves_nothing() -> None:
    store = MemoryStore()
    assert admit(store, policy(), vcjob(("worker", 2, 2), name="a"), dry_run=True).allowed
    old = vcjob(("worker", 1, 2), name="a")
    assert admit(store, policy(), vcjob(("worker", 2, 2), name="a"), operation="UPDATE",
                 old=old).allowed
    assert gpus_used(store) == 0 and not store.gangs


def test_a_retried_review_reserves_once() -> None:
    store = MemoryStore()
    job = vcjob(("worker", 2, 2), name="a")
    assert admit(store, policy(), job).allowed
    assert admit(store, policy(), job).allowed
    assert gpus_used(store) == 4


def trainjob(name: str, nodes: int, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {
                "numNodes": nodes,
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus}}}}}


def test_a_trainjobs_pods_draw_from_its_reservation_through_its_jobset() -> None:
    # TrainJob -> JobSet (same name, owned by the TrainJob) -> Job -> Pod: the pods are
    # owned by a Job and labelled with the JobSet's name and uid.
    store = MemoryStore()
    assert admit(store, policy(), trainjob("tj", 2, 2)).allowed
    assert gpus_used(store) == 4
    owned = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
             "name": "tj", "uid": "uid-tj", "controller": True}
    made = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "tj", "namespace": "team-a", "uid": "uid-js",
                         "ownerReferences": [owned]},
            "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {
                "spec": {"parallelism": 2, "completions": 2, "template": template(2)}}}]}}
    assert admit(store, policy(), made).allowed
    assert gpus_used(store) == 4 and list(store.gangs) == ["uid-tj"]  # not reserved twice
    for i in range(2):
        p = pod(f"tj-node-0-{i}", gpus=2, owner=("Job", "tj-node-0"))
        p["metadata"]["labels"] = {"jobset.sigs.k8s.io/jobset-name": "tj",
                                   "jobset.sigs.k8s.io/jobset-uid": "uid-js"}
        assert admit(store, policy(), p).allowed
        assert gpus_used(store) == 4  # drawn from the TrainJob's slots
    assert len(store.gangs["uid-tj"].taken) == 2


def test_a_volcano_cronjob_is_checked_and_reserves_nothing() -> None:
    store = MemoryStore()
    job = vcjob(("worker", 2, 2), name="nightly")
    cron = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": "team-a", "uid": "uid-cron"},
            "spec": {"schedule": "0 2 * * *", "jobTemplate": {"spec": job["spec"]}}}
    assert admit(store, policy(), cron).allowed
    assert gpus_used(store) == 0 and not store.gangs
    big = copy.deepcopy(cron)
    big["spec"]["jobTemplate"]["spec"]["tasks"][0]["replicas"] = 4  # 8 of 6 A100s
    d = admit(store, policy(), big)
    assert not d.allowed and "volcano cronjob team-a/nightly" in d.message, d.message
    # The Job it makes on schedule is what is reserved.
    job["metadata"]["ownerReferences"] = [{"apiVersion": "batch.volcano.sh/v1alpha1",
                                           "kind": "CronJob", "name": "nightly",
                                           "uid": "uid-cron", "controller": True}]
    assert admit(store, policy(), job).allowed
    assert gpus_used(store) == 4 and list(store.gangs) == ["uid-nightly"]
