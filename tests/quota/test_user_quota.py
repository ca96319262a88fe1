"""Per-user caps within a tenant (``tenants[].userQuota``): who a pod is charged to, the
mutating webhook's record of it, and the caps checked and committed with the tenant's.

Each test runs the admission pipeline as the server does (mutate, the patch applied,
validate with quota against a store); the ledger's atomic commit across replicas is
tested against the fake API here and against a real API server in
tests/e2e/test_e2e_sim_users.py.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import jsonpatch
import orjson
import pytest
from fakeapi import FakeAPI
from kit import policy_yaml, validating
from quotakit import ledger_replica

from webhook.admission.webhooks import mutating
from webhook.engine.charge import charge_of_pod
from webhook.engine.decision import Decision
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import PolicyError, load_text
from webhook.policy.model import USER_ANNOTATION
from webhook.quota.entries import LEDGER_PREFIX, Entry, decode, encode
from webhook.quota.status import gpuquota_status, of
from webhook.quota.store import MemoryStore, UsageStore

POLICY = policy_yaml("users", """\
  gpuResources: {names: [nvidia.com/gpu]}
  tenants:
    - name: research
      namespaces: [research]
      quota: {gpus: 10}
      userQuota:
        gpus: 4
        controllers: [kubeflow/training-operator]
