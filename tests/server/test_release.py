"""The leader's release round (``webhook.server.leading.release``) over a real cluster
state and usage store, with the API calls recorded: a pod's gate is removed only after
its charge is in the store, a Job's pods only together, and nothing of a Job whose size
cannot be read."""

from __future__ import annotations

import asyncio
import copy
from datetime import date
from typing import Any

from kit import policy_yaml

from webhook.engine.cost import Charge
from webhook.engine.waiting import GATE
from webhook.libs import kube
from webhook.policy.compiled import compile_policy
from webhook.policy.load import PolicyError, load_text
from webhook.quota.budget import spending
from webhook.quota.cache import ClusterState
from webhook.quota.fairshare import recent
from webhook.quota.store import MemoryStore
from webhook.quota.usagebook import DayBook, day_start
from webhook.server import metrics
from webhook.server.leading.release import Releaser

POLICY = policy_yaml("release-test", """\
  tenants:
    - name: team
      namespaces: [team]
      quota: {gpus: 4}
      overQuota: wait
""")


def gated(name: str, at: str, job: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": f"u-{name}",
                            "creationTimestamp": at}
    if job:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                    "uid": f"job-{job}", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "schedulingGates": [{"name": GATE}],
        "containers": [{"name": "main", "image": "x", "resources": {
            "limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 1}}}]}}


class Recorded:
    """The API calls a round makes; each gate removal notes what was charged then."""

    def __init__(self, store: MemoryStore, jobs: dict[str, dict[str, Any]]) -> None:
        self.store, self.jobs = store, jobs
        self.removed: list[tuple[str, list[dict[str, Any]], float]] = []
        self.events: list[tuple[str, str]] = []

    def patch(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        self.removed.append((name, ops, self.store.view().tenant("team").gpus))

    def event(self, pod: dict[str, Any], reason: str, message: str) -> None:
        self.events.append((pod["metadata"]["name"], message))

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        if name not in self.jobs:
            raise kube.Unreachable(f"read job {namespace}/{name}", "cannot connect")
        return self.jobs[name]

    def workload(self, group: str, version: str, resource: str, namespace: str,
                 name: str) -> dict[str, Any]:
        return self.job(namespace, f"{resource}.{group}/{version}/{name}")


def round_with(pods: list[dict[str, Any]], used: float, jobs: dict[str, dict[str, Any]],
               text: str = POLICY) -> tuple[Recorded, MemoryStore]:
    policy = compile_policy(load_text(text))
    state = ClusterState(lambda: policy)
    for p in pods:
        state.pod_event("ADDED", copy.deepcopy(p))
    store = MemoryStore()
    if used:
        store.load([("running", Charge("team", "team", "pod/running", None,
                                       {"nvidia.com/gpu": used}, used))])
    api = Recorded(store, jobs)
    releaser = Releaser(lambda: policy, state, store, api, lambda: True)  # type: ignore[arg-type]
    asyncio.run(releaser.round_())
    return api, store


JOB = {"spec": {"parallelism": 3, "completions": 3}}


def test_pods_are_released_in_order_each_after_its_charge_is_committed() -> None:
    api, _ = round_with([gated("b", "2026-01-01T00:00:02Z"),
                             gated("a", "2026-01-01T00:00:01Z"),
                             gated("c", "2026-01-01T00:00:03Z")], 2, {})
    # 2 of 4 GPUs free: a and b, first by arrival, both charged before either gate comes
    # off (the gates of one round come off together); c stays, told its place.
    assert sorted((n, charged) for n, _, charged in api.removed) == [("a", 4), ("b", 4)]
    [ops] = [ops for n, ops, _ in api.removed if n == "a"]
    assert ops[:2] == [
        {"op": "test", "path": "/metadata/uid", "value": "u-a"},
        {"op": "test", "path": "/spec/schedulingGates/0", "value": {"name": GATE}}]
    assert ("c", "waiting for GPU quota: 1 GPUs asked, 0 free; 1st in line in tenant team") \
        in api.events


def test_a_jobs_pods_go_together_or_not_at_all() -> None:
    pods = [gated(f"g{i}", f"2026-01-01T00:00:0{i}Z", job="train") for i in range(3)]
    api, store = round_with(pods, 2, {"train": JOB})
    assert api.removed == [] and store.view().tenant("team").gpus == 2  # 3 do not fit in 2
    api, store = round_with(pods, 1, {"train": JOB})
    assert sorted(n for n, _, _ in api.removed) == ["g0", "g1", "g2"]
    assert {charged for _, _, charged in api.removed} == {4}  # all three charged first


def test_a_job_whose_size_cannot_be_read_releases_none_of_its_pods() -> None:
    pods = [gated(f"g{i}", f"2026-01-01T00:00:0{i}Z", job="train") for i in range(2)]
    api, _ = round_with(pods, 0, {})
    assert api.removed == []


def test_a_release_holds_each_pod_to_the_cap_of_the_user_it_records() -> None:
    # Released as its creation would be admitted: by the user its CREATE recorded, so
    # alice's second pod is not released past her cap of 1 (the tenant's 4 would let it).
    # Only her own cap refuses it: bob's pod behind it goes (test_the_line_passes_over...).
    text = POLICY.replace("      overQuota: wait\n",
                          "      overQuota: wait\n      userQuota: {gpus: 1}\n")
    assert text != POLICY
    pods = [gated("a1", "2026-01-01T00:00:01Z"), gated("a2", "2026-01-01T00:00:02Z"),
            gated("b1", "2026-01-01T00:00:03Z")]
    for p, user in zip(pods, ("alice", "alice", "bob"), strict=True):
        p["metadata"]["annotations"] = {"gpu-webhook.dev/requested-by": user}
    api, store = round_with(pods, 0, {}, text)
    assert sorted(n for n, _, _ in api.removed) == ["a1", "b1"]
    assert store.view().tenant("team").gpus == 2
    # a2 keeps its place at the head of the line, told so.
    assert ("a2", "waiting for GPU quota: 1 GPUs asked, 2 free; 1st in line in tenant team") \
        in api.events


def test_the_line_passes_over_a_pod_held_back_by_its_users_cap_only() -> None:
    # The tenant's own cap still stops the line: with 3 of 4 GPUs taken, a 2-GPU pod of
    # carol (under her cap of 2) at the head holds back bob's 1-GPU pod behind it.
    text = POLICY.replace("      overQuota: wait\n",
                          "      overQuota: wait\n      userQuota: {gpus: 2}\n")
    big = gated("c1", "2026-01-01T00:00:01Z")
    big["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 2},
                                                 "requests": {"nvidia.com/gpu": 2}}
    pods = [big, gated("b1", "2026-01-01T00:00:02Z")]
    for p, user in zip(pods, ("carol", "bob"), strict=True):
        p["metadata"]["annotations"] = {"gpu-webhook.dev/requested-by": user}
    api, store = round_with(pods, 3, {}, text)
    assert api.removed == [] and store.view().tenant("team").gpus == 3


def running_pod(name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    p = gated(name, "2026-01-01T00:00:00Z")
    del p["spec"]["schedulingGates"]
    p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": gpus},
                                               "requests": {"nvidia.com/gpu": gpus}}
    p["status"] = {"phase": phase}
    return p


def test_the_cache_notes_when_a_tenant_gives_gpus_back() -> None:
    # The moment a waiting pod may come to fit, from which its release is timed.
    policy = compile_policy(load_text(POLICY))
    ticks = iter(range(1, 100))
    state = ClusterState(lambda: policy, clock=lambda: float(next(ticks)))
    state.pod_event("ADDED", running_pod("a", 2))
    state.pod_event("ADDED", running_pod("b", 1))
    assert "team" not in state.freed  # arrivals free nothing
    state.pod_event("MODIFIED", running_pod("a", 2, phase="Succeeded"))
    first = state.freed["team"]
    state.pod_event("DELETED", running_pod("b", 1))
    assert state.freed["team"] > first
    freed = state.freed["team"]
    state.pod_event("DELETED", running_pod("a", 2, phase="Succeeded"))  # held nothing
    assert state.freed["team"] == freed


def test_a_release_is_timed_from_the_moment_the_pod_could_fit() -> None:
    def count() -> float:
        return metrics.REGISTRY.get_sample_value(
            "gpu_webhook_release_latency_seconds_count", {"tenant": "team"}) or 0.0

    before = count()
    api, _ = round_with([gated("a", "2026-01-01T00:00:01Z")], 0, {})
    assert [n for n, _, _ in api.removed] == ["a"]
    assert count() == before + 1


def pytorchjob(workers: int) -> dict[str, Any]:
    template = {"spec": gated("t", "")["spec"]}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "ddp", "namespace": "team", "uid": "uid-ddp"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template},
                                             "Worker": {"replicas": workers,
                                                        "template": template}}}}


