"""``ClusterState`` (the watch-fed pod cache) and ``kube.Watcher`` that feeds it.

The state is driven by the events a watch delivers; the watcher runs the real
Kubernetes client against a fake pods list/watch API over HTTP (``fakeapi``), whose
stream can end cleanly, send a bookmark, or go silent without closing (a stalled
connection). Tests wait for delivered events, never for time: each wait has a generous
guard so a broken watcher fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fakeapi import FakeAPI
from quotakit import POLICY, pod, policy

from webhook.libs.kube import LoopWatcher, Watcher, loop_watcher
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text
from webhook.quota.cache import EVENTS_PER_TURN, ClusterState

GUARD = 30.0  # seconds: only ever reached when the code under test is broken
# A watch window no step of a test outlasts: a connection is given up after three
# windows of silence, so with it only a stall the test injects (and waits for) is.
QUIET = GUARD


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def synced_state() -> tuple[ClusterState, Clock]:
    p = policy()
    clock = Clock()
    state = ClusterState(lambda: p, clock=clock)
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    return state, clock


def test_gpu_pods_count_until_they_end_or_go() -> None:
    state, _ = synced_state()
    state.pod_event("ADDED", pod("a", gpus=2))
    state.pod_event("ADDED", pod("b", gpus=1))
    state.pod_event("ADDED", pod("cpu", gpus=0))
    assert state.pods.tenant("team-a").gpus == 3
    state.pod_event("MODIFIED", pod("a", gpus=2, phase="Succeeded"))
    state.pod_event("DELETED", pod("b", gpus=1))
    assert state.pods.tenant("team-a").gpus == 0
    # Ended pods stay "seen", so a reservation for them is not counted again.
    assert state.seen("uid-a") and state.seen("uid-b")
    assert not state.seen("uid-never")


def test_an_ended_pod_stays_seen_as_long_as_its_reservation_can_live() -> None:
    # A reservation lives up to reservationTTLSeconds (at most an hour) from its
    # admission: a pod that ended is remembered at least that long, however many end
    # after it, so its reservation (kept in the ledger for other replicas) is never
    # counted again as a pod not seen yet.
    p = compile_policy(load_text(POLICY.replace(
        "  tenants:", "  quotaLedger: {reservationTTLSeconds: 3600}\n  tenants:")))
    assert p.reservation_ttl == 3600
    clock = Clock()
    state = ClusterState(lambda: p, clock=clock)
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    state.pod_event("ADDED", pod("first", gpus=1))
    state.pod_event("DELETED", pod("first", gpus=1))
    clock.now += 3000.0  # within the reservation's TTL, past the default 600 s
    for i in range(1100):  # enough ended pods to trim the tombstones
        state.pod_event("DELETED", pod(f"later-{i}", gpus=1))
    assert state.seen("uid-first")
    clock.now += 2 * 3600.0
    state.pod_event("DELETED", pod("last", gpus=1))
    assert not state.seen("uid-first")  # its reservation has long expired: forgotten


def test_a_pod_that_ends_twice_is_remembered_from_its_last_end() -> None:
    # A pod ends when it fails and again when it is deleted, maybe long after: its
    # tombstone lives from the later end, and a pod that ended between the two is still
    # forgotten on time (the trim reads the oldest tombstones first).
    state, clock = synced_state()
    state.pod_event("ADDED", pod("x", gpus=1))
    state.pod_event("MODIFIED", pod("x", gpus=1, phase="Failed"))  # t = 0
    clock.now = 10.0
    state.pod_event("DELETED", pod("y", gpus=1))
    clock.now = 500.0
    state.pod_event("DELETED", pod("x", gpus=1))
    for i in range(1100):  # enough ended pods to trim the tombstones
        state.pod_event("DELETED", pod(f"later-{i}", gpus=1))
    assert state.seen("uid-x") and state.seen("uid-y")  # within 600 s of t = 500 / 10
    clock.now = 700.0  # 600 s are kept: y (ended at 10) is forgotten, x (500) is not
    state.pod_event("DELETED", pod("last", gpus=1))
    assert state.seen("uid-x")
    assert not state.seen("uid-y")
    clock.now = 1200.0
    state.pod_event("DELETED", pod("last-2", gpus=1))
    assert not state.seen("uid-x")


def test_the_holder_of_a_name_is_known_until_it_goes() -> None:
    state, _ = synced_state()
    state.pod_event("ADDED", pod("x", gpus=2))
    assert state.holder("team-a/x") == ("uid-x", state.pods._by_key["uid-x"])
    state.pod_event("MODIFIED", pod("x", gpus=2, phase="Failed"))
    assert state.holder("team-a/x") == ("uid-x", None)  # ended, the name still taken
    state.pod_event("DELETED", pod("x", gpus=2))
    assert state.holder("team-a/x") is None


def test_a_relist_replaces_the_pods_in_one_step() -> None:
    # While a relist refills the cache, the old pods still count: a half-filled cache
    # would admit against too little usage.
    state, _ = synced_state()
    state.pod_event("ADDED", pod("a", gpus=2))
    state.pod_event("ADDED", pod("b", gpus=2))
    state.pod_event("RESET", {})
    state.pod_event("ADDED", pod("b", gpus=2))
    assert state.pods.tenant("team-a").gpus == 4  # still the old view
    state.pod_event("ADDED", pod("c", gpus=1))
    state.pod_event("SYNCED", {})
    assert state.pods.tenant("team-a").gpus == 3  # b + c: a is gone
    assert state.holder("team-a/a") is None and state.holder("team-a/c") is not None


def test_liveness_follows_the_last_sign_of_each_watch() -> None:
    state, clock = synced_state()
    window = state.watch_window()
    assert window == 5.0  # a quarter of the 60 s TTL, capped at 5 s
    clock.now += 2 * window
    assert state.live() and state.synced()
    clock.now += 0.5
    assert not state.live() and not state.synced()
    state.pod_event("PROGRESS", {})
    assert not state.live()  # the namespace watch is silent too
    state.namespace_event("PROGRESS", {})
    assert state.synced()


def test_not_synced_until_both_lists_arrived() -> None:
    p = policy()
    state = ClusterState(lambda: p)
    state.pod_event("SYNCED", {})
    assert not state.synced()
    state.namespace_event("SYNCED", {})
    assert state.synced()


# -- the watcher, against the fake API ----------------------------------------------------


class Events:
    """What a Watcher delivered, in order, with a way to wait for the next one."""

    def __init__(self) -> None:
        self.q: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.seen: list[str] = []

    def __call__(self, typ: str, obj: dict[str, Any]) -> None:
        self.q.put((typ, obj))

    def next(self) -> tuple[str, dict[str, Any]]:
        typ, obj = self.q.get(timeout=GUARD)
        self.seen.append(typ)
        return typ, obj

    def until(self, typ: str) -> list[str]:
        got = []
        while True:
            t, _ = self.next()
            got.append(t)
            if t == typ:
                return got


class OnLoop:
    """An event loop running in a thread of its own, as the server's runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def start(self, w: LoopWatcher) -> None:
        async def start() -> None:
            w.start()

        asyncio.run_coroutine_threadsafe(start(), self.loop).result(GUARD)

    def close(self) -> None:
        async def cancel_all() -> None:  # as asyncio.run does at the end
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(GUARD)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(GUARD)
        self.loop.close()


