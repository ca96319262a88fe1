"""GPU time and GPU-hour budgets, in the pure core: how long a pod held its GPUs (from its
own times), the days kept with their watermark (never a second twice, whatever crashes
between writes), the periods of a budget, and the pipeline refusing or gating a GPU pod
whose tenant has spent its GPU-hours, with the numbers.

The leader's writes through a real API server, a kill by signal and the simulated
cluster's pods that run for set durations are tested in tests/e2e.
"""

from __future__ import annotations

import asyncio
import copy
import random
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import orjson
import pytest
from kit import policy_yaml

from webhook.admission.webhooks import Cluster, mutating, validating
from webhook.engine.cost import Charge
from webhook.k8s.review import AdmissionRequest, parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import PolicyError, load_text
from webhook.quota.budget import Spending, judge, spending
from webhook.quota.gputime import HOUR, HoldBook, bound_at, ended_at
from webhook.quota.store import MemoryStore
from webhook.quota.usagebook import (
    BookUnreadable,
    DayBook,
    account,
    name_of,
    to_write,
    watermark,
)
from webhook.quota.usagebook import sums as kept_sums


def review(obj: dict[str, Any], username: str) -> AdmissionRequest:
    return parse_review(orjson.dumps(request_review(obj, username=username)))


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running(uid: str, start: float, *, ns: str = "research", end: float | None = None,
            deleted: float | None = None, grace: int = 30) -> dict[str, Any]:
    """A pod as the watch shows it: bound at ``start``; ended at ``end``; its deletion
    asked at ``deleted``."""
    pod: dict[str, Any] = {
        "metadata": {"name": uid, "namespace": ns, "uid": uid},
        "spec": {"nodeName": "gpu-1"},
        "status": {"phase": "Running", "startTime": stamp(start + 2), "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(start)}]}}
    if end is not None:
        pod["status"]["phase"] = "Succeeded"
        pod["status"]["containerStatuses"] = [
            {"name": "a", "state": {"terminated": {"finishedAt": stamp(end - 5)}}},
            {"name": "b", "state": {"terminated": {"finishedAt": stamp(end)}}}]
    if deleted is not None:
        pod["metadata"]["deletionTimestamp"] = stamp(deleted + grace)
        pod["metadata"]["deletionGracePeriodSeconds"] = grace
    return pod


def charge(gpus: float = 1.0, tenant: str = "research", user: str | None = None,
           product: str | None = "h100") -> Charge:
    return Charge(tenant, "research", "pod/x", product, {"nvidia.com/gpu": gpus}, gpus,
                  user=user)


T0 = at("2026-12-07T10:00:00")


# --- a pod's span ------------------------------------------------------------------


def test_a_pod_holds_its_gpus_from_binding_to_its_last_container_or_its_deletion() -> None:
    assert bound_at(running("a", T0)) == T0  # PodScheduled, not startTime
    unscheduled = running("a", T0)
    del unscheduled["spec"]["nodeName"]
    assert bound_at(unscheduled) is None
    assert ended_at(running("a", T0)) is None
    assert ended_at(running("a", T0, end=T0 + 600)) == T0 + 600  # the last container
    # The grace period is not billed: the deletion was asked 30 s before the stamp.
    assert ended_at(running("a", T0, deleted=T0 + 100)) == T0 + 100


def test_account_splits_at_clock_hours_and_never_counts_past_an_end() -> None:
    book = HoldBook(wall=lambda: T0 + 9000)
    book.pod("a", running("a", T0 + 1800), charge(2.0))  # 10:30, 2 GPUs, running
    book.pod("b", running("b", T0, end=T0 + 600), charge(1.0))  # 10:00-10:10
    tally = book.account(T0, T0 + 2 * HOUR)
    key = ("research", "research", "", "h100")
    assert tally == {(key, int(T0)): 2.0 * 1800 + 600, (key, int(T0 + HOUR)): 2.0 * 3600}
    book.gone("a", running("a", T0 + 1800, deleted=T0 + 3600))
    assert sum(book.account(T0, T0 + 5 * HOUR).values()) == 2.0 * 1800 + 600
    book.forget(T0 + 3600)
    assert book.holds == {}


def test_a_pod_deleted_while_the_watch_was_away_counts_until_last_seen_alive() -> None:
    now = [T0 + 100.0]
    book = HoldBook(wall=lambda: now[0])
    book.pod("a", running("a", T0), charge())
    book.touch()  # alive at T0 + 100
    book.relisting()
    now[0] = T0 + 500
    book.relisted([])  # not listed again: deleted some time after T0 + 100
    assert sum(book.account(T0, T0 + 1000).values()) == 100.0


# --- the kept days -----------------------------------------------------------------


def test_a_day_round_trips_and_a_write_across_midnight_ends_the_day_first() -> None:
    book = HoldBook()
    book.pod("a", running("a", at("2026-12-07T23:30:00")), charge(4.0, user="alice"))
    since, until = at("2026-12-07T23:00:00"), at("2026-12-08T00:15:00")
    first, second = to_write({}, book.account(since, until), since, until)
    assert (first.until, second.until) == (at("2026-12-08T00:00:00"), until)
    assert watermark([first, second]) == until
    again = DayBook.decode("day-20261207", first.encode()["status"])
    assert again.rows == {("research", "research", "alice", "h100"): {23: 4.0 * 1800}}
    assert kept_sums([again, second], since, until).where(user="alice") == 4.0 * 2700


@pytest.mark.parametrize("status, why", [
    ({"version": "0", "accountedUntil": "1", "rows": []}, "version '0'"),
    ({"version": "1", "accountedUntil": "soon", "rows": []}, "malformed"),
    ({"version": "1", "accountedUntil": str(at("2026-12-09T00:00:00")), "rows": []},
     "outside its day"),
    ({"version": "1", "accountedUntil": str(T0), "rows": [{"tenant": "x"}]}, "malformed"),
])
def test_an_edited_day_is_refused_with_the_way_out(status: dict[str, Any], why: str) -> None:
    with pytest.raises(BookUnreadable) as caught:
        DayBook.decode("day-20261207", status)
    assert why in str(caught.value)
    assert "kubectl delete gpuusage day-20261207" in str(caught.value)


def test_accounting_that_crashes_between_writes_never_counts_a_second_twice() -> None:
    """The leader's rounds (``usagebook.account``, written as the cluster keeps them and
    read back) at random instants, a new leader each time (its watch lists the pods
    again), dying before a write or between the days of one: what is kept never exceeds
    the truth, and ends equal to it."""
    rng = random.Random(7)
    # Whole seconds: the API server's timestamps are.
    pods = [(f"p{i}", T0 + rng.randint(0, 20 * HOUR), rng.randint(60, 8 * HOUR),
             rng.choice([1.0, 2.0, 0.5])) for i in range(40)]
    truth = sum(g * d for _, _, d, g in pods)
    kept: dict[Any, DayBook] = {}
    t = T0
    while (watermark(kept.values()) or T0) < T0 + 40 * HOUR:
        t += rng.uniform(30, 900)  # not whole milliseconds: the watermark is stored so
        book = HoldBook()
        for uid, start, dur, gpus in pods:
            if start < t:
                end = start + dur
                book.pod(uid, running(uid, start, end=end if end <= t + 60 else None),
                         charge(gpus))
        done = account(kept, book, t, 15.0)
        for day in done.days if done is not None else ():
            if kept and rng.random() < 0.2:
                break  # died before this write: the rest is counted by the next
            again = DayBook.decode(name_of(day.day), day.encode()["status"])
            kept[day.day] = again
        counted = kept_sums(list(kept.values()), T0, T0 + 48 * HOUR).where()
        assert counted <= truth + 1e-3 * len(pods)  # the stored seconds' rounding
    assert kept_sums(list(kept.values()), T0, T0 + 48 * HOUR).where() == pytest.approx(
        truth, abs=1e-3 * len(pods))


def test_each_round_counts_exactly_up_to_the_watermark_it_stores() -> None:
    """The watermark is stored to the millisecond: a round accounts exactly up to what it
    stores, or every round would count a sliver twice (or never) at the rounding. A
    1,000-GPU charge makes a sliver of 0.5 ms half a GPU-second."""
    book = HoldBook()
    book.pod("big", running("big", T0), charge(1000.0))
    kept: dict[Any, DayBook] = {}
    start = account(kept, book, T0 + 0.4567, 15.0)
    # Counting starts at the install's second: a pod bound in it (its time kept to the
    # second) is counted from its binding.
    assert start is not None and start.until == T0
    kept[start.days[0].day] = start.days[0]
    t = T0
    for _ in range(40):
        t += 7.123456789
        done = account(kept, book, t + 15.0, 15.0)
        if done is None:
            continue
        for day in done.days:
            kept[day.day] = DayBook.decode(name_of(day.day), day.encode()["status"])
        mark = watermark(kept.values())
        assert mark == done.until
        counted = kept_sums(list(kept.values()), T0, T0 + 24 * HOUR).where()
        assert counted == pytest.approx(1000.0 * (mark - max(T0, start.until)), abs=1e-3)


# --- budgets -------------------------------------------------------------------------


POLICY = policy_yaml("budgets", """\
  gpuResources: {names: [nvidia.com/gpu]}
  products:
    aliases: {h100: NVIDIA-H100-80GB-HBM3, a100: NVIDIA-A100-SXM4-80GB}
  accounting:
    productWeights: {h100: 2.0}
  showback:
    currency: EUR
    rates: {h100: 2.5, default: 1.0}
  tenants:
    - name: research
      namespaces: [research]
      budget: {gpuHours: 10, period: month, timeZone: Europe/Berlin, perUserGpuHours: 4}
    - name: interns
      namespaces: [interns]
      budget: {gpuHours: 2, period: rolling, windowHours: 24, onExhausted: wait}
""")


def policy() -> CompiledPolicy:
    return compile_policy(load_text(POLICY))


def test_the_periods_start_at_midnight_where_the_budget_says() -> None:
    research = policy().by_name["research"].budget
    assert research is not None
    # 2026-12-01 00:30 in Berlin is still November in UTC.
    span = research.span(at("2026-11-30T23:30:00"))
    assert (span.start, span.end) == (at("2026-11-30T23:00:00"), at("2026-12-31T23:00:00"))
    assert span.label == "December 2026 (Europe/Berlin)"
    interns = policy().by_name["interns"].budget
    assert interns is not None
    rolling = interns.span(at("2026-12-07T10:20:00"))
    assert (rolling.start, rolling.end) == (at("2026-12-06T11:00:00"), at("2026-12-07T11:00:00"))


def test_a_spent_budget_says_what_was_used_of_what_and_when_it_comes_back() -> None:
    p = policy()
    book = HoldBook()
    # 3 h of 1 H100 (weight 2: 6 GPU-hours) by alice, 2.5 h of an A100 by bob.
    book.pod("a", running("a", T0, end=T0 + 3 * HOUR), charge(1.0, user="alice"))
    book.pod("b", running("b", T0, end=T0 + 2.5 * HOUR), charge(1.0, user="bob",
                                                                 product="a100"))
    now = T0 + 4 * HOUR
    spent = spending(p, [], book.account(T0, now), now)
    assert spent.tenants["research"].used == pytest.approx(8.5)
    alice = judge(p.by_name["research"], "alice", spent, now)
    assert alice.reason == (
        "user alice of tenant research has used 6 of its 4 GPU-hours for December 2026 "
        "(Europe/Berlin): no new GPU pod starts until GPU-hours come back, when the next "
        "period starts, 2027-01-01 00:00 Europe/Berlin. Pods running now are not stopped. "
        "Ask your platform team for a larger budget, or run it without GPUs")
    bob = judge(p.by_name["research"], "bob", spent, now)
    assert bob.reason is None
    assert bob.warnings == (
        "tenant research has used 85 % of its 10 GPU-hours for December 2026 "
        "(Europe/Berlin) (8.5 GPU-hours)",)


def pod(name: str, ns: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {
                "limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 1}}}]}}


def spent_by(p: CompiledPolicy, tenant: str, hours: float) -> Spending:
    book = HoldBook()
    book.pod("x", running("x", T0, ns=tenant, end=T0 + hours * HOUR),
             charge(1.0, tenant=tenant, product=None))
    return spending(p, [], book.account(T0, T0 + 30 * HOUR), T0 + 20 * HOUR)


def test_the_pipeline_refuses_a_gpu_pod_of_a_spent_tenant_and_gates_one_that_waits(
        ) -> None:
    p = policy()
    spent = spent_by(p, "research", 11)
    cluster = Cluster(store=MemoryStore(), spending=lambda: spent)
    # research caps each user's GPU-hours: the mutating webhook records who creates it.
    obj = pod("train", "research")
    m = mutating(review(copy.deepcopy(obj), "carol"), p, store=MemoryStore(), spent=spent)
    final = jsonpatch.apply_patch(obj, m.patch)
    d = asyncio.run(validating(review(final, "carol"), p, cluster))
    assert not d.allowed
    assert d.message.startswith("pod research/train: tenant research has used 11 of its "
                                "10 GPU-hours for December 2026 (Europe/Berlin)")
    assert d.message.endswith("[rule quota, tenant research]")
    # A tenant that waits: gated at the mutating webhook, not refused after it.
    waits = spent_by(p, "interns", 3)
    obj = pod("try", "interns")
    m = mutating(review(copy.deepcopy(obj), "dana"), p, store=MemoryStore(), spent=waits)
    assert m.allowed and "waiting" in m.mutations
    assert m.warnings[-1].startswith("this pod waits for GPU-hours: tenant interns has "
                                     "used 3 of its 2 GPU-hours for the last 24 hours")
    gated = jsonpatch.apply_patch(obj, m.patch)
    v = asyncio.run(validating(review(gated, "dana"), p,
                               Cluster(store=MemoryStore(), spending=lambda: waits)))
    assert v.allowed
    # Within budget: admitted, no gate.
    fresh = spent_by(p, "interns", 0.5)
    m = mutating(review(copy.deepcopy(obj), "dana"), p, store=MemoryStore(), spent=fresh)
    assert "waiting" not in m.mutations


@pytest.mark.parametrize("budget, words", [
    ("{gpuHours: 5, period: rolling}", "a rolling budget needs windowHours"),
    ("{gpuHours: 5, windowHours: 24}", "windowHours is for period: rolling"),
    ("{gpuHours: 5, timeZone: Mars/Olympus}", "is not an IANA time zone"),
    ("{gpuHours: 5, warnAt: [90, 80]}", "warnAt must list percentages in rising order"),
])
def test_a_budget_that_cannot_work_is_refused_at_load(budget: str, words: str) -> None:
    text = policy_yaml("b", f"""\
  tenants:
    - name: research
      namespaces: [research]
      budget: {budget}
""")
    with pytest.raises(PolicyError) as caught:
        load_text(text)
    assert words in str(caught.value)


def test_a_weight_or_rate_for_an_unknown_product_is_refused_at_load() -> None:
    with pytest.raises(PolicyError) as caught:
        load_text(POLICY.replace("productWeights: {h100: 2.0}", "productWeights: {v100: 2.0}"))
    assert "product 'v100' is not defined" in str(caught.value)
