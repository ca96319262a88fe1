"""``LedgerStore``: quota reservations committed to a ConfigMap with compare-and-swap.

Runs the real store, the real ``kube.ConfigMaps`` and the real Kubernetes client against
a fake of the ConfigMaps API over HTTP (``fakeapi``), with faults injected on the wire:
another replica committing between a read and a write (409), the API server failing
(503) or not answering (read timeout), a ledger edited by hand. Each test says which
promise it keeps: the cap is never exceeded, and what cannot be decided is refused
(``onUnavailable: deny``) or admitted with a warning (``allow``), never silently.
The same store against a real kube-apiserver: tests/e2e/test_e2e_ledger.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from fakeapi import FakeAPI
from quotakit import POLICY, admit, pod, policy

from webhook.libs.kube import ConfigMaps, Unreachable
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text
from webhook.quota.cache import ClusterState
from webhook.quota.entries import LEDGER_PREFIX, MAX_TTL, decode, encode
from webhook.quota.ledger import LedgerStore
from webhook.quota.store import ReservationUnavailable
from webhook.quota.usage import Charge

NS = "gpu-webhook"
LEDGER = LEDGER_PREFIX + "team-a"
NOW = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_store(api: FakeAPI, p: CompiledPolicy | None = None, *, wall: float = NOW,
               timeout: float = 10.0) -> tuple[LedgerStore, ClusterState, Clock]:
    """A replica's store over the fake API; its client gives up a request after
    ``timeout`` seconds (long, so only an injected hang ever reaches it), inside the
    admission budget of ``admit`` (quotakit.BUDGET, longer still)."""
    p = p or policy()
    clock = Clock()
    state = ClusterState(lambda: p, clock=clock)
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    store = LedgerStore(state, ConfigMaps(api.api_client(), NS, timeout=timeout), ttl=60,
                        wall=lambda: wall, clock=clock)
    return store, state, clock


def entries(api: FakeAPI) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(api.data(NS, LEDGER)["reservations"])
    return out


def entry(gpus: float, *, ns: str = "team-a", expires: float = NOW + 30, **extra: Any
          ) -> dict[str, Any]:
    return {"ns": ns, "owner": "pod/other", "product": "a100",
            "resources": {"nvidia.com/gpu": gpus}, "gpus": gpus, "expires": expires, **extra}


def test_pods_reserve_up_to_the_cap_and_the_ledger_holds_each(api: FakeAPI) -> None:
    store, _, _ = make_store(api)
    decisions = [admit(store, policy(), pod(f"p{i}", gpus=2)) for i in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]  # a100 cap: 6
    assert sorted(entries(api)) == ["uid-p0", "uid-p1", "uid-p2"]
    assert entries(api)["uid-p0"]["name"] == "team-a/p0"
    assert "would use 8 of its 6 a100 GPUs: 6 in use" in decisions[3].message


def test_a_write_conflict_re_decides_on_the_ledger_another_replica_wrote(api: FakeAPI) -> None:
    # Between this replica's read and its write, another replica commits 6 GPUs: the
    # write fails with 409, and the re-read shows no room. Counting the conflict as a
    # success would admit 8 of 6.
    store, _, _ = make_store(api)
    api.put_configmap(NS, LEDGER, encode({}))
    api.before_write = lambda: api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps(
        {"uid-other": entry(6)}).decode()})
    d = admit(store, policy(), pod("mine", gpus=2))
    assert not d.allowed
    assert "6 in use" in d.message
    assert store.conflicts == 1
    assert sorted(entries(api)) == ["uid-other"]


def test_a_conflict_that_still_fits_commits_on_the_second_try(api: FakeAPI) -> None:
    store, _, _ = make_store(api)
    api.before_write = lambda: api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps(
        {"uid-other": entry(2)}).decode()})
    assert admit(store, policy(), pod("mine", gpus=2)).allowed
    assert sorted(entries(api)) == ["uid-mine", "uid-other"]  # both kept: nothing lost
    assert (store.conflicts, store.commits) == (1, 1)


def test_each_commit_reports_its_phases(api: FakeAPI) -> None:
    # What the admission phase histogram shows of the ledger (webhook=ledger).
    store, _, _ = make_store(api)
    seen: list[str] = []
    store.phase = lambda phase, seconds: seen.append(phase) if seconds >= 0 else None
    assert admit(store, policy(), pod("a", gpus=1)).allowed
    assert seen == ["queued", "read", "decide", "write", "commit"]
    seen.clear()
    assert admit(store, policy(), pod("b", gpus=1)).allowed
    assert seen == ["queued", "decide", "write", "commit"]  # the last write reused: no read
    seen.clear()
    api.before_write = lambda: api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps(
        {"uid-other": entry(1)}).decode()})
    assert admit(store, policy(), pod("c", gpus=1)).allowed
    api.before_write = None
    assert seen[:5] == ["queued", "decide", "write", "backoff", "read"]


def test_expired_reservations_stop_counting_and_are_dropped(api: FakeAPI) -> None:
    api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps({
        "uid-old": entry(6, expires=NOW - 1), "uid-live": entry(2)}).decode()})
    store, _, _ = make_store(api)
    assert admit(store, policy(), pod("mine", gpus=4)).allowed  # 2 live + 4 = 6
    assert sorted(entries(api)) == ["uid-live", "uid-mine"]
    assert store.expired == 1
    assert entries(api)["uid-mine"]["expires"] == NOW + 60


def test_a_reservation_for_a_pod_the_cache_has_seen_counts_once(api: FakeAPI) -> None:
    api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps({
        "uid-seen": entry(4, name="team-a/seen")}).decode()})
    store, state, _ = make_store(api)
    state.pod_event("ADDED", pod("seen", gpus=4))
    assert admit(store, policy(), pod("mine", gpus=2)).allowed  # 4 + 2, not 4 + 4 + 2


@pytest.mark.parametrize(("bad", "problem"), [
    ({**entry(2), "gpus": -4}, "gpus is -4"),
    ({**entry(2), "gpus": float("nan")}, "gpus is NoneType"),  # orjson writes NaN as null
    (entry(1e300), "is 1e+300: outside"),
    ({**entry(2), "gpus": "2"}, "gpus is str"),
    ({**entry(2), "gpus": True}, "gpus is bool"),
    ({**entry(2), "resources": {"nvidia.com/gpu": -8}}, "resources['nvidia.com/gpu'] is -8"),
    ({**entry(2), "resources": ["nvidia.com/gpu"]}, "resources is not an object"),
    ({**entry(2), "ns": 7}, "ns is not a name"),
    (entry(2, expires=NOW + 10 * 3600), "beyond the longest TTL"),
    ({**entry(2), "expires": "tomorrow"}, "not a time"),
    (entry(2, name="other-ns/x"), "is not in namespace 'team-a'"),
    ("4 GPUs", "the entry is str"),
])
def test_an_invalid_entry_is_logged_and_never_adds_room(
        api: FakeAPI, caplog: pytest.LogCaptureFixture, bad: Any, problem: str) -> None:
    # Six GPUs reserved by a valid entry fill the a100 cap; the invalid one beside it
    # must neither free room (a negative amount) nor be silently taken as valid.
    api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps(
        {"uid-full": entry(6), "uid-bad": bad}).decode()})
    store, _, _ = make_store(api)
    with caplog.at_level(logging.ERROR, logger="gpu_webhook"):
        d = admit(store, policy(), pod("mine", gpus=1))
    assert not d.allowed
    assert "6 in use" in d.message
    [record] = [r for r in caplog.records if "ledger entry is invalid" in r.getMessage()]
    fields = record.fields  # type: ignore[attr-defined]
    assert (fields["ledger"], fields["entry"]) == (LEDGER, "uid-bad")
    assert problem in fields["problem"]


def test_decode_keeps_valid_entries_beside_invalid_ones() -> None:
    data = {"reservations": orjson.dumps({"a": entry(1), "b": entry(-1)}).decode()}
    assert list(decode("team-a", data, NOW)) == ["a"]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"text"'])
def test_an_unreadable_ledger_is_logged_and_rewritten(
        api: FakeAPI, caplog: pytest.LogCaptureFixture, text: str) -> None:
    api.put_configmap(NS, LEDGER, {"reservations": text})
    store, _, _ = make_store(api)
    with caplog.at_level(logging.ERROR, logger="gpu_webhook"):
        assert admit(store, policy(), pod("mine", gpus=1)).allowed
    assert any("ledger is unreadable" in r.getMessage() for r in caplog.records)
    assert sorted(entries(api)) == ["uid-mine"]


# -- the ledger cannot be reached ---------------------------------------------------------

ALLOW = compile_policy(load_text(POLICY.replace("spec:\n", "spec:\n  quotaLedger: "
                                                           "{onUnavailable: allow}\n", 1)))


@pytest.mark.parametrize("fault", ["503", "hang", "refused"])
def test_an_unreachable_ledger_denies_with_words_a_developer_can_read(
        api: FakeAPI, caplog: pytest.LogCaptureFixture, fault: str) -> None:
    # A hang is given up by the client's read timeout (0.2 s), a hundred times sooner
    # than the admission budget (quotakit.BUDGET) runs out: the developer reads what
    # happened on the wire however long a loaded machine holds the test's threads.
    store, _, _ = make_store(api, timeout=0.2)
    if fault == "refused":
        store.maps = ConfigMaps(_refusing_client(), NS, timeout=0.2)
    else:
        api.faults.append(fault)
    with caplog.at_level(logging.WARNING, logger="gpu_webhook"):
        d = admit(store, policy(), pod("mine", gpus=1))
    assert not d.allowed
    words = {"503": "the API server failed (HTTP 503)",
             "hang": "the API server did not answer within 0.2s",
             "refused": "cannot connect to the API server"}[fault]
    assert f"the GPU quota ledger cannot be reached ({words})" in d.message
    for internal in ("MaxRetryError", "HTTPConnectionPool", "127.0.0.1", "urllib3"):
        assert internal not in d.message
    [record] = [r for r in caplog.records if r.getMessage() == "quota ledger unavailable"]
    assert record.fields["detail"]  # type: ignore[attr-defined]  # the library's text, logged


def test_on_unavailable_allow_admits_with_a_warning_and_reserves_nothing(api: FakeAPI) -> None:
    store, _, _ = make_store(api, ALLOW)
    api.faults.append("503")
    d = admit(store, ALLOW, pod("mine", gpus=1))
    assert d.allowed
    assert any("the GPU quota ledger cannot be reached" in w for w in d.warnings)
    assert (NS, LEDGER) not in api.configmaps


def test_a_write_that_fails_is_not_a_commit(api: FakeAPI) -> None:
    store, _, _ = make_store(api)
    api.put_configmap(NS, LEDGER, encode({}))
    api.before_write = lambda: api.faults.append("500")
    d = admit(store, policy(), pod("mine", gpus=1))
    assert not d.allowed
    assert store.commits == 0
    assert entries(api) == {}


def test_conflicts_until_the_budget_is_spent_deny(api: FakeAPI) -> None:
    store, _, _ = make_store(api)
    api.put_configmap(NS, LEDGER, encode({}))

    def another_replica_always_first() -> None:
        api.put_configmap(NS, LEDGER, encode({}))
        api.before_write = another_replica_always_first

    api.before_write = another_replica_always_first
    charge = Charge("team-a", "team-a", "pod/mine", "a100", {"nvidia.com/gpu": 1.0}, 1.0)
    with pytest.raises(ReservationUnavailable, match="conflicts"):
        asyncio.run(store.reserve("uid-mine", charge, lambda view: True, budget=0.5))
    api.before_write = None
    assert store.commits == 0 and store.conflicts >= 1


def test_a_cache_not_known_live_refuses_to_decide(api: FakeAPI) -> None:
    # A stalled watch: expired reservations would be counted as free for pods this
    # cache never saw. The commit refuses (onUnavailable applies) and readiness drops.
    store, state, clock = make_store(api)
    clock.now += 2 * state.watch_window() + 1
    assert not store.ready()
    d = admit(store, policy(), pod("mine", gpus=1))
    assert not d.allowed
    assert "view of the cluster's pods is not up to date" in d.message
    assert api.requests == []  # not even read: nothing to decide with
    state.pod_event("PROGRESS", {})
    state.namespace_event("PROGRESS", {})
    assert store.ready()
    assert admit(store, policy(), pod("mine", gpus=1)).allowed


# -- one pod name, one charge ---------------------------------------------------------------


def test_re_creating_a_name_another_pod_holds_needs_no_room(api: FakeAPI) -> None:
    # The case: at 5 of 6, three creates of a name that exists. The API server
    # answers AlreadyExists to each; none may hold GPUs or be refused for quota.
    store, state, _ = make_store(api)
    state.pod_event("ADDED", pod("a", gpus=4))
    state.pod_event("ADDED", pod("x", gpus=1))
    retries = [pod("x", gpus=1, uid=f"uid-x-retry-{i}") for i in range(3)]
    assert [admit(store, policy(), p).allowed for p in retries] == [True, True, True]
    assert admit(store, policy(), pod("free", gpus=1)).allowed  # the 6th is still free
    assert not admit(store, policy(), pod("over", gpus=1)).allowed


def _asking(api: FakeAPI, stored: dict[str, str | Exception]
            ) -> tuple[LedgerStore, ClusterState, list[str]]:
    """A replica's store whose reads of "who holds this name now" answer from
    ``stored`` (namespace/name to uid, or the failure the read meets), the API server's
    pods as the server's store reads them (kube.Pods.holder; shown through a real API
    server in tests/e2e/test_e2e_faults.py)."""
    store, state, _ = make_store(api)
    asked: list[str] = []

    def holder(name: str) -> str | None:
        asked.append(name)
        got = stored.get(name)
        if isinstance(got, Exception):
            raise got
        return got

    store.holder = holder
    return store, state, asked


def test_a_create_of_a_name_another_pod_holds_is_refused_and_keeps_nothing(
        api: FakeAPI) -> None:
    # The API server would answer AlreadyExists after admission; refused here instead,
    # nothing is recorded, so once that pod goes no entry holds its GPUs for a TTL.
    store, state, _ = _asking(api, {"team-a/x": "uid-x"})
    state.pod_event("ADDED", pod("a", gpus=4))
    state.pod_event("ADDED", pod("x", gpus=1))
    retries = [admit(store, policy(), pod("x", gpus=1, uid=f"uid-x-retry-{i}"))
               for i in range(3)]
    assert [d.allowed for d in retries] == [False] * 3
    assert "a pod named 'x' already exists in namespace 'team-a'" in retries[0].message
    assert "kubectl delete pod x -n team-a" in retries[0].message
    assert (NS, LEDGER) not in api.configmaps  # nothing was written
    state.pod_event("DELETED", pod("x", gpus=1))
    assert admit(store, policy(), pod("y", gpus=2)).allowed  # 4 + 2 = 6: x's GPU is free
    assert not admit(store, policy(), pod("z", gpus=1)).allowed
    assert sorted(entries(api)) == ["uid-y"]


def test_only_a_create_of_a_name_the_cache_shows_held_asks_the_api_server(
        api: FakeAPI) -> None:
    store, state, asked = _asking(api, {})
    assert admit(store, policy(), pod("fresh", gpus=1)).allowed
    state.pod_event("ADDED", pod("x", gpus=2))
    # The cache still shows x, but the API server holds no pod of that name now (its
    # deletion not seen yet): decided as a new pod, counted, and x's stale 2 with it.
    assert admit(store, policy(), pod("x", gpus=2, uid="uid-x-new")).allowed
    assert asked == ["team-a/x"]
    assert sorted(entries(api)) == ["uid-fresh", "uid-x-new"]


def test_a_name_whose_holder_cannot_be_read_is_recorded_as_before(api: FakeAPI) -> None:
    store, state, _ = _asking(api, {"team-a/x": Unreachable(
        "read pod team-a/x", "the API server did not answer within 2.0s", "timeout")})
    state.pod_event("ADDED", pod("a", gpus=4))
    state.pod_event("ADDED", pod("x", gpus=1))
    assert admit(store, policy(), pod("x", gpus=1, uid="uid-x-retry")).allowed
    assert sorted(entries(api)) == ["uid-x-retry"]  # counts once x is gone, as before
    state.pod_event("DELETED", pod("x", gpus=1))
    assert admit(store, policy(), pod("y", gpus=1)).allowed  # 4 + 1 (the retry) + 1 = 6
    assert not admit(store, policy(), pod("z", gpus=1)).allowed


def test_when_the_holder_goes_its_successor_is_counted(api: FakeAPI) -> None:
    store, state, _ = make_store(api)
    old = pod("x", gpus=2)
    state.pod_event("ADDED", old)
    assert admit(store, policy(), pod("x", gpus=2, uid="uid-x-new")).allowed
    state.pod_event("DELETED", old)  # the old pod went; the new one may now exist
    assert admit(store, policy(), pod("y", gpus=4)).allowed  # 2 (new x) + 4 = 6
    assert not admit(store, policy(), pod("z", gpus=1)).allowed


def test_a_bigger_pod_under_a_held_name_needs_its_room(api: FakeAPI) -> None:
    store, state, _ = make_store(api)
    state.pod_event("ADDED", pod("x", gpus=1))
    state.pod_event("ADDED", pod("a", gpus=4))
    assert not admit(store, policy(), pod("x", gpus=2, uid="uid-x-big")).allowed


def test_a_retried_create_of_a_pending_pod_is_one_charge(api: FakeAPI) -> None:
    store, _, _ = make_store(api)
    assert admit(store, policy(), pod("x", gpus=3, uid="uid-1")).allowed
    assert admit(store, policy(), pod("x", gpus=3, uid="uid-2")).allowed  # a retry
    assert sorted(entries(api)) == ["uid-1"]
    assert admit(store, policy(), pod("y", gpus=3)).allowed  # 3 + 3 = 6, not 9


def _refusing_client() -> Any:
    import socket

    from kubernetes import client

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    cfg.retries = 0
    return client.ApiClient(cfg)


def test_ledger_module_has_no_unused_limit() -> None:
    assert MAX_TTL >= 3600  # the schema's largest reservationTTLSeconds


# -- a ledger that holds what some replica may not have seen -------------------------------


def test_a_seen_pods_entry_leaves_the_ledger_once_every_live_replica_has_seen_it(
        api: FakeAPI) -> None:
    # The ledger is written whole on every commit: an entry kept for the whole TTL
    # makes every write as big as a minute of admissions. Once this replica has seen
    # the pod for the settle time, any replica that may commit has seen it too.
    store, state, clock = make_store(api)
    assert admit(store, policy(), pod("first", gpus=2)).allowed
    state.pod_event("ADDED", pod("first", gpus=2))
    assert admit(store, policy(), pod("second", gpus=1)).allowed  # notices "first" seen
    assert sorted(entries(api)) == ["uid-first", "uid-second"]  # kept: not settled yet

    clock.now += state.settle_time()
    state.pod_event("PROGRESS", {})
    state.namespace_event("PROGRESS", {})
    d = admit(store, policy(), pod("third", gpus=4))
    assert not d.allowed  # 2 (seen) + 1 (reserved) + 4 > 6: the pod still counts
    assert admit(store, policy(), pod("third", gpus=3)).allowed
    assert sorted(entries(api)) == ["uid-second", "uid-third"]
    assert (store.settled, store.expired) == (1, 0)


def test_an_entry_whose_pod_was_never_seen_stays_until_its_ttl(api: FakeAPI) -> None:
    # A create that failed after admission (or a pod not seen yet): only the TTL ends it.
    store, state, clock = make_store(api)
    assert admit(store, policy(), pod("unseen", gpus=2)).allowed
    clock.now += 10 * state.settle_time()
    state.pod_event("PROGRESS", {})
    state.namespace_event("PROGRESS", {})
    assert admit(store, policy(), pod("other", gpus=1)).allowed
    assert sorted(entries(api)) == ["uid-other", "uid-unseen"]
    assert store.settled == 0


def test_a_replica_whose_watch_lags_cannot_commit_on_a_ledger_without_the_entry(
        api: FakeAPI) -> None:
    # Replica B's pod watch stalled before the pod was created. A drops the entry a
    # settle time after seeing the pod, which is more than B's liveness bound: by then
    # B is not live and refuses to decide, until its watch shows progress again, and a
    # watch that resumes delivers the pod first. No moment counts the pod nowhere.
    a, state_a, clock = make_store(api)
    b, state_b, _ = make_store(api)
    state_b._clock = clock  # one time for both replicas' liveness
    state_b.pod_event("PROGRESS", {})
    state_b.namespace_event("PROGRESS", {})
    assert admit(a, policy(), pod("big", gpus=4)).allowed
    state_a.pod_event("ADDED", pod("big", gpus=4))
    assert admit(a, policy(), pod("small", gpus=1)).allowed  # notices "big" seen
    clock.now += state_a.settle_time()
    for s in (state_a, state_b):
        s.namespace_event("PROGRESS", {})
    state_a.pod_event("PROGRESS", {})
    assert admit(a, policy(), pod("small2", gpus=1)).allowed
    assert "uid-big" not in entries(api)  # settled on A

    d = admit(b, policy(), pod("late", gpus=2))
    assert not d.allowed and "not up to date" in d.message  # B's pod watch is not live
    state_b.pod_event("ADDED", pod("big", gpus=4))  # its watch resumes
    d = admit(b, policy(), pod("late", gpus=2))
    assert not d.allowed  # 4 (seen) + 1 + 1 (reserved) + 2 > 6
    assert "would use 8 of its 6" in d.message