TOKEN = "Bearer a-service-account-token"


@pytest.fixture(params=["thread", "loop"])
def make_watcher(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """Both pod watchers, against the same fake API: :class:`Watcher` (a thread) and
    :class:`LoopWatcher` (the event loop's own connection)."""
    on_loop = OnLoop() if request.param == "loop" else None

    def make(api: FakeAPI, deliver: Callable[[str, dict[str, Any]], None],
             window: Callable[[], float]) -> Watcher | LoopWatcher:
        c = api.api_client()
        c.configuration.api_key["authorization"] = TOKEN
        if on_loop is None:
            w: Watcher | LoopWatcher = Watcher(c, "pods", deliver, window=window)
            w.start()
            return w
        lw = loop_watcher(c, "pods", deliver, window)
        assert lw is not None
        on_loop.start(lw)
        return lw

    yield make
    if on_loop is not None:
        on_loop.close()


def test_the_watcher_lists_then_streams_and_shows_progress(
        api: FakeAPI, make_watcher: Callable[..., Any]) -> None:
    api.pods = [pod("a", gpus=1)]
    events = Events()
    w = make_watcher(api, events, lambda: QUIET)
    try:
        assert events.until("SYNCED") == ["ADDED", "SYNCED"]
        api.watch_events.put({"type": "ADDED", "object": pod("b", gpus=1)})
        api.watch_events.put({"type": "BOOKMARK", "object": {
            "kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "200"}}})
        api.watch_events.put("close")  # the server's watch timeout
        assert [events.next()[0] for _ in range(3)] == ["ADDED", "PROGRESS", "PROGRESS"]
        # It watches again from where it was: the next event arrives on a new request.
        api.watch_events.put({"type": "DELETED", "object": pod("b", gpus=1)})
        typ, obj = events.next()
        assert (typ, obj["metadata"]["uid"]) == ("DELETED", "uid-b")
    finally:
        w.stop()
        api.watch_events.put("close")


def test_a_stalled_watch_is_given_up_and_listed_again(
        api: FakeAPI, make_watcher: Callable[..., Any]) -> None:
    # The stream goes silent without closing. The watcher must not wait for it forever:
    # its read times out (three windows) and it lists again on a new connection, which
    # the consumer sees as RESET + the list + SYNCED.
    api.pods = [pod("a", gpus=1)]
    events = Events()
    w = make_watcher(api, events, lambda: 0.3)  # given up after 0.9 s of silence
    try:
        events.until("SYNCED")
        # Silent either way: the stall, or the test held for 0.9 s before it came.
        api.watch_events.put("stall")
        assert events.until("SYNCED") == ["RESET", "ADDED", "SYNCED"]
    finally:
        w.stop()
        api.released.set()


def test_a_stalled_watch_makes_the_state_not_live_until_it_recovers(
        api: FakeAPI, make_watcher: Callable[..., Any]) -> None:
    # Between the stall and the relist, no progress arrives: with a clock the test
    # moves, the state goes not-live exactly when two windows pass without a sign.
    # The relist (0.9 s of silence after the list) reaches the state only once the
    # test has looked: however long the test is held, the order is the same.
    state, clock = synced_state()
    looked = threading.Event()
    done = threading.Event()
    seen: list[str] = []
    window = [0.3]

    def deliver(typ: str, obj: dict[str, Any]) -> None:
        if typ == "RESET":
            looked.wait(GUARD)
        seen.append(typ)
        state.pod_event(typ, obj)
        if typ == "SYNCED" and seen.count("SYNCED") == 2:
            done.set()

    api.pods = [pod("a", gpus=1)]
    w = make_watcher(api, deliver, lambda: window[0])
    try:
        assert w.synced.wait(GUARD)  # listed: the clock is moved only after this sign
        api.watch_events.put("stall")
        clock.now += 2 * state.watch_window() + 1  # no sign of life for too long
        state.namespace_event("PROGRESS", {})
        assert not state.synced()
        window[0] = QUIET  # the watch after the relist is not given up before the end
        looked.set()
        assert done.wait(GUARD)  # the relist on a new connection
        assert state.synced()
        assert seen == ["ADDED", "SYNCED", "RESET", "ADDED", "SYNCED"]
    finally:
        looked.set()
        w.stop()
        api.released.set()


def test_an_expired_watch_is_listed_again_with_the_credentials_on_every_request(
        api: FakeAPI, make_watcher: Callable[..., Any]) -> None:
    # 410 Gone: the resourceVersion the watch resumes from is older than the API server
    # keeps. Nothing after it can be trusted to be complete: list again.
    api.pods = [pod("a", gpus=1)]
    events = Events()
    w = make_watcher(api, events, lambda: QUIET)
    try:
        events.until("SYNCED")
        api.watch_events.put({"type": "ERROR", "object": {
            "kind": "Status", "code": 410, "reason": "Expired",
            "message": "too old resource version"}})
        api.pods = [pod("b", gpus=1)]
        assert events.until("SYNCED") == ["RESET", "ADDED", "SYNCED"]
        watches = [i for i, r in enumerate(api.requests) if r == ("GET", "/api/v1/pods")]
        assert len(watches) >= 3  # list, watch, list again
        assert {api.authorizations[i] for i in watches} == {TOKEN}
    finally:
        w.stop()
        api.watch_events.put("close")


def test_an_event_the_cache_fails_to_apply_is_reported_and_the_watch_goes_on(
        api: FakeAPI) -> None:
    # On the loop the watcher hands events to the cache itself: one that raises must
    # not end the watch (a relist would meet the same pod and fail again, for ever).
    api.pods = [pod("a", gpus=1)]
    events = Events()
    reported: list[str] = []

    def deliver(typ: str, obj: dict[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") in ("a", "b"):
            raise ValueError("a pod the cache cannot read")
        events(typ, obj)

    on_loop = OnLoop()
    on_loop.loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
    w = loop_watcher(api.api_client(), "pods", deliver, lambda: QUIET)
    assert w is not None
    on_loop.start(w)
    try:
        assert events.until("SYNCED") == ["SYNCED"]  # the listed pod that failed is skipped
        api.watch_events.put({"type": "ADDED", "object": pod("b", gpus=1)})
        api.watch_events.put({"type": "ADDED", "object": pod("c", gpus=1)})
        typ, obj = events.next()
        assert (typ, obj["metadata"]["name"]) == ("ADDED", "c")  # on the same stream
        assert reported == ["a watch event (ADDED) could not be applied"] * 2
        assert [r for r in api.requests if r == ("GET", "/api/v1/pods")] == [
            ("GET", "/api/v1/pods")] * 2  # one list, one watch: never listed again
    finally:
        w.stop()
        api.watch_events.put("close")
        on_loop.close()


# -- from the watch thread to the event loop ------------------------------------------------


def test_a_burst_of_watch_events_wakes_the_loop_once_and_leaves_it_turns_between() -> None:
    """A relist or a busy cluster delivers events faster than the loop applies them: they
    are applied in order, after one wakeup, a turn's worth at a time with the loop's
    other callbacks (reviews) run between turns."""
    state, _ = synced_state()
    applied: list[str] = []
    wakeups = 0
    burst = 3 * EVENTS_PER_TURN + 5

    async def run() -> None:
        nonlocal wakeups
        loop = asyncio.get_running_loop()
        wake = loop.call_soon_threadsafe

        def counted(*args: Any) -> Any:
            nonlocal wakeups
            wakeups += 1
            return wake(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        deliver = state.deliverer(loop, lambda typ, obj: applied.append(obj["n"]))
        # The watch thread delivers the whole burst while the loop is busy elsewhere.
        t = threading.Thread(target=lambda: [deliver("ADDED", {"n": str(i)})
                                             for i in range(burst)])
        t.start()
        t.join(GUARD)
        loop.call_soon(lambda: applied.append("review"))  # arrives after the burst
        while len(applied) < burst + 1:
            await asyncio.sleep(0)

    asyncio.run(run())
    events = [a for a in applied if a != "review"]
    assert events == [str(i) for i in range(burst)]
    assert wakeups == 1
    # The review ran after the first turn, not after the whole burst.
    assert applied.index("review") == EVENTS_PER_TURN


def test_a_watch_event_that_fails_to_apply_is_reported_and_the_next_ones_applied() -> None:
    state, _ = synced_state()
    applied: list[int] = []
    reported: list[dict[str, Any]] = []

    def handler(typ: str, obj: dict[str, Any]) -> None:
        if obj["n"] == 1:
            raise ValueError("a malformed object")
        applied.append(obj["n"])

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context))
        deliver = state.deliverer(loop, handler)
        t = threading.Thread(target=lambda: [deliver("ADDED", {"n": i}) for i in range(3)])
        t.start()
        t.join(GUARD)
        while len(applied) < 2:
            await asyncio.sleep(0)
        deliver("MODIFIED", {"n": 3})  # the loop is woken again for what comes later
        while len(applied) < 3:
            await asyncio.sleep(0)

    asyncio.run(run())
    assert applied == [0, 2, 3]
    assert [c["message"] for c in reported] == ["a watch event (ADDED) could not be applied"]
    assert isinstance(reported[0]["exception"], ValueError)
