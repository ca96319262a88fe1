"""Gang reservations in the shared ledger (``LedgerStore``), as several replicas use it.

The real store, the real Kubernetes client and ``kube.ConfigMaps`` against the fake
ConfigMaps API over HTTP (``fakeapi``): a gang that fits now is written as one slot per
pod in ONE compare-and-swap commit; two replicas racing for the same free GPUs end with
one gang reserved whole (the loser decided again on the winner's write); a pod of the
gang replaces a slot of its shape in its own commit, counted once; a slot written by
hand lifts no cap; a workload's DELETE frees the slots no pod took. The same store on a
real API server with two replicas: tests/e2e/test_e2e_gang_ledger.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from fakeapi import FakeAPI
from quotakit import NOW, admit, ledger_replica, pod, policy
from test_gang_quota import vcjob
from test_gang_reservation import gang_pod

from webhook.admission import webhooks
from webhook.admission.webhooks import Cluster, Phase
from webhook.engine.decision import Decision
from webhook.k8s.review import parse_review, request_review
from webhook.quota.entries import LEDGER_PREFIX, decode
from webhook.quota.gang import GANG_BOUND_SECONDS
from webhook.quota.ledger import LedgerStore
from webhook.quota.store import MemoryStore, UsageStore

NS = "gpu-webhook"
LEDGER = LEDGER_PREFIX + "team-a"


def replica(api: FakeAPI) -> LedgerStore:
    return ledger_replica(api, timeout=1.0)


def entries(api: FakeAPI) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(api.data(NS, LEDGER)["reservations"])
    return out


def slots(api: FakeAPI, uid: str) -> list[str]:
    return sorted(k for k in entries(api) if k.startswith(uid + "#"))


def writes(api: FakeAPI) -> int:
    # A create is POSTed to the collection, a replace PUT to the ledger's own path.
    return sum(1 for method, path in api.requests
               if (method, path.rsplit("/", 1)[-1]) in (("POST", "configmaps"),
                                                         ("PUT", LEDGER)))


def gpus_used(store: LedgerStore) -> float:
    return store.view().tenant("team-a").gpus


def delete(store: UsageStore, obj: dict[str, Any], *, dry_run: bool = False) -> Decision:
    """The workload's DELETE as the API server sends it: no object, the old one."""
    review = request_review(obj, operation="DELETE", dry_run=dry_run)
    review["request"]["object"] = None
    review["request"]["oldObject"] = obj
    req = parse_review(orjson.dumps(review))
    return asyncio.run(webhooks.admit(Phase.VALIDATE, req, policy(), Cluster(store=store)))


def test_a_gang_is_written_whole_in_one_commit(api: FakeAPI) -> None:
    store = replica(api)
    d = admit(store, policy(), vcjob(("master", 1, 0), ("worker", 3, 2), name="a"))
    assert d.allowed and d.warnings == [], d.warnings
    assert slots(api, "uid-a") == ["uid-a#0", "uid-a#1", "uid-a#2"]
    assert writes(api) == 1
    slot = entries(api)["uid-a#0"]
    assert slot["gang"] == ["uid-a", "team-a/volcano.sh/job-name=a"]
    assert slot["expires"] == NOW + GANG_BOUND_SECONDS
    assert slot["resources"] == {"nvidia.com/gpu": 2.0}
    assert gpus_used(store) == 6


def test_pods_draw_their_slots_and_count_once(api: FakeAPI) -> None:
    store = replica(api)
    assert admit(store, policy(), vcjob(("worker", 3, 2), name="a")).allowed
    other = replica(api)  # the pods reach another replica
    for i in range(3):
        assert admit(other, policy(), gang_pod("a", i, by_label=i == 2)).allowed
        assert len(slots(api, "uid-a")) == 2 - i  # one slot replaced by one pod entry
        assert gpus_used(other) == 6
    assert entries(api)["uid-a-worker-0"]["name"] == "team-a/a-worker-0"
    # The gang is drawn: a fourth pod of its shape is checked as any pod (6 of the 6
    # A100s are held) and refused.
    assert not admit(other, policy(), gang_pod("a", 3)).allowed


def test_a_retried_pod_review_draws_one_slot(api: FakeAPI) -> None:
    store = replica(api)
    assert admit(store, policy(), vcjob(("worker", 2, 2), name="a")).allowed
    assert admit(store, policy(), gang_pod("a", 0)).allowed
    assert admit(store, policy(), gang_pod("a", 0)).allowed
    assert slots(api, "uid-a") == ["uid-a#1"]


def test_two_replicas_racing_reserve_one_gang_whole(api: FakeAPI) -> None:
    # Replica 2 reads the ledger; before its write, replica 1 commits gang a. Replica 2's
    # write fails (409), it decides again on a's slots, and b is not reserved at all.
    one, two = replica(api), replica(api)
    api.before_write = lambda: admit(one, policy(), vcjob(("worker", 2, 2), name="a"))
    b = admit(two, policy(), vcjob(("worker", 2, 2), name="b"))
    assert b.allowed and any("No GPUs are reserved for it" in w for w in b.warnings)
    assert two.conflicts == 1
    assert slots(api, "uid-a") == ["uid-a#0", "uid-a#1"] and slots(api, "uid-b") == []
    # b's pods do not get in ahead of a's: 2 A100s are free (6 - 4 reserved).
    assert admit(two, policy(), gang_pod("b", 0)).allowed
    assert not admit(two, policy(), gang_pod("b", 1)).allowed
    assert all(admit(one, policy(), gang_pod("a", i)).allowed for i in range(2))


