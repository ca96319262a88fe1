"""Borrowing idle quota in a cohort, through the admission pipeline.

The mutating webhook marks a pod that fits only on its cohort's idle GPUs (label,
PriorityClass name, priority and preemption policy, as the API server's Priority plugin
checks them); the validating webhook commits it against the cohort's room, in memory and
in the shared ledger (the real ``LedgerStore``, ``kube.ConfigMaps`` and Kubernetes
client against the HTTP fake of the API, ``fakeapi``): two replicas never lend the same
idle GPUs, and the lender's own quota is never refused while others borrow.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
from fakeapi import FakeAPI
from kit import policy_yaml, validating
from quotakit import NOW, ledger_replica

from webhook.admission.webhooks import mutating
from webhook.engine.borrowed import BORROWED_LABEL, account
from webhook.engine.cost import Charge
from webhook.engine.decision import Decision
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text
from webhook.quota.entries import (
    BORROWED_PREFIX,
    LEDGER_PREFIX,
    Entry,
    decode_borrowed,
    encode_borrowed,
)
from webhook.quota.ledger import LedgerStore
from webhook.quota.store import MemoryStore, UsageStore

POLICY = policy_yaml("cohort-test", """\
  tenants:
    - name: team-a
      namespaces: [team-a]
      quota: {gpus: 4}
      cohort: {name: lab, borrowingLimit: 6}
    - name: team-b
      namespaces: [team-b]
      quota:
        gpus: 8
        namespaces:
          team-b: {gpus: 8}
      cohort: {name: lab, lendingLimit: 6}
    - name: solo
      namespaces: [solo]
      quota: {gpus: 2}
""")
NS = "gpu-webhook"


def policy() -> CompiledPolicy:
    return compile_policy(load_text(POLICY))


def pod(name: str, namespace: str, gpus: int, labels: dict[str, str] | None = None
        ) -> dict[str, Any]:
    """A developer's pod, before the webhook: a limit only."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [
        {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}


def create(store: UsageStore, p: CompiledPolicy, obj: dict[str, Any], *,
           dry_run: bool = False) -> tuple[Decision, Decision | None, dict[str, Any]]:
    """Mutating, the patch applied as the API server applies it (after its Priority
    plugin gave the pod priority 0), then validating with the store: as the server."""
    stored = copy.deepcopy(obj)
    stored["spec"].setdefault("priority", 0)  # the Priority plugin ran before the webhooks
    stored["spec"].setdefault("preemptionPolicy", "PreemptLowerPriority")
    review = request_review(stored, dry_run=dry_run)
    m = mutating(parse_review(orjson.dumps(review)), p, store=store)
    if not m.allowed:
        return m, None, stored
    final = jsonpatch.apply_patch(stored, m.patch) if m.patch else stored
    final["metadata"]["uid"] = "uid-" + final["metadata"]["name"]
    review = request_review(final, dry_run=dry_run)
    v = validating(parse_review(orjson.dumps(review)), p, store=store)
    return m, v, final