def operator_pod(name: str, at: str, labels: dict[str, str],
                 owner: tuple[str, str, str]) -> dict[str, Any]:
    p = gated(name, at)
    p["metadata"]["labels"] = labels
    p["metadata"]["ownerReferences"] = [{"apiVersion": owner[0], "kind": owner[1],
                                         "name": owner[2], "uid": f"uid-{owner[2]}",
                                         "controller": True}]
    return p


def test_a_training_jobs_gang_is_sized_from_the_workload_and_released_whole() -> None:
    label = {"training.kubeflow.org/job-name": "ddp"}
    owner = ("kubeflow.org/v1", "PyTorchJob", "ddp")
    pods = [operator_pod(f"ddp-{i}", f"2026-01-01T00:00:0{i}Z", label, owner)
            for i in range(4)]
    jobs = {"pytorchjobs.kubeflow.org/v1/ddp": pytorchjob(3)}
    api, store = round_with(pods, 1, jobs)
    assert api.removed == [] and store.view().tenant("team").gpus == 1  # 4 in 3: none
    api, _ = round_with(pods[:3], 0, jobs)
    assert api.removed == []  # 3 of its 4 pods created: the gang is not complete yet
    assert any("gang of 4 pods" in m and "3 of its 4 pods created" in m
               for _, m in api.events), api.events
    api, _ = round_with(pods, 0, jobs)
    assert sorted(n for n, _, _ in api.removed) == [f"ddp-{i}" for i in range(4)]
    assert {charged for _, _, charged in api.removed} == {4}  # all four charged first
    # Its workload unreadable, none of it goes: a part could hold GPUs the rest waits for.
    api, _ = round_with(pods, 0, {})
    assert api.removed == []