def test_a_retried_gang_review_reserves_once(api: FakeAPI) -> None:
    store = replica(api)
    job = vcjob(("worker", 2, 2), name="a")
    assert admit(store, policy(), job).allowed
    assert admit(store, policy(), job).allowed
    assert len(slots(api, "uid-a")) == 2 and writes(api) == 1


def test_a_forged_slot_lifts_no_cap(api: FakeAPI) -> None:
    # Six A100s are held by pods; a slot written by hand for gang a claims 2 more. A
    # pod of gang a that took the slot unchecked would make 8 of 6: it is refused.
    store = replica(api)
    for i in range(3):
        busy = pod(f"busy-{i}", gpus=2, owner=("Job", "other"))
        store.state.pod_event("ADDED", busy)
    forged = {"ns": "team-a", "owner": "job/a", "product": "a100",
              "resources": {"nvidia.com/gpu": 2}, "gpus": 2, "expires": NOW + 60,
              "gang": ["uid-a"]}
    api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps(
        {"uid-a#0": forged}).decode()})
    d = admit(store, policy(), gang_pod("a", 0))
    assert not d.allowed
    assert "6 in use" in d.message
    assert "uid-a-worker-0" not in entries(api)


@pytest.mark.parametrize(("key", "slot", "problem"), [
    ("uid-a#0", {"gang": "uid-a"}, "gang is not a list"),
    ("uid-a#0", {"gang": []}, "gang is not a list"),
    ("uid-a#0", {"gang": [7]}, "a gang id is not a name"),
    ("uid-z#0", {"gang": ["uid-a"]}, "not keyed by its workload 'uid-a'"),
    ("uid-a#0", {"gang": ["uid-a"], "name": "team-a/p"}, "names no pod"),
    ("uid-a#0", {"gang": ["uid-a"], "pods": 0}, "counts one GPU pod"),
])
def test_an_invalid_slot_is_dropped_and_draws_nothing(
        api: FakeAPI, caplog: pytest.LogCaptureFixture, key: str, slot: dict[str, Any],
        problem: str) -> None:
    entry = {"ns": "team-a", "owner": "job/a", "product": "a100",
             "resources": {"nvidia.com/gpu": 2}, "gpus": 2, "expires": NOW + 60, **slot}
    data = {"reservations": orjson.dumps({key: entry}).decode()}
    with caplog.at_level(logging.ERROR, logger="gpu_webhook"):
        assert decode("team-a", data, NOW) == {}
    [record] = [r for r in caplog.records if "ledger entry is invalid" in r.getMessage()]
    assert problem in record.fields["problem"]  # type: ignore[attr-defined]


def test_deleting_the_workload_frees_the_untaken_slots(api: FakeAPI) -> None:
    store = replica(api)
    job = vcjob(("worker", 3, 2), name="a")
    assert admit(store, policy(), job).allowed
    assert admit(store, policy(), gang_pod("a", 0)).allowed
    other = replica(api)
    assert delete(other, job, dry_run=True).skipped == "operation"  # a dry run: no trace
    assert len(slots(api, "uid-a")) == 2
    d = delete(other, job)
    assert d.allowed and d.skipped == "released"
    assert slots(api, "uid-a") == []
    assert "uid-a-worker-0" in entries(api)  # the pod that drew still counts
    assert gpus_used(other) == 2
    assert delete(other, job).skipped == "operation"  # nothing left: no write
    assert writes(api) == 3


def test_a_workload_delete_frees_a_memory_store_gang_too() -> None:
    store = MemoryStore()
    job = vcjob(("worker", 3, 2), name="a")
    assert admit(store, policy(), job).allowed
    assert admit(store, policy(), gang_pod("a", 0)).allowed
    assert delete(store, job).skipped == "released"
    assert store.view().tenant("team-a").gpus == 2 and not store.gangs


def test_an_unreachable_ledger_admits_the_gang_unreserved_with_a_warning(
        api: FakeAPI) -> None:
    store = replica(api)
    api.faults.append("503")
    d = admit(store, policy(), vcjob(("worker", 2, 2), name="a"))
    assert d.allowed
    assert any(w.startswith("volcano job team-a/a: no GPUs are reserved for its gang: the "
                            "GPU quota ledger cannot be reached (") for w in d.warnings), \
        d.warnings
    assert "ledger-unavailable" in d.faults


def test_a_delete_is_allowed_when_the_ledger_is_unreachable(api: FakeAPI) -> None:
    store = replica(api)
    job = vcjob(("worker", 2, 2), name="a")
    assert admit(store, policy(), job).allowed
    api.faults.append("503")
    d = delete(store, job)
    assert d.allowed and d.skipped == "operation"
    assert len(slots(api, "uid-a")) == 2  # left to the bound
