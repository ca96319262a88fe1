"""``LedgerStore`` under concurrency: a tenant's pods that arrive while its ledger is
being written are committed together by the next write (group commit), and the ledger
as last written is the next commit's read.

Against the fake ConfigMaps API over HTTP (``fakeapi``), through the real admission
pipeline. What a platform team relies on: many pods of one tenant at once never get
past the cap, another replica's write in the middle of a batch is noticed and every pod
of the batch is decided again, and a commit costs one API call while no other replica
writes the tenant's ledger.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
from fakeapi import FakeAPI
from kubernetes import client
from quotakit import NOW, ledger_replica, pod, policy

from webhook.admission.webhooks import Cluster, validating
from webhook.engine.decision import Decision
from webhook.k8s.review import parse_review, request_review
from webhook.libs.kube import ConfigMaps
from webhook.quota.entries import LEDGER_PREFIX, Entry, encode
from webhook.quota.ledger import LedgerStore
from webhook.quota.usage import Charge

NS = "gpu-webhook"
LEDGER = LEDGER_PREFIX + "team-a"


def make_store(api: FakeAPI) -> LedgerStore:
    return ledger_replica(api)


async def admit_all(store: LedgerStore, pods: list[dict[str, Any]]) -> list[Decision]:
    cluster = Cluster(store=store)
    reqs = [parse_review(orjson.dumps(request_review(p))) for p in pods]
    return list(await asyncio.gather(*(validating(r, policy(), cluster, 5.0) for r in reqs)))


def reserved(api: FakeAPI) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(api.data(NS, LEDGER)["reservations"])
    return out


def writes(api: FakeAPI) -> int:
    return sum(1 for method, _ in api.requests if method in ("POST", "PUT"))


def test_pods_arriving_together_fill_the_cap_exactly_in_fewer_writes(api: FakeAPI) -> None:
    store = make_store(api)
    # team-a may run 5 pods; 12 arrive at once.
    decisions = asyncio.run(admit_all(store, [pod(f"p{i}", gpus=1) for i in range(12)]))
    admitted = [d for d in decisions if d.allowed]
    assert len(admitted) == 5
    assert len(reserved(api)) == 5
    assert all("pods" in d.message for d in decisions if not d.allowed)
    assert writes(api) < 5  # batched: fewer writes than reservations
    assert store.commits == 5


def test_another_replica_writing_mid_batch_makes_the_batch_decide_again(
        api: FakeAPI) -> None:
    store = make_store(api)
    other = {"ns": "team-a", "owner": "pod/elsewhere", "product": "a100",
             "resources": {"nvidia.com/gpu": 4}, "gpus": 4, "expires": NOW + 30}
    asyncio.run(admit_all(store, [pod("first", gpus=1)]))
    # Before this replica's next write lands, another replica reserves 4 of the 6 a100
    # GPUs: the write conflicts, and of the 4 pods only 1 still fits (1 + 4 + 1 = 6).
    api.before_write = lambda: api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps(
        {**reserved(api), "uid-elsewhere": other}).decode()})
    decisions = asyncio.run(admit_all(store, [pod(f"q{i}", gpus=1) for i in range(4)]))
    assert sum(d.allowed for d in decisions) == 1
    held = reserved(api)
    assert "uid-elsewhere" in held and "uid-first" in held
    assert sum(e["gpus"] for e in held.values()) == 6  # the a100 cap, not a GPU more
    assert store.conflicts == 1


def test_a_batch_whose_write_fails_admits_none_of_it_and_holds_nothing(
        api: FakeAPI) -> None:
    # The first pod's write is held at the API server while three more pods arrive;
    # they queue as the next batch, and the API server fails that batch's write. None
    # of the batch is admitted (the API server would create pods the ledger does not
    # hold), each is told why, and the ledger keeps only the first pod: the room the
    # batch asked for is still there once the API server answers again.
    store = make_store(api)
    cluster = Cluster(store=store)
    landing = threading.Event()

    def hold_the_first_write() -> None:
        api.before_write = lambda: api.faults.append("500")  # the batch's write
        landing.wait(10)

    async def scenario() -> list[Decision]:
        def review(name: str) -> Any:
            req = parse_review(orjson.dumps(request_review(pod(name, gpus=1))))
            return asyncio.create_task(validating(req, policy(), cluster, 5.0))

        first = review("p0")
        while ("POST", f"/api/v1/namespaces/{NS}/configmaps") not in api.requests:
            await asyncio.sleep(0.005)  # its write is at the API server, held there
        batch = [review(f"p{i}") for i in range(1, 4)]
        while len(store._queued.get("team-a", ())) < 3:  # all three wait for the next write
            await asyncio.sleep(0.005)
        landing.set()
        return [await first, *[await t for t in batch]]

    api.before_write = hold_the_first_write
    decisions = asyncio.run(scenario())
    assert [d.allowed for d in decisions] == [True, False, False, False]
    assert all("the GPU quota ledger cannot be reached" in d.message
               for d in decisions[1:]), [d.message for d in decisions]
    assert sorted(reserved(api)) == ["uid-p0"]
    assert store.commits == 1
    # team-a may run 5 pods: 4 more fit now that the API server answers.
    after = asyncio.run(admit_all(store, [pod(f"q{i}", gpus=1) for i in range(5)]))
    assert sum(d.allowed for d in after) == 4
    assert len(reserved(api)) == 5


def test_a_commit_after_a_commit_is_one_write(api: FakeAPI) -> None:
    store = make_store(api)
    asyncio.run(admit_all(store, [pod("a", gpus=1)]))
    api.requests.clear()
    asyncio.run(admit_all(store, [pod("b", gpus=1)]))
    assert [m for m, _ in api.requests] == ["PUT"]  # no read: the last write is known
    assert sorted(reserved(api)) == ["uid-a", "uid-b"]


def test_an_encoding_from_the_memo_is_the_encoding_made_afresh() -> None:
    def charge(gpus: float) -> Charge:
        return Charge("team-a", "team-a", "pod/x", "a100", {"nvidia.com/gpu": gpus}, gpus)

    memo: dict[str, Any] = {}
    entries = {f"uid-{i}": Entry(charge(1), NOW + i, f"team-a/p{i}") for i in range(200)}
    assert encode(entries, memo) == encode(entries)
    entries["uid-7"] = Entry(charge(4), NOW + 99, "team-a/p7")  # replaced
    del entries["uid-3"]  # expired
    for i in range(200, 400):
        entries[f"uid-{i}"] = Entry(charge(2), NOW + i, None)
    for i in range(0, 150):
        entries.pop(f"uid-{i}", None)
    assert encode(entries, memo) == encode(entries)
    assert len(memo) <= 2 * len(entries) + 64  # what left the ledger left the memo


def test_a_refusal_is_decided_on_the_ledger_as_it_is_not_on_the_last_write(
        api: FakeAPI) -> None:
    # Two replicas. This one fills the a100 cap (6) and keeps its last write as its
    # next read; the other then frees 4 of those GPUs (a gang released, reservations
    # dropped) in a write this replica never sees.
    store, other = make_store(api), make_store(api)
    asyncio.run(admit_all(store, [pod(f"p{i}", gpus=1) for i in range(2)]
                          + [pod("big", gpus=4)]))
    assert sum(e["gpus"] for e in reserved(api).values()) == 6
    held = reserved(api)
    del held["uid-big"]
    api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps(held).decode()})
    # A pod that fits only in the room freed elsewhere: admitted, not refused on the
    # stale copy (a refusal writes nothing, so no conflict would have caught it).
    [d] = asyncio.run(admit_all(store, [pod("after", gpus=4)]))
    assert d.allowed, d.message
    assert sorted(reserved(api)) == ["uid-after", "uid-p0", "uid-p1"]
    # And one that does not fit is refused on the fresh ledger too.
    [d] = asyncio.run(admit_all(other, [pod("more", gpus=1)]))
    assert not d.allowed and "exceeded quota" in d.message
def test_ledger_calls_carry_the_service_account_token_as_refreshed(api: FakeAPI) -> None:
    # In a cluster the webhook authenticates with its service account token, which the
    # kubelet rotates: every ledger call asks the client for the current one.
    cfg = client.Configuration()
    cfg.host, cfg.retries = api.url, 0
    tokens = iter(["Bearer first", "Bearer second", "Bearer third"])
    cfg.api_key = {"authorization": "Bearer stale"}

    def refresh(c: client.Configuration) -> None:
        c.api_key["authorization"] = next(tokens)

    cfg.refresh_api_key_hook = refresh  # type: ignore[assignment]
    maps = ConfigMaps(client.ApiClient(cfg), NS, timeout=2.0)
    assert maps.read(LEDGER).resource_version is None  # absent: created by the write
    version = maps.write(LEDGER, {"reservations": "{}"}, None, {})
    maps.write(LEDGER, {"reservations": "{}"}, version, {})
    assert api.authorizations == ["Bearer first", "Bearer second", "Bearer third"]