def labels(obj: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = obj["metadata"].get("labels") or {}
    return out


# --------------------------------------------------------------------------- in memory

def test_a_full_tenant_borrows_idle_gpus_marked_and_warned() -> None:
    p, store = policy(), MemoryStore()
    m, v, final = create(store, p, pod("own", "team-a", 4))
    assert v is not None and v.allowed and not m.warnings  # its own 4: not borrowed
    assert BORROWED_LABEL not in labels(final)

    m, v, final = create(store, p, pod("extra", "team-a", 2))
    assert v is not None and v.allowed
    assert labels(final)[BORROWED_LABEL] == "true"
    assert (final["spec"]["priorityClassName"], final["spec"]["priority"],
            final["spec"]["preemptionPolicy"]) == ("gpu-webhook-borrowed", -100, "Never")
    assert "borrowed" in m.mutations
    assert any("borrowed from cohort lab" in w and "may be preempted" in w
               for w in m.warnings)
    # Charged to team-a's borrowed account, not its own.
    view = store.view()
    assert (view.tenant("team-a").gpus, view.tenant(account("team-a")).gpus) == (4, 2)


def test_mutation_is_idempotent_on_a_marked_pod() -> None:
    p, store = policy(), MemoryStore()
    create(store, p, pod("own", "team-a", 4))
    _, _, final = create(store, p, pod("extra", "team-a", 2))
    again = mutating(parse_review(orjson.dumps(request_review(final))), p, store=store)
    assert again.patch == []


def test_borrowing_stops_at_the_borrowing_limit_and_then_refuses_on_own_quota() -> None:
    p, store = policy(), MemoryStore()
    create(store, p, pod("own", "team-a", 4))
    _, v, _ = create(store, p, pod("b1", "team-a", 6))  # team-b lends at most 6
    assert v is not None and v.allowed
    _, v, final = create(store, p, pod("b2", "team-a", 1))
    assert v is not None and not v.allowed
    assert BORROWED_LABEL not in labels(final)
    assert "exceeded quota: tenant team-a would use 5 of its 4 GPUs" in v.message


def test_the_lenders_own_quota_is_never_refused_while_others_borrow() -> None:
    p, store = policy(), MemoryStore()
    create(store, p, pod("own", "team-a", 4))
    _, v, _ = create(store, p, pod("borrowing", "team-a", 6))
    assert v is not None and v.allowed
    # team-b lent 6 of its 8; all 8 of its own are still its own.
    for i in range(4):
        m, v, final = create(store, p, pod(f"mine-{i}", "team-b", 2))
        assert v is not None and v.allowed, v.message
        assert BORROWED_LABEL not in labels(final) and not m.warnings
    # Now nothing is lendable: team-a may not borrow more (overdrawn by 6 until preempted).
    _, v, _ = create(store, p, pod("more", "team-a", 1))
    assert v is not None and not v.allowed


def test_a_hand_labelled_pod_gets_the_class_and_is_checked_against_the_cohort() -> None:
    p, store = policy(), MemoryStore()
    _, v, final = create(store, p, pod("eager", "team-a", 2, {BORROWED_LABEL: "true"}))
    assert v is not None and v.allowed  # borrowed, though its own quota had room
    assert final["spec"]["priority"] == -100
    _, v, _ = create(store, p, pod("greedy", "team-a", 5, {BORROWED_LABEL: "true"}))
    assert v is not None and not v.allowed
    assert "borrowing limit of 6 GPUs has 4 left" in v.message


def test_a_marked_pod_whose_priority_another_webhook_changed_is_refused() -> None:
    p, store = policy(), MemoryStore()
    obj = pod("changed", "team-a", 1, {BORROWED_LABEL: "true"})
    obj["metadata"]["uid"] = "uid-changed"
    obj["spec"].update(priorityClassName="gpu-webhook-borrowed", priority=1000,
                       preemptionPolicy="Never")
    obj["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": 1}
    v = validating(parse_review(orjson.dumps(request_review(obj))), p, store=store)
    assert not v.allowed
    assert "must run at PriorityClass gpu-webhook-borrowed" in v.message
    assert "spec.priority is 1000, not -100" in v.message


def test_a_tenant_without_cohort_ignores_the_label() -> None:
    p, store = policy(), MemoryStore()
    m, v, final = create(store, p, pod("x", "solo", 2, {BORROWED_LABEL: "true"}))
    assert v is not None and v.allowed and not m.warnings
    assert final["spec"]["priority"] == 0  # as the Priority plugin left it
    assert store.view().tenant("solo").gpus == 2  # charged to its own quota


def test_a_dry_run_is_marked_and_checked_but_reserves_nothing() -> None:
    p, store = policy(), MemoryStore()
    create(store, p, pod("own", "team-a", 4))
    _, v, final = create(store, p, pod("try", "team-a", 2), dry_run=True)
    assert v is not None and v.allowed and labels(final)[BORROWED_LABEL] == "true"
    assert store.view().tenant(account("team-a")).gpus == 0


def test_namespace_caps_bind_borrowed_pods() -> None:
    p, store = policy(), MemoryStore()
    # team-b uses its own 8 (namespace cap 8): a borrowed pod there would pass its
    # tenant's cap by borrowing, but not its namespace's.
    for i in range(4):
        create(store, p, pod(f"b{i}", "team-b", 2))
    _, v, _ = create(store, p, pod("over", "team-b", 1, {BORROWED_LABEL: "true"}))
    assert v is not None and not v.allowed
    assert "namespace team-b" in v.message


def test_a_refusal_on_own_quota_says_what_the_cohort_can_lend() -> None:
    p, store = policy(), MemoryStore()
    create(store, p, pod("own", "team-a", 4))
    create(store, p, pod("theirs", "team-b", 8))  # team-b lends nothing now
    stored = pod("late", "team-a", 2)
    m = mutating(parse_review(orjson.dumps(request_review(stored))), p, store=store)
    assert "borrowed" not in m.mutations  # no room when it was mutated
    # team-b's pod ends between the two webhooks: the commit refuses the unmarked pod on
    # team-a's own quota, and says that a retry would borrow.
    store.pod_seen("uid-theirs", None)
    final = jsonpatch.apply_patch(stored, m.patch)
    final["metadata"]["uid"] = "uid-late"
    v = validating(parse_review(orjson.dumps(request_review(final))), p, store=store)
    assert not v.allowed
    assert "cohort lab has 6 GPUs idle to lend now: create the pod again" in v.message
    _, v, _ = create(store, p, pod("late", "team-a", 2))
    assert v is not None and v.allowed


# --------------------------------------------------------------------------- the ledger

def replica(api: FakeAPI, p: CompiledPolicy) -> LedgerStore:
    return ledger_replica(api, p)


def borrowed_entries(api: FakeAPI) -> dict[str, Any]:
    return {k: e.charge.tenant for k, e in decode_borrowed(
        api.data(NS, BORROWED_PREFIX + "lab"), NOW).items()}


def test_the_cohort_ledger_holds_borrowed_reservations_apart(api: FakeAPI) -> None:
    p = policy()
    one = replica(api, p)
    _, v, _ = create(one, p, pod("own", "team-a", 4))
    assert v is not None and v.allowed
    _, v, final = create(one, p, pod("extra", "team-a", 3))
    assert v is not None and v.allowed and labels(final)[BORROWED_LABEL] == "true"
    assert borrowed_entries(api) == {"uid-extra": account("team-a")}
    own = orjson.loads(api.data(NS, LEDGER_PREFIX + "team-a")["reservations"])
    assert sorted(own) == ["uid-own"]  # the tenant's own ledger: its own pods only


def test_two_replicas_never_lend_the_same_idle_gpus(api: FakeAPI) -> None:
    # team-b lends 6. Replica one borrows 4 of them for team-a; replica two, which has
    # not seen that commit, is asked for 4 more: it reads the cohort's ledger afresh and
    # refuses (2 left), rather than lending the same idle GPUs twice.
    p = policy()
    one, two = replica(api, p), replica(api, p)
    create(one, p, pod("own", "team-a", 4))
    _, v, _ = create(one, p, pod("first", "team-a", 4, {BORROWED_LABEL: "true"}))
    assert v is not None and v.allowed
    _, v, _ = create(two, p, pod("second", "team-a", 4, {BORROWED_LABEL: "true"}))
    assert v is not None and not v.allowed
    assert "borrowing limit of 6 GPUs has 2 left" in v.message
    assert sorted(borrowed_entries(api)) == ["uid-first"]


def test_a_commit_racing_on_the_cohort_ledger_re_decides(api: FakeAPI) -> None:
    # Between replica two's read of the cohort ledger and its write, replica one
    # commits a borrowed pod: the write is refused (409), the retry sees it, and the two
    # together stay within what team-b lends.
    p = policy()
    one, two = replica(api, p), replica(api, p)
    create(one, p, pod("own", "team-a", 4))
    ledger = BORROWED_PREFIX + "lab"
    raced: list[bool] = []

    def other_replica_commits() -> None:
        # The fake runs this on its server thread, while ``two`` waits for its write.
        entries = {"uid-racer": Entry(Charge(account("team-a"), "team-a", "pod/racer",
                                             None, {"nvidia.com/gpu": 4.0}, 4.0),
                                      NOW + 30, "team-a/racer")}
        api.put_configmap(NS, ledger, encode_borrowed(entries))
        raced.append(True)

    # The next write the fake sees is ``two``'s borrowed commit ("own" is written).
    api.before_write = other_replica_commits
    _, v, _ = create(two, p, pod("mine", "team-a", 4, {BORROWED_LABEL: "true"}))
    assert raced and two.conflicts == 1
    assert v is not None and not v.allowed  # 4 + 4 > the 6 team-b lends
    assert sorted(borrowed_entries(api)) == ["uid-racer"]


def test_the_lenders_commit_never_reads_the_cohort_ledger(api: FakeAPI) -> None:
    p = policy()
    one = replica(api, p)
    create(one, p, pod("own", "team-a", 4))
    create(one, p, pod("borrowing", "team-a", 6))
    api.requests.clear()
    _, v, _ = create(one, p, pod("mine", "team-b", 8))
    assert v is not None and v.allowed  # all 8 of its own, 6 of them lent out
    assert not [r for r in api.requests if BORROWED_PREFIX in r[1]]


# --------------------------------------------------------------------------- the docs

def test_the_warning_docs_quota_md_shows_is_the_webhooks() -> None:
    root = Path(__file__).resolve().parents[2]
    shown = next(line.removeprefix("Warning: ") for line in
                 (root / "docs" / "quota.md").read_text().splitlines()
                 if line.startswith("Warning: this pod runs on"))
    p = compile_policy(load_text((root / "policies" / "examples" / "cohorts.yaml").read_text()))
    store = MemoryStore()
    create(store, p, pod("train-0", "vision", 8))
    m, v, _ = create(store, p, pod("sweep-1", "vision", 4))
    assert v is not None and v.allowed
    assert m.warnings == [shown]