def test_each_group_of_a_leaderworkerset_is_a_gang_of_its_own() -> None:
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "serve", "namespace": "team"},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {
               "size": 2, "workerTemplate": {"spec": gated("t", "")["spec"]}}}}
    pods = [operator_pod(f"serve-{g}-{i}", f"2026-01-01T00:00:0{2 * g + i}Z",
                         {"leaderworkerset.sigs.k8s.io/name": "serve",
                          "leaderworkerset.sigs.k8s.io/group-index": str(g)},
                         ("apps/v1", "StatefulSet", f"serve-{g}"))
            for g in range(2) for i in range(2)]
    api, _ = round_with(pods, 1, {"leaderworkersets.leaderworkerset.x-k8s.io/v1/serve": lws})
    # 3 GPUs free: the first group (2 pods) starts; the second waits whole.
    assert sorted(n for n, _, _ in api.removed) == ["serve-0-0", "serve-0-1"]


COHORT = policy_yaml("release-cohort-test", """\
  tenants:
    - name: team
      namespaces: [team]
      quota: {gpus: 1}
      cohort: {name: lab, borrowingLimit: 4}
      overQuota: wait
    - name: lender
      namespaces: [lender]
      quota: {gpus: 4}
      cohort: {name: lab}
""")


def test_a_pod_waiting_to_borrow_is_released_onto_what_the_cohort_lends() -> None:
    big = gated("big", "2026-01-01T00:00:01Z")
    big["metadata"]["labels"] = {"gpu-webhook.dev/borrowed": "true"}
    big["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 3},
                                                 "requests": {"nvidia.com/gpu": 3}}
    big["spec"].update(priorityClassName="gpu-webhook-borrowed", priority=-100,
                       preemptionPolicy="Never")
    policy = compile_policy(load_text(COHORT))
    state = ClusterState(lambda: policy)
    state.pod_event("ADDED", copy.deepcopy(big))
    store = MemoryStore()
    lent = Charge("lender", "lender", "pod/lender", None, {"nvidia.com/gpu": 2}, 2)
    store.load([("lender", lent)])  # the lender uses 2 of its 4: 2 to lend, 3 asked
    api = Recorded(store, {})
    releaser = Releaser(lambda: policy, state, store, api, lambda: True)  # type: ignore[arg-type]
    asyncio.run(releaser.round_())
    assert api.removed == []
    assert ("big", "waiting to borrow GPUs from cohort lab: 3 GPUs asked, 2 to lend; "
            "1st in line in tenant team") in api.events
    store.pod_seen("lender", None)  # the lender's pod ended
    asyncio.run(releaser.round_())
    assert [n for n, _, _ in api.removed] == ["big"]
    # Charged to the tenant's borrowed account before its gate came off, not to its own.
    assert store.view().tenant("team/borrowed").gpus == 3
    assert store.view().tenant("team").gpus == 0


