"""A replica counts the reservations of its tenants' ledgers for pods it has not seen; it
keeps only those between commits (the whole ledger holds every admission of the last
TTL), dropping an entry once its pod is seen or it expires. What it counts must always be
what reading the whole ledger afresh would give: a dropped entry that still counted would
be room given away on every later admission.

Property test against the fake ConfigMaps API, through the real validating pipeline:
pods admitted, seen by the pod watch, ended, deleted and created again under a taken name,
the clock moved past reservations' expiry, views taken in between; after every step the
replica's count equals that of a replica that reads the ledger now, for the first time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fakeapi import FakeAPI, running
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quotakit import LEDGER_NAMESPACE, NOW, pod, policy

from webhook.admission.webhooks import Cluster, validating
from webhook.k8s.review import parse_review, request_review
from webhook.libs.kube import ConfigMaps
from webhook.quota.cache import ClusterState
from webhook.quota.entries import LEDGER_PREFIX
from webhook.quota.ledger import LedgerStore
from webhook.quota.usage import Usage

NAMES = ["a", "b", "c", "d", "e", "f"]

steps = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.sampled_from(NAMES), st.integers(1, 3)),
    st.tuples(st.just("see"), st.sampled_from(NAMES), st.just(0)),
    st.tuples(st.just("end"), st.sampled_from(NAMES), st.just(0)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES), st.just(0)),
    st.tuples(st.just("view"), st.just(""), st.just(0)),
    st.tuples(st.just("later"), st.just(""), st.integers(5, 40)),
), min_size=1, max_size=25)


def counted(u: Usage) -> tuple[float, int, dict[str, float], float, int]:
    t, ns = u.tenant("team-a"), u.namespace("team-a")
    return (round(t.gpus, 6), t.pods, {k: round(v, 6) for k, v in t.products.items() if v},
            round(ns.gpus, 6), ns.pods)


def run_steps(api: FakeAPI, program: list[tuple[str, str, int]]) -> None:
    clock = [NOW]
    p = policy()
    state = ClusterState(lambda: p)
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    maps = ConfigMaps(api.api_client(), LEDGER_NAMESPACE, timeout=2.0)
    store = LedgerStore(state, maps, ttl=60, wall=lambda: clock[0])
    cluster = Cluster(store=store)
    made: dict[str, dict[str, Any]] = {}  # name -> the last pod object admitted under it
    generation = 0
    for op, name, n in program:
        if op == "admit":
            generation += 1
            obj = pod(name, gpus=n, uid=f"uid-{name}-{generation}")
            req = parse_review(orjson.dumps(request_review(obj)))
            if asyncio.run(validating(req, p, cluster, 5.0)).allowed:
                made[name] = obj
        elif op == "see" and name in made:
            state.pod_event("ADDED", made[name])
        elif op == "end" and name in made:
            state.pod_event("MODIFIED", {**made[name], "status": {"phase": "Succeeded"}})
        elif op == "delete" and name in made:
            state.pod_event("DELETED", made.pop(name))
        elif op == "view":
            store.view()
        elif op == "later":
            clock[0] += n
        # A replica reading the whole ledger now, for the first time, with the same cache.
        fresh = LedgerStore(state, maps, ttl=60, wall=lambda: clock[0])
        if (LEDGER_NAMESPACE, LEDGER_PREFIX + "team-a") in api.configmaps:
            ledger = {"team-a": maps.read(LEDGER_PREFIX + "team-a")}
        else:
            ledger = {}
        assert counted(store.reserved()) == counted(fresh.reserved(ledger)), (op, name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=steps)
def test_what_a_replica_counts_is_what_the_whole_ledger_says(
        program: list[tuple[str, str, int]]) -> None:
    with running() as api:
        run_steps(api, program)
