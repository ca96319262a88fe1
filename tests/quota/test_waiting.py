"""Waiting for quota (``tenants[].overQuota: wait``): the gate the mutating webhook adds,
the validating webhook's answer for a gated pod and for the removal of its gate, the
line's order and the release choice (a gang only whole), and the commit that charges
released pods, in memory and in the shared ledger (``fakeapi``)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import jsonpatch
import orjson
import pytest
from fakeapi import FakeAPI
from kit import validating
from quotakit import NOW, POLICY, ledger_replica, pod

from webhook.admission.webhooks import Cluster, Phase, admit, mutating
from webhook.engine.cost import Charge
from webhook.engine.waiting import GATE, REASON, is_gated, ungate_ops, ungated
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text
from webhook.quota.cache import ClusterState
from webhook.quota.check import UsageView
from webhook.quota.entries import LEDGER_PREFIX, decode
from webhook.quota.line import Waiting, line_up, releasable
from webhook.quota.store import Held, MemoryStore
from webhook.server.leading.release import gang_size

WAIT = POLICY.replace("""      quota:
        gpus: 8
        products: {a100: 6, h100: 4}""", """      overQuota: wait
      quota:
        gpus: 8
        products: {a100: 6, h100: 4}""")


def waiting_policy() -> CompiledPolicy:
    assert WAIT != POLICY
    return compile_policy(load_text(WAIT))


def _charge(gpus: float, ns: str = "team-a") -> Charge:
    return Charge("team-a", ns, "pod/x", "a100", {"nvidia.com/gpu": gpus}, gpus)


def _store_using(gpus: float) -> MemoryStore:
    store = MemoryStore()
    if gpus:
        store.pod_seen("running", _charge(gpus))
    return store


def _req(obj: dict[str, Any], *, dry_run: bool = False, operation: str = "CREATE",
         old: dict[str, Any] | None = None, username: str = "jane") -> Any:
    review = request_review(copy.deepcopy(obj), dry_run=dry_run, operation=operation,
                            username=username)
    review["request"]["oldObject"] = old
    return parse_review(orjson.dumps(review))


def _asked(name: str, gpus: int = 2) -> dict[str, Any]:
    """A pod as it reaches the mutating webhook (pinned already: the test's policy pins
    to a100), without a uid yet."""
    p = pod(name, gpus=gpus)
    del p["metadata"]["uid"]
    return p


# --- the mutating webhook ---------------------------------------------------------------


def test_a_pod_over_quota_in_a_waiting_tenant_is_gated_with_the_reason() -> None:
    d = mutating(_req(_asked("big", 2)), waiting_policy(), store=_store_using(7))
    assert d.allowed
    assert {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]} in d.patch
    patched = jsonpatch.apply_patch(_asked("big", 2), d.patch)
    text = patched["metadata"]["annotations"][REASON]
    # The binding cap is named: the a100 cap of 6 (7 GPUs used, all a100), not the 8.
    assert "asks 2 a100 GPUs and tenant team-a has 0 of its 6 free" in text
    assert any("waits for GPU quota" in w for w in d.warnings)


@pytest.mark.parametrize("case", ["fits", "dry-run", "deny-mode", "never-fits"])
def test_a_pod_is_gated_only_when_it_waits_for_room_it_can_have(case: str) -> None:
    p = waiting_policy() if case != "deny-mode" else compile_policy(load_text(POLICY))
    used = 2 if case == "fits" else 7
    obj = _asked("p", 9 if case == "never-fits" else 2)
    d = mutating(_req(obj, dry_run=case == "dry-run"), p, store=_store_using(used))
    assert not any(op["path"].startswith("/spec/schedulingGates") for op in d.patch), case


def test_gating_is_idempotent_on_the_mutating_webhooks_reinvocation() -> None:
    p, store = waiting_policy(), _store_using(7)
    req = _req(_asked("big"))
    first = mutating(req, p, store=store)
    assert is_gated(req.object)
    again = mutating(_req(req.object), p, store=store)
    assert [op for op in again.patch if "schedulingGates" in op["path"]] == []
    assert first.patch


# --- the validating webhook -----------------------------------------------------------


def test_a_gated_pod_is_admitted_uncharged_and_one_that_can_never_fit_is_refused() -> None:
    p, store = waiting_policy(), _store_using(7)
    gated = pod("big", gpus=2)
    gated["spec"]["schedulingGates"] = [{"name": GATE}]
    d = validating(_req(gated), p, store=store)
    assert d.allowed, d.message
    assert store.view().tenant("team-a").gpus == 7  # nothing reserved for it
    huge = copy.deepcopy(gated)
    huge["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 9},
                                                  "requests": {"nvidia.com/gpu": 9}}
    d = validating(_req(huge), p, store=store)
    assert not d.allowed and "exceeded quota" in d.message


def _update(user: str, old: dict[str, Any], new: dict[str, Any]) -> Any:
    req = _req(new, operation="UPDATE", old=old, username=user)
    return asyncio.run(admit(Phase.VALIDATE, req, waiting_policy(),
                             Cluster(store=MemoryStore(), gatekeeper="system:serviceaccount:"
                                     "gpu-webhook:gpu-webhook")))


def test_only_the_webhook_itself_may_remove_the_quota_gate() -> None:
    old = pod("big", gpus=2)
    old["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}, {"name": GATE}]
    new = ungated(old)
    assert new["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
    d = _update("jane", old, new)
    assert not d.allowed
    assert "only the GPU webhook removes the scheduling gate gpu-webhook.dev/quota" in d.message
    assert _update("system:serviceaccount:gpu-webhook:gpu-webhook", old, new).allowed
    # Another update of a gated pod (a label, someone else's gate) is not ours to refuse.
    other = copy.deepcopy(old)
    other["spec"]["schedulingGates"] = [{"name": GATE}]
    assert _update("jane", old, other).allowed


def test_the_release_patch_removes_only_our_gate_and_tests_the_pod_first() -> None:
    p = pod("big", uid="u-1")
    p["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}, {"name": GATE}]
    assert ungate_ops(p) == [
        {"op": "test", "path": "/metadata/uid", "value": "u-1"},
        {"op": "test", "path": "/spec/schedulingGates/1", "value": {"name": GATE}},
        {"op": "remove", "path": "/spec/schedulingGates/1"}]
    assert ungate_ops(pod("free")) is None


# --- the cache -----------------------------------------------------------------------------


def test_a_gated_pod_holds_nothing_in_the_cache_and_counts_once_released() -> None:
    p = waiting_policy()
    state = ClusterState(lambda: p)
    gated = pod("big", gpus=2, uid="u-1")
    gated["spec"]["schedulingGates"] = [{"name": GATE}]
    state.pod_event("ADDED", gated)
    assert state.pods.tenant("team-a").gpus == 0 and not state.seen("u-1")
    assert list(state.line.pods) == ["u-1"]
    state.pod_event("MODIFIED", ungated(gated))
    assert state.pods.tenant("team-a").gpus == 2 and state.seen("u-1")
    assert not state.line.pods


# --- the line ----------------------------------------------------------------------------


def _w(name: str, at: str, priority: int = 0, gang: str | None = None) -> Waiting:
    return Waiting(f"u-{name}", "team-a", name, priority, at, gang, 1.0)


def test_the_line_is_priority_then_arrival_and_a_gang_stands_at_its_first_pod() -> None:
    units = line_up([_w("late", "2026-01-01T00:00:09Z"),
                     _w("urgent", "2026-01-01T00:00:10Z", priority=100),
                     _w("g1", "2026-01-01T00:00:05Z", gang="job"),
                     _w("early", "2026-01-01T00:00:01Z"),
                     _w("g0", "2026-01-01T00:00:03Z", gang="job")], {"job": 2})
    assert [[w.name for w in u.pods] for u in units] == [
        ["urgent"], ["early"], ["g0", "g1"], ["late"]]


def test_a_gang_is_releasable_only_when_all_its_pods_are_there() -> None:
    half = line_up([_w("g0", "1", gang="job"), _w("g1", "2", gang="job"), _w("solo", "3")],
                   {"job": 4})
    assert [u.gang for u in releasable(half)] == [None]  # the gang keeps waiting whole
    # Two of its four already run (released before): the two that wait complete it.
    assert releasable(line_up([_w("g2", "1", gang="job"), _w("g3", "2", gang="job")],
                              {"job": 4}, {"job": 2}))[0].size == 4


def test_gang_size_is_parallelism_capped_by_the_completions_left() -> None:
    assert gang_size({"spec": {"parallelism": 4, "completions": 4}}) == 4
    assert gang_size({"spec": {"parallelism": 4, "completions": 8},
                      "status": {"succeeded": 6}}) == 2
    assert gang_size({"spec": {"parallelism": 3}}) == 3
    assert gang_size({"spec": {}}) == 1


# --- the commit ------------------------------------------------------------------------


def _held(name: str, gpus: float, cap: float = 8.0) -> Held:
    def fits(view: UsageView) -> bool:
        return view.tenant("team-a").gpus + gpus <= cap

    return Held(key=f"u-{name}", charge=_charge(gpus), name=f"team-a/{name}", fits=fits)


def test_a_gang_is_charged_whole_or_not_at_all_and_holds_up_the_line_in_memory() -> None:
    store = _store_using(6)  # 2 free
    gang = [_held("g0", 1), _held("g1", 1), _held("g2", 1), _held("g3", 1)]
    done = asyncio.run(store.reserve_in_order("team-a", [gang, [_held("small", 1)]]))
    assert done == []
    assert store.view().tenant("team-a").gpus == 6  # nothing of the gang, nor the pod behind
    store.pod_seen("running", _charge(4))  # two of the running pods' GPUs freed
    done = asyncio.run(store.reserve_in_order("team-a", [gang, [_held("small", 1)]]))
    assert done == [0]  # the gang fits whole (4 of 4 free); the pod behind it does not
    assert store.view().tenant("team-a").gpus == 8


def test_the_ledger_commit_charges_released_pods_once_across_leaders(api: FakeAPI) -> None:
    first, second = ledger_replica(api), ledger_replica(api)

    async def release(store: Any, units: list[list[Held]]) -> list[int]:
        return list(await store.reserve_in_order("team-a", units, 10.0))

    assert asyncio.run(release(first, [[_held("a", 4)], [_held("b", 4)],
                                       [_held("c", 1)]])) == [0, 1]
    # A new leader that retries the same pods (the old one died before ungating them)
    # charges them no second time, and the one behind still does not fit.
    assert asyncio.run(release(second, [[_held("a", 4)], [_held("b", 4)],
                                        [_held("c", 1)]])) == [0, 1]
    data = api.data("gpu-webhook", LEDGER_PREFIX + "team-a")
    assert sorted(decode("team-a", data, NOW)) == ["u-a", "u-b"]


def test_a_jobs_pod_goes_through_the_line_even_when_it_fits_alone() -> None:
    # Two of its Job's four pods would fit now; taken one by one they would hold GPUs
    # the other two then wait for. So the Job's pods are gated, and released together.
    obj = _asked("job-pod-0", 1)
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job",
                                           "name": "train", "uid": "job-1",
                                           "controller": True}]
    req = _req(obj)
    d = mutating(req, waiting_policy(), store=_store_using(2))
    assert is_gated(req.object), d.patch
    assert any("releases the Job's pods together" in w for w in d.warnings)


def test_our_gate_is_added_beside_someone_elses() -> None:
    obj = _asked("queued", 2)
    obj["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    d = mutating(_req(obj), waiting_policy(), store=_store_using(7))
    patched = jsonpatch.apply_patch(obj, d.patch)
    assert patched["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"},
                                                  {"name": GATE}]


def test_a_waiting_tenant_in_a_quota_window_is_gated_at_the_windows_caps() -> None:
    # The validating webhook holds a pod to the caps of the window open now: the gate
    # must be decided at the same caps, or a pod over the window's cap but under the
    # tenant's own would be refused at every retry instead of waiting.
    text = WAIT.replace("""      overQuota: wait
