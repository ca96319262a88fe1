"""A replica that does not decide GPU quota relays its reviews to the one that does
(``--quota-commit leader``, ``webhook.server.web.forward``): the leader's answer is sent
on byte for byte; a dry run, or a review relayed once already, is decided where it
arrived; with no answer from the leader a quota commit is refused, never admitted
uncounted. The leader here is a real ``gpu-webhook serve`` over TLS (deciding in its own
memory); the relaying replica is the server's ASGI app, not leading. Through a real API
server with a leader killed: tests/e2e/test_e2e_leader.py."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import jsonpatch
import orjson
import pytest
from kit import Reply, Server, call, start_server, stop_server
from serverkit import pod, review

from webhook.libs import certs
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.cache import ClusterState
from webhook.quota.decider import DecidingStore
from webhook.server import metrics
from webhook.server.sources.reload import PolicySource
from webhook.server.web.app import AdmissionApp, Runtime
from webhook.server.web.forward import RELAYED, Relay

ONCE = ((RELAYED.encode(), b"1"),)


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("leader"))
    yield server
    stop_server(server)


def relaying(leader_url: str, ca: Path) -> tuple[AdmissionApp, DecidingStore]:
    """The app of a replica that does not lead, relaying to ``leader_url``."""
    source = PolicySource(None)
    source.load()

    def policy() -> CompiledPolicy:
        assert source.active is not None
        return source.active.policy

    state = ClusterState(policy)
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    store = DecidingStore(state)  # never told it leads
    relay = Relay(lambda: leader_url, str(ca))
    return AdmissionApp(Runtime(policy=source, store=store, relay=relay)), store


def relays(outcome: str) -> float:
    return sum(metrics.RELAYS.labels(w, outcome)._value.get() for w in ("mutate", "validate"))


def body(name: str, **kw: object) -> bytes:
    return orjson.dumps(review(pod(name), uid=f"uid-{name}", **kw))


def patched(reply: Reply, obj: dict[str, object]) -> dict[str, object]:
    """``obj`` with the mutating answer's JSON Patch applied (as the API server does)."""
    ops = orjson.loads(base64.b64decode(reply.json()["response"]["patch"]))
    out: dict[str, object] = jsonpatch.apply_patch(obj, ops)
    return out


def test_the_leaders_answer_is_sent_on_and_a_relayed_review_is_not_relayed_again(
        leader: Server) -> None:
    app, store = relaying(leader.base_url, leader.ca)

    async def run() -> None:
        before = relays("answered")
        via = await call(app, "/mutate", body("trainer"))
        assert relays("answered") == before + 1
        with leader.client() as direct:
            asked = direct.post("/mutate", content=body("trainer"))
        assert via.status == 200
        assert via.body == asked.content  # the leader's answer, byte for byte
        # Relayed once already (two replicas that each think the other leads): decided
        # here, not sent back.
        here = await call(app, "/mutate", body("trainer"), headers=ONCE)
        assert relays("answered") == before + 1
        assert here.json()["response"]["allowed"]
        # The pod as the API server stores it, validated here: no replica decides here.
        final = patched(here, pod("trainer") | {"metadata": {
            "name": "trainer", "namespace": "research", "uid": "uid-trainer"}})
        refused = await call(app, "/validate",
                             orjson.dumps(review(final, uid="uid-v")), headers=ONCE)
        answer = refused.json()["response"]
        assert not answer["allowed"]
        assert "none decides it now" in answer["status"]["message"]
        # Relayed, the leader decides it: admitted, and charged there, not here.
        admitted = await call(app, "/validate", orjson.dumps(review(final, uid="uid-v")))
        assert admitted.json()["response"]["allowed"]
        assert store.reserved.tenant("research").gpus == 0
        # A dry run reserves nothing: decided here.
        dry = await call(app, "/validate",
                         orjson.dumps(review(final, uid="uid-d", dry_run=True)))
        assert dry.json()["response"]["allowed"]
        assert relays("answered") == before + 2
        await app.runtime.relay.close()  # type: ignore[union-attr]

    asyncio.run(run())


def test_with_no_answer_from_the_leader_a_quota_commit_is_refused(tmp_path: Path,
                                                                  leader: Server) -> None:
    # A leader that is gone (a closed port): the review is decided here, where no
    # replica decides quota, so the pod is refused saying so.
    app, _ = relaying("https://127.0.0.1:9", leader.ca)

    async def run() -> None:
        failed = relays("failed")
        mutated = await call(app, "/mutate", body("late"))
        assert relays("failed") == failed + 1
        assert mutated.json()["response"]["allowed"]  # a mutation charges nothing
        final = patched(mutated, pod("late") | {"metadata": {
            "name": "late", "namespace": "research", "uid": "uid-late"}})
        refused = await call(app, "/validate", orjson.dumps(review(final, uid="uid-l")))
        answer = refused.json()["response"]
        assert not answer["allowed"]
        assert "GPU quota is decided by one webhook replica, and none decides it now" in \
            answer["status"]["message"]
        await app.runtime.relay.close()  # type: ignore[union-attr]

    asyncio.run(run())


def test_a_changed_ca_file_is_what_the_next_relay_checks_the_leader_by(
        tmp_path: Path, leader: Server) -> None:
    # The CA file the relay trusts holds another CA (as after the leader's certificate
    # was issued by a CA rolled over since): the leader is not trusted and the review is
    # decided here. The file then gets the leader's CA, as a mounted Secret's update or
    # a self-managed sync writes it: the next review is relayed, with no restart.
    now = dt.datetime.now(dt.UTC)
    ca = tmp_path / "ca.crt"
    ca.write_bytes(certs.new_ca(now, now + dt.timedelta(days=1))[0])
    app, _ = relaying(leader.base_url, ca)

    async def run() -> None:
        failed, answered = relays("failed"), relays("answered")
        await call(app, "/mutate", body("early"))
        assert (relays("failed"), relays("answered")) == (failed + 1, answered)
        fresh = tmp_path / "ca.crt.new"
        fresh.write_bytes(leader.ca.read_bytes())
        fresh.replace(ca)
        via = await call(app, "/mutate", body("later"))
        assert (relays("failed"), relays("answered")) == (failed + 1, answered + 1)
        assert via.json()["response"]["allowed"]
        await app.runtime.relay.close()  # type: ignore[union-attr]

    asyncio.run(run())
