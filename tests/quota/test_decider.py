"""The leader decides (``--quota-commit leader``, ``webhook.quota.decider``): quota
decided in one replica's memory from its pod watch, only while it leads and after the
hand-over, and never over a cap, through the validating webhook as the server runs it.
Two replicas and a leader killed through a real API server: tests/e2e/test_e2e_leader.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from quotakit import admit, pod, policy

from webhook.admission import webhooks
from webhook.admission.webhooks import Cluster
from webhook.engine.cost import Charge
from webhook.engine.decision import Decision
from webhook.engine.target import no_labels
from webhook.k8s.review import parse_review, request_review
from webhook.quota.cache import ClusterState
from webhook.quota.decider import DecidingStore, NotDeciding
from webhook.quota.store import Held


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lease:
    """Whether this replica holds the leader Lease, as ``Leadership.leading`` says."""

    def __init__(self) -> None:
        self.held = False

    def __call__(self) -> bool:
        return self.held


def deciding(leading: bool = True, *, handed_over: bool = True
             ) -> tuple[DecidingStore, ClusterState, Clock, Lease]:
    """A replica's store over a synced, empty watch; leading (and past its hand-over)
    unless told otherwise."""
    clock, lease = Clock(), Lease()
    p = policy()
    state = ClusterState(lambda: p, clock=clock)
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    store = DecidingStore(state, ttl=60, clock=clock)
    store.follow(lease)
    if leading:
        lease.held = True
        store.led(True)
        if handed_over:
            clock.now += store.handover()
            _live(state)
    return store, state, clock, lease


def _live(state: ClusterState) -> None:
    state.pod_event("PROGRESS", {})
    state.namespace_event("PROGRESS", {})


def test_the_leader_admits_up_to_the_cap_and_refuses_past_it() -> None:
    store, _, _, _ = deciding()
    got = [admit(store, policy(), pod(f"p{i}", gpus=2)).allowed for i in range(4)]
    assert got == [True] * 3 + [False]  # team-a: a100 capped at 6 GPUs
    d = admit(store, policy(), pod("over", gpus=1))
    assert not d.allowed
    assert "would use 7 of its 6 a100 GPUs: 6 in use" in d.message


def test_a_replica_that_does_not_lead_admits_no_gpu_pod_and_says_why() -> None:
    store, _, _, _ = deciding(leading=False)
    d = admit(store, policy(), pod("p", gpus=1))
    assert not d.allowed
    assert "decided by one webhook replica, and none decides it now" in d.message
    assert "does not decide GPU quota" in d.message
    assert store.reserved.tenant("team-a").gpus == 0  # nothing was kept for it


def test_a_new_leader_waits_out_the_hand_over_before_it_admits() -> None:
    # What the last leader admitted may not be in this replica's watch yet: until every
    # such pod must be stored and seen (TTL + settle time), nothing is admitted.
    store, state, clock, _ = deciding(handed_over=False)
    d = admit(store, policy(), pod("early", gpus=1))
    assert not d.allowed
    assert "took over 0 s ago" in d.message
    assert f"for {int(store.handover())} s more" in d.message
    clock.now += store.handover() - 1
    _live(state)
    assert not admit(store, policy(), pod("still-early", gpus=1)).allowed
    clock.now += 1
    _live(state)
    assert admit(store, policy(), pod("on-time", gpus=1)).allowed


def test_the_old_leaders_pods_count_once_its_watch_shows_them() -> None:
    # At the hand-over's end the watch holds what the last leader admitted: 5 GPUs of 6.
    store, state, clock, _ = deciding(handed_over=False)
    for i in range(2):
        state.pod_event("ADDED", pod(f"old{i}", gpus=2))
    clock.now += store.handover()
    _live(state)
    assert admit(store, policy(), pod("new0", gpus=2)).allowed
    assert not admit(store, policy(), pod("new1", gpus=1)).allowed


def test_losing_the_lease_stops_deciding_at_once_and_winning_it_again_waits() -> None:
    store, state, clock, lease = deciding()
    assert admit(store, policy(), pod("a", gpus=1)).allowed
    lease.held = False  # its last renewal is a duration old: another may lead now
    assert not admit(store, policy(), pod("b", gpus=1)).allowed
    store.led(False)
    lease.held = True
    store.led(True)
    assert "took over" in (store.deciding() or "")
    clock.now += store.handover()
    _live(state)
    assert store.deciding() is None


def test_a_stalled_watch_stops_the_leader_deciding() -> None:
    # A reservation expires on the watch's word that its pod never came: with the watch
    # stalled that word is not there, and a pod counted nowhere could slip past the cap.
    store, state, clock, _ = deciding()
    clock.now += 2 * state.watch_window() + 1
    d = admit(store, policy(), pod("p", gpus=1))
    assert not d.allowed
    assert "does not see the cluster's pods now" in d.message


def test_a_reservation_counts_until_the_watch_shows_its_pod_then_the_pod_counts() -> None:
    store, state, _, _ = deciding()
    assert admit(store, policy(), pod("p", gpus=4)).allowed
    assert store.view().tenant("team-a").gpus == 4
    state.pod_event("ADDED", pod("p", gpus=4))  # the same uid: one charge, not two
    assert store.view().tenant("team-a").gpus == 4
    assert store.reserved.tenant("team-a").gpus == 0
    state.pod_event("DELETED", pod("p", gpus=4))
    assert store.view().tenant("team-a").gpus == 0


def test_a_reservation_whose_pod_never_comes_is_freed_after_the_hand_over_bound() -> None:
    # Shorter would free GPUs of a pod the API server may still store (the reservation
    # TTL) and the watch may still deliver (its settle time).
    store, state, clock, _ = deciding()
    assert admit(store, policy(), pod("refused-later", gpus=6)).allowed
    clock.now += 60 + 1  # the policy's reservation TTL
    _live(state)
    assert store.view().tenant("team-a").gpus == 6
    clock.now += store.handover() - 60
    _live(state)
    assert store.view().tenant("team-a").gpus == 0


def test_two_admissions_racing_for_the_last_gpu_admit_one() -> None:
    # On one event loop, as the server runs them: the check and the reservation have no
    # await between them, so the second is decided with the first counted.
    store, state, _, _ = deciding()
    for i in range(2):
        state.pod_event("ADDED", pod(f"run{i}", gpus=2))
    state.pod_event("ADDED", pod("run2", gpus=1))
    reqs = [parse_review(orjson.dumps(request_review(pod(n, gpus=1)))) for n in "xy"]

    async def both() -> list[Decision]:
        return list(await asyncio.gather(*[
            webhooks.validating(r, policy(), Cluster(no_labels, store), 5.0) for r in reqs]))

    assert sorted(d.allowed for d in asyncio.run(both())) == [False, True]


def test_a_release_round_waits_for_the_hand_over_too() -> None:
    store, _, _, _ = deciding(handed_over=False)
    held = Held(key="uid-w", charge=Charge("team-a", "team-a", "pod/w", "a100",
                                           {"nvidia.com/gpu": 1}, 1),
                name="team-a/w", fits=lambda view: True)
    try:
        asyncio.run(store.reserve_in_order("team-a", [[held]]))
    except NotDeciding as exc:
        assert "took over" in str(exc)
    else:
        raise AssertionError("a new leader released a waiting pod during its hand-over")


def test_docs_quote_the_message_a_developer_gets_during_a_hand_over() -> None:
    store, state, clock, _ = deciding(handed_over=False)
    clock.now += 3
    _live(state)
    d = admit(store, policy(), pod("early", gpus=1))
    assert not d.allowed
    docs = (Path(__file__).parents[2] / "docs" / "quota.md").read_text()
    block = docs.split("### The leader decides", 1)[1].split("```\n", 2)[1]
    quoted = " ".join(block.split())
    assert quoted.startswith("GPU quota is decided by one webhook replica")
    assert quoted in " ".join(d.message.split()), (quoted, d.message)