""", """      overQuota: wait
      quotaSchedule:
        timeZone: UTC
        windows:
          - {name: day, start: "08:00", end: "18:00", quota: {gpus: 4}}
""")
    assert text != WAIT
    p = compile_policy(load_text(text))
    noon, night = 1_800_007_200.0, 1_800_043_200.0  # 2027-01-15 10:00 and 20:00 UTC
    for at, gated in ((noon, True), (night, False)):
        d = mutating(_req(_asked("big", 2)), p, store=_store_using(3), now=at)
        assert d.allowed
        assert ("waiting" in d.mutations) is gated, at


def test_a_volcano_jobs_pod_waits_for_its_gang_not_for_a_batch_job() -> None:
    # A Volcano Job is a "Job" too, of another API group: read as a batch Job, its size
    # would never be found and its pods would wait for ever. Its pod goes through the
    # line as its Volcano Job's gang (tests/quota/test_waiting_gangs.py).
    obj = _asked("vc-pod-0", 1)
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "batch.volcano.sh/v1alpha1",
                                           "kind": "Job", "name": "train", "uid": "vcjob-1",
                                           "controller": True}]
    req = _req(obj)
    d = mutating(req, waiting_policy(), store=_store_using(2))
    assert d.allowed and is_gated(req.object), d.patch
    assert any("this pod of job.batch.volcano.sh/train" in w for w in d.warnings)


def test_a_unit_held_back_by_its_users_cap_alone_is_passed_over_whole(api: FakeAPI) -> None:
    # In the shared ledger as in memory: the gang whose second pod its user's cap refuses
    # leaves nothing of itself, and the pod behind it is reserved; a unit the tenant's
    # cap refuses stops the line as before.
    def users_cap(name: str, gpus: float) -> Held:
        h = _held(name, gpus)
        return Held(key=h.key, charge=h.charge, name=h.name, fits=lambda view: False,
                    passed=lambda view: True)

    for store in (_store_using(0), ledger_replica(api)):
        units = [[_held("g0", 1), users_cap("g1", 1)], [_held("next", 2)],
                 [_held("huge", 8)], [_held("last", 1)]]
        assert asyncio.run(store.reserve_in_order("team-a", units, 10.0)) == [1]
        assert store.view().tenant("team-a").gpus == 2