def test_a_waiting_pod_is_decided_again_when_the_policy_changes() -> None:
    # Each pod's decision is kept between rounds while nothing it depends on changes; a
    # new policy (the tenant's cap raised) is one such change.
    policies = [compile_policy(load_text(POLICY))]
    state = ClusterState(lambda: policies[-1])
    p = gated("a", "2026-01-01T00:00:01Z")
    p["metadata"]["resourceVersion"] = "7"
    state.pod_event("ADDED", copy.deepcopy(p))
    store = MemoryStore()
    store.load([("running", Charge("team", "team", "pod/running", None,
                                   {"nvidia.com/gpu": 4}, 4))])
    api = Recorded(store, {})
    releaser = Releaser(lambda: policies[-1], state, store, api, lambda: True)  # type: ignore[arg-type]
    asyncio.run(releaser.round_())
    asyncio.run(releaser.round_())
    assert api.removed == []  # 4 of 4 in use
    policies.append(compile_policy(load_text(POLICY.replace("gpus: 4", "gpus: 5"))))
    asyncio.run(releaser.round_())
    assert [n for n, _, _ in api.removed] == ["a"]


FAIR = policy_yaml("release-fair-test", """\
  tenants:
    - name: heavy
      namespaces: [heavy]
      quota: {gpus: 1}
      cohort: {name: lab, fairShare: {halfLifeHours: 168}}
      overQuota: wait
    - name: light
      namespaces: [light]
      quota: {gpus: 1}
      cohort: {name: lab, fairShare: {halfLifeHours: 168}}
      overQuota: wait
    - name: lender
      namespaces: [lender]
      quota: {gpus: 2}
      cohort: {name: lab, fairShare: {halfLifeHours: 168}}
""")


def borrowing(name: str, ns: str, at: str) -> dict[str, Any]:
    p = gated(name, at)
    p["metadata"]["namespace"] = ns
    p["metadata"]["labels"] = {"gpu-webhook.dev/borrowed": "true"}
    p["spec"].update(priorityClassName="gpu-webhook-borrowed", priority=-100,
                     preemptionPolicy="Never")
    return p


def released_first(text: str) -> list[str]:
    """Heavy and light each hold their own GPU and wait to borrow one more (heavy's pod
    first); the lender lends one. Heavy used 6 GPUs all last week, light nothing."""
    policy = compile_policy(load_text(text))
    state = ClusterState(lambda: policy)
    state.pod_event("ADDED", borrowing("h", "heavy", "2026-12-07T10:00:01Z"))
    state.pod_event("ADDED", borrowing("l", "light", "2026-12-07T10:00:02Z"))
    store = MemoryStore()
    store.load([(t, Charge(t, t, f"pod/{t}", None, {"nvidia.com/gpu": 1}, 1))
                for t in ("heavy", "light", "lender")])
    week = [DayBook(date(2026, 12, d), day_start(date(2026, 12, d + 1)),
                    {("heavy", "heavy", "", ""): dict.fromkeys(range(24), 6 * 3600.0)})
            for d in range(1, 7)]
    now = day_start(date(2026, 12, 7)) + 11 * 3600
    spent = spending(policy, week, {}, now)
    api = Recorded(store, {})
    releaser = Releaser(lambda: policy, state, store, api, lambda: True,  # type: ignore[arg-type]
                        spending=lambda: spent)
    asyncio.run(releaser.round_())
    return [n for n, _, _ in api.removed]


def test_with_fair_share_the_tenant_below_its_share_borrows_first() -> None:
    assert released_first(FAIR) == ["l"]
    # Without it, the line's order: priority, then arrival.
    assert released_first(FAIR.replace(", fairShare: {halfLifeHours: 168}", "")) == ["h"]


def test_a_cohort_whose_tenants_disagree_on_fair_share_is_refused_at_load() -> None:
    text = FAIR.replace("cohort: {name: lab, fairShare: {halfLifeHours: 168}}\n      "
                        "overQuota: wait\n    - name: light",
                        "cohort: {name: lab, fairShare: {halfLifeHours: 24}}\n      "
                        "overQuota: wait\n    - name: light")
    try:
        load_text(text)
    except PolicyError as exc:
        assert "cohort lab's fairShare differs from tenant" in str(exc)
    else:
        raise AssertionError("loaded")


def test_the_worked_example_weighs_what_docs_quota_says() -> None:
    policy = compile_policy(load_text(FAIR))
    week = [DayBook(date(2026, 12, d), day_start(date(2026, 12, d + 1)),
                    {("heavy", "heavy", "", ""): dict.fromkeys(range(24), 6 * 3600.0)})
            for d in range(1, 7)]
    spent = spending(policy, week, {}, day_start(date(2026, 12, 7)) + 11 * 3600)
    assert spent.standing["lab"] == {"heavy": 0.75, "light": -0.25, "lender": -0.5}

    use = recent(week, {}, day_start(date(2026, 12, 7)) + 11 * 3600, 168, ["heavy"])
    assert round(use["heavy"]) == 623