""")
RS_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
OPERATOR = "system:serviceaccount:kubeflow:training-operator"


def policy(text: str = POLICY) -> CompiledPolicy:
    return compile_policy(load_text(text))


def pod(name: str, gpus: int = 1, *, user: str | None = None,
        owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "research", "uid": f"uid-{name}"}
    if user is not None:
        meta["annotations"] = {USER_ANNOTATION: user}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                    "name": owner, "uid": "rs", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [
        {"name": "main", "image": "x", "resources": {
            "limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}}]}}


def deployment(name: str, replicas: int, *, user: str | None = None) -> dict[str, Any]:
    template = pod("template", user=user)
    del template["metadata"]["uid"], template["metadata"]["name"]
    template["metadata"]["labels"] = {"app": name}
    meta: dict[str, Any] = {"name": name, "namespace": "research"}
    if user is not None:
        meta["annotations"] = {USER_ANNOTATION: user}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": template["metadata"],
                                  "spec": template["spec"]}}}


def review(obj: dict[str, Any], username: str, *, operation: str = "CREATE",
           old: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
    r = request_review(obj, username=username, operation=operation)
    r["request"]["oldObject"] = old
    return parse_review(orjson.dumps(r))


def through(obj: dict[str, Any], username: str, store: UsageStore, p: CompiledPolicy,
            **kw: Any) -> tuple[Decision, dict[str, Any]]:
    """Both webhooks, the mutating patch applied as the API server applies it."""
    m = mutating(review(copy.deepcopy(obj), username, **kw), p)
    assert m.allowed, m.message
    final = jsonpatch.apply_patch(obj, m.patch) if m.patch else copy.deepcopy(obj)
    return validating(review(final, username, **kw), p, store=store), final


def test_each_user_is_held_to_their_own_cap_and_told_the_numbers() -> None:
    p, store = policy(), MemoryStore()
    alice = [through(pod(f"a{i}"), "alice", store, p)[0] for i in range(5)]
    assert [d.allowed for d in alice] == [True] * 4 + [False]
    assert alice[4].message == (
        "pod research/a4: exceeded quota: user alice holds 4 of their 4 GPUs in tenant "
        "research (pod/a0 1, pod/a1 1, pod/a2 1), and this pod asks 1 more. None is free "
        "for them now. Wait for their running pods to finish, free some up, or ask the "
        "platform team for more quota. [rule quota, tenant research]")
    # bob's own 4 are his, in the same tenant.
    assert all(through(pod(f"b{i}"), "bob", store, p)[0].allowed for i in range(4))
    # The tenant's 10 still bind: carol has room of her own, the team has not.
    assert through(pod("c0", 2), "carol", store, p)[0].allowed
    d = through(pod("c1", 1), "carol", store, p)[0]
    assert not d.allowed
    assert "tenant research would use 11 of its 10 GPUs" in d.message


def test_a_bare_pod_is_charged_to_its_creator_whatever_it_says() -> None:
    p, store = policy(), MemoryStore()
    for i in range(4):
        assert through(pod(f"a{i}"), "alice", store, p)[0].allowed
    d, final = through(pod("forged", user="bob"), "alice", store, p)
    assert not d.allowed
    assert "user alice holds 4 of their 4 GPUs" in d.message
    # The mutating webhook wrote her name over bob's: the cache charges it as admission.
    assert final["metadata"]["annotations"][USER_ANNOTATION] == "alice"


def test_a_controllers_pod_is_charged_to_the_user_its_template_records() -> None:
    p, store = policy(), MemoryStore()
    for i in range(4):
        d, final = through(pod(f"w{i}", user="alice", owner="web-1"), RS_CONTROLLER, store, p)
        assert d.allowed
        assert final["metadata"]["annotations"][USER_ANNOTATION] == "alice"  # untouched
    d, _ = through(pod("w4", user="alice", owner="web-1"), RS_CONTROLLER, store, p)
    assert not d.allowed and "user alice holds 4 of their 4 GPUs" in d.message
    # A service account the policy names is believed too; others are users.
    assert not through(pod("op", user="alice"), OPERATOR, store, p)[0].allowed
    d, final = through(pod("sa", user="alice"),
                       "system:serviceaccount:research:default", store, p)
    assert d.allowed
    assert final["metadata"]["annotations"][USER_ANNOTATION] == \
        "system:serviceaccount:research:default"


def test_a_controllers_pod_that_records_no_one_counts_for_the_tenant_only() -> None:
    p, store = policy(), MemoryStore()
    for i in range(6):
        assert through(pod(f"old{i}", owner="old-1"), RS_CONTROLLER, store, p)[0].allowed
    assert store.view().tenant("research").gpus == 6


def test_a_workload_create_records_its_creator_on_itself_and_its_template() -> None:
    p, store = policy(), MemoryStore()
    d, final = through(deployment("web", 2, user="bob"), "alice", store, p)
    assert d.allowed, d.message
    assert final["metadata"]["annotations"][USER_ANNOTATION] == "alice"
    assert final["spec"]["template"]["metadata"]["annotations"][USER_ANNOTATION] == "alice"
    # Mutating its own output changes nothing (idempotent).
    again = mutating(review(copy.deepcopy(final), "alice"), p)
    assert not again.patch


def test_an_update_keeps_the_user_the_create_recorded() -> None:
    p, store = policy(), MemoryStore()
    _, created = through(deployment("web", 2), "alice", store, p)
    edited = copy.deepcopy(created)
    edited["spec"]["template"]["metadata"]["annotations"][USER_ANNOTATION] = "bob"
    edited["spec"]["replicas"] = 3
    d, final = through(edited, "bob", store, p, operation="UPDATE", old=created)
    assert d.allowed, d.message
    assert final["spec"]["template"]["metadata"]["annotations"][USER_ANNOTATION] == "alice"


def test_a_workload_larger_than_a_users_cap_is_refused_at_apply() -> None:
    p, store = policy(), MemoryStore()
    d, _ = through(deployment("sweep", 5), "alice", store, p)
    assert not d.allowed
    assert "user alice" in d.message and "4 GPUs" in d.message
    assert through(deployment("sweep", 4), "alice", store, p)[0].allowed


def pytorchjob(name: str, workers: int) -> dict[str, Any]:
    """A PyTorchJob of a master and ``workers`` workers of 1 GPU each."""
    def role(replicas: int) -> dict[str, Any]:
        return {"replicas": replicas, "template": {"spec": {"containers": [{
            "name": "pytorch", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": "research"},
            "spec": {"pytorchReplicaSpecs": {"Master": role(1), "Worker": role(workers)}}}


def test_a_training_job_larger_than_a_users_cap_is_refused_at_apply_as_a_job_is() -> None:
    # 5 GPUs for a user capped at 4: refused at kubectl apply, as a Deployment of 5 is,
    # rather than left to its operator's pods to find out one by one.
    p, store = policy(), MemoryStore()
    d, _ = through(pytorchjob("sweep", 4), "alice", store, p)
    assert not d.allowed
    assert "user alice's quota is 4 GPUs" in d.message, d.message
    assert through(pytorchjob("sweep", 3), "alice", store, p)[0].allowed


def test_a_user_cap_without_training_operators_is_warned_of() -> None:
    from webhook.policy.advice import advice

    assert advice(load_text(POLICY)) == []  # the operator is listed
    bare = load_text(POLICY.replace("        controllers: [kubeflow/training-operator]\n", ""))
    (said,) = advice(bare)
    assert said.startswith("tenant research: userQuota caps each user, but "
                           "userQuota.controllers names no training operator")


def test_the_cache_charges_a_seen_pod_to_its_recorded_user() -> None:
    p = policy()
    charge = charge_of_pod(pod("seen", 2, user="alice"), p)
    assert charge is not None and charge.user == "alice"
    store = MemoryStore()
    store.pod_seen("uid-seen", charge)
    for i in range(2):
        assert through(pod(f"a{i}"), "alice", store, p)[0].allowed
    assert not through(pod("a2"), "alice", store, p)[0].allowed
    # A tenant without userQuota charges no user, whatever the pod carries.
    plain = policy(POLICY.replace("      userQuota:\n        gpus: 4\n        controllers: "
                                  "[kubeflow/training-operator]\n", ""))
    other = charge_of_pod(pod("seen", 2, user="alice"), plain)
    assert other is not None and other.user is None


def test_status_shows_each_users_use() -> None:
    p, store = policy(), MemoryStore()
    for i in range(3):
        assert through(pod(f"a{i}"), "alice", store, p)[0].allowed
    seen = MemoryStore()
    charge = charge_of_pod(pod("b0", 2, user="bob"), p)
    seen.pod_seen("uid-b0", charge)
    report = of(p.tenants, seen.pods, store.reserved, policy=p)
    rows = {(r.scope, r.cap): (r.used, r.reserved, r.limit) for r in report.rows}
    assert rows[("user alice", "gpus")] == (0, 3, 4)
    assert rows[("user bob", "gpus")] == (2, 0, 4)
    st = gpuquota_status(report, "research", p.name)
    assert {"scope": "user bob", "cap": "gpus", "used": 2, "reserved": 0, "limit": 4,
            "free": 2} in st["caps"]
    # kubectl get gpuquotas prints the tenant's numbers, not its fullest user's.
    assert (st["scope"], st["used"], st["reserved"], st["limit"], st["free"]) == (
        "tenant", 2, 3, 10, 5)


def test_a_ledger_entry_keeps_its_user_and_a_bad_one_is_dropped() -> None:
    p = policy()
    charge = charge_of_pod(pod("x", user="alice"), p)
    assert charge is not None
    data = encode({"k": Entry(charge, 100.0, "research/x")})
    assert decode("research", data, now=50.0)["k"].charge.user == "alice"
    raw = orjson.loads(data["reservations"])
    raw["k"]["user"] = 7
    assert decode("research", {"reservations": orjson.dumps(raw).decode()}, now=50.0) == {}


def test_no_user_name_in_the_policy_is_needed_and_bad_fields_are_refused() -> None:
    with pytest.raises(PolicyError, match=r"userQuota.*controllers"):
        policy(POLICY.replace("[kubeflow/training-operator]", "[not-an-account]"))
    with pytest.raises(PolicyError, match=r"userQuota.*gpus"):
        policy(POLICY.replace("gpus: 4", "gpus: -1"))


# --- the shared ledger: one commit for the user's count and the tenant's ---------------

NS = "gpu-webhook"
LEDGER = LEDGER_PREFIX + "research"
NOW = 1_800_000_000.0


def _other(user: str, gpus: int, key: str) -> dict[str, Any]:
    return {key: {"ns": "research", "owner": f"pod/{key}", "product": None,
                  "resources": {"nvidia.com/gpu": gpus}, "gpus": gpus,
                  "expires": NOW + 30, "name": f"research/{key}", "user": user}}


def test_another_replicas_commit_for_the_same_user_is_re_decided(api: FakeAPI) -> None:
    # Between this replica's read and its write, another replica commits 3 of alice's
    # GPUs: the write conflicts, and the re-read leaves her 1, not 4.
    p = policy()
    store = ledger_replica(api, p)
    api.put_configmap(NS, LEDGER, encode({}))
    api.before_write = lambda: api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps(
        _other("alice", 3, "elsewhere")).decode()})
    d, _ = through(pod("mine", 2), "alice", store, p)
    assert not d.allowed
    assert "user alice holds 3 of their 4 GPUs" in d.message
    api.before_write = None
    assert through(pod("small"), "alice", store, p)[0].allowed
    entries = orjson.loads(api.data(NS, LEDGER)["reservations"])
    assert entries["uid-small"]["user"] == "alice"
    # bob has his own 4 in the same ledger.
    assert through(pod("bobs", 4), "bob", store, p)[0].allowed


def test_an_unreachable_ledger_denies_a_users_pod(api: FakeAPI) -> None:
    p = policy()
    store = ledger_replica(api, p, timeout=0.5)
    api.faults.extend(["503"] * 50)
    d, _ = through(pod("mine"), "alice", store, p)
    assert not d.allowed
    assert "the GPU quota ledger cannot be reached (the API server failed (HTTP 503))" \
        in d.message


def test_a_negative_entry_for_a_user_lifts_no_cap(api: FakeAPI) -> None:
    p = policy()
    full = _other("alice", 4, "full")
    bad = _other("alice", 4, "bad")
    bad["bad"]["gpus"] = -4
    bad["bad"]["resources"] = {"nvidia.com/gpu": -4}
    api.put_configmap(NS, LEDGER, {"reservations": orjson.dumps({**full, **bad}).decode()})
    store = ledger_replica(api, p)
    d, _ = through(pod("mine"), "alice", store, p)
    assert not d.allowed and "user alice holds 4 of their 4 GPUs" in d.message


def test_a_retried_create_is_one_charge_to_its_user(api: FakeAPI) -> None:
    p = policy()
    store = ledger_replica(api, p)
    first = pod("x", 2)
    retry = pod("x", 2)
    retry["metadata"]["uid"] = "uid-x-retry"
    assert through(first, "alice", store, p)[0].allowed
    assert through(retry, "alice", store, p)[0].allowed  # the same create again
    assert through(pod("y", 2), "alice", store, p)[0].allowed  # 2 + 2 = 4, not 6
    assert not through(pod("z"), "alice", store, p)[0].allowed


def test_the_same_name_for_another_user_is_not_the_same_charge(api: FakeAPI) -> None:
    # A pending reservation of alice's does not cover bob's create of that name: were it
    # taken for a retry, bob's pod would count for no one's cap.
    p = policy()
    store = ledger_replica(api, p)
    assert through(pod("x", 4), "alice", store, p)[0].allowed
    other = pod("x", 4)
    other["metadata"]["uid"] = "uid-x-bob"
    assert through(other, "bob", store, p)[0].allowed
    entries = orjson.loads(api.data(NS, LEDGER)["reservations"])
    assert sorted(e["user"] for e in entries.values()) == ["alice", "bob"]


def test_audit_charges_running_pods_to_their_recorded_users() -> None:
    # After userQuota is set (or lowered), audit lists each user's newest pods beyond
    # their cap; a controller's pod that records no one is charged to no user.
    from webhook.admission.audit import audit

    p = policy()
    running = [pod(f"a{i}", user="alice", owner="web-1") for i in range(5)]
    running += [pod(f"old{i}", owner="old-1") for i in range(3)]
    running += [pod("bobs", 2, user="bob")]
    for i, obj in enumerate(running):
        obj["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{i:02d}Z"
    found = {f.subject: f for f in audit(p, running, [], lambda ns: None)
             if f.verdict == "refused"}
    assert sorted(found) == ["pod research/a4"]
    assert "user alice holds 4 of their 4 GPUs" in found["pod research/a4"].detail


def test_a_pod_that_skipped_the_mutating_webhook_and_names_another_user_is_refused() -> None:
    # failurePolicy Ignore while the mutating webhook was down: the pod reaches the
    # validating webhook saying it is bob's. Admitted, the cache would charge it to bob.
    p, store = policy(), MemoryStore()
    d = validating(review(pod("forged", user="bob"), "alice"), p, store=store)
    assert not d.allowed
    assert "says it is bob's (annotation gpu-webhook.dev/requested-by), but alice " \
           "creates it" in d.message
    assert store.view().tenant("research").gpus == 0


def test_kubectl_scale_is_checked_against_the_user_the_workload_records() -> None:
    from test_scale import scale_review

    from webhook.admission.webhooks import Cluster, scaling

    p, store = policy(), MemoryStore()
    _, created = through(deployment("web", 2), "alice", store, p)

    async def read(resource: str, namespace: str, name: str, timeout: float
                   ) -> dict[str, Any]:
        return created

    def scale(new: int, who: str) -> Decision:
        req = scale_review(2, new, name="web", namespace="research", user=who)
        return asyncio.run(scaling(req, p, Cluster(store=store, read_workload=read)))

    # Scaled by bob, the pods are still alice's: 5 of them can never fit her 4.
    d = scale(5, "bob")
    assert not d.allowed and "user alice" in d.message
    assert scale(4, "bob").allowed
