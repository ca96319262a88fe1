"""Reused mutating decisions and validating checks (``webhook.server.web.reuse``) are the
decisions made afresh.

Hypothesis draws Pods, Deployments, Jobs and CronJobs the way developers write them
(``fuzzkit``), in namespaces inside and outside the tenants of the example policy. The
served app with reuse answers a review, then the same shape again as the API server
sends the next pod of a ReplicaSet (another request uid, another object uid); each
answer must be byte for byte the one an app without reuse gives that review. A change
of the namespace's labels or of the policy must never be answered from the cache, and
each review is still logged and counted as itself.
"""

from __future__ import annotations

import asyncio
import copy
import io
import logging
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from fuzzkit import NAMESPACES, POLICY_FILE, pod_templates, reviews
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from webhook.admission.webhooks import mutating
from webhook.engine.decision import Decision
from webhook.engine.routes.sights import Sights
from webhook.k8s.review import parse_review, request_review
from webhook.libs import logs
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_file
from webhook.quota.store import MemoryStore
from webhook.server import metrics
from webhook.server.sources.reload import PolicySource
from webhook.server.web.app import AdmissionApp, Runtime
from webhook.server.web.reuse import DecisionCache

TENANT_LABEL = "gpu.example.com/tenant"
LABELS: dict[str, dict[str, str]] = {"inference": {TENANT_LABEL: "inference"}}
POLICY = compile_policy(load_file(POLICY_FILE))
EXAMPLES = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def app(labels: dict[str, dict[str, str]], *, reuse: bool, policy: Path = POLICY_FILE
        ) -> AdmissionApp:
    source = PolicySource(str(policy))
    source.load()
    return AdmissionApp(Runtime(policy=source, namespace_labels=labels.get,
                                reuse_size=1024 if reuse else 0))


def answer(a: AdmissionApp, review: dict[str, Any]) -> bytes:
    reply = asyncio.run(a.decide("mutate", parse_review(orjson.dumps(review)), 1.0))
    return orjson.dumps(reply, option=orjson.OPT_SORT_KEYS)


def next_pod(review: dict[str, Any], request_uid: str, object_uid: str) -> dict[str, Any]:
    """The review of the next pod of the same shape: the uids differ, and the time the
    API server stamps on its field manager's entry (a controller's next pod, a second
    later), nothing else."""
    out = copy.deepcopy(review)
    out["request"]["uid"] = request_uid
    meta = out["request"]["object"].setdefault("metadata", {})
    if isinstance(meta, dict):
        meta["uid"] = object_uid
        meta["managedFields"] = [{
            "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
            "time": f"2026-12-01T10:00:{sum(map(ord, object_uid)) % 60:02d}Z",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:containers": {}}}}]
    return out


@EXAMPLES
@given(review=reviews(), uids=st.lists(st.uuids(), min_size=4, max_size=4, unique=True))
def test_a_reused_decision_is_the_decision_made_afresh(review: dict[str, Any],
                                                      uids: list[uuid.UUID]) -> None:
    cached, fresh = app(LABELS, reuse=True), app(LABELS, reuse=False)
    first = next_pod(review, uids[0].hex, uids[1].hex)
    second = next_pod(review, uids[2].hex, uids[3].hex)
    assert answer(cached, first) == answer(fresh, first)
    assert answer(cached, second) == answer(fresh, second)
    assert cached.reuse is not None
    if review["request"]["kind"]["kind"] == "Pod":
        assert cached.reuse.decisions.hits == 1  # the second pod was answered from the cache


GPU_POD_IN_DEFAULT = request_review(
    {"apiVersion": "v1", "kind": "Pod",
     "metadata": {"generateName": "serve-", "namespace": "default"},
     "spec": {"containers": [{"name": "s", "image": "x",
                              "resources": {"limits": {"nvidia.com/gpu": 1}}}]}},
    uid="u-0")


@EXAMPLES
@given(review=reviews(), namespace_labels=st.sampled_from([
    {}, {TENANT_LABEL: "inference"}, {TENANT_LABEL: "notebooks"}, {"team": "x"}]))
# A GPU pod of the inference tenant (by its namespace's label) whose namespace loses
# the label: unassigned now, so refused; from the cache it would get inference's L4.
@example(review=GPU_POD_IN_DEFAULT, namespace_labels={})
def test_new_namespace_labels_are_never_answered_from_the_cache(
        review: dict[str, Any], namespace_labels: dict[str, str]) -> None:
    ns = review["request"]["namespace"]
    labels = {n: {TENANT_LABEL: "inference"} for n in NAMESPACES}
    cached = app(labels, reuse=True)
    # Both pods come as a controller's do (next_pod): with the labels unchanged, the
    # second is answered from the cache, so only the labels can keep it from it.
    answer(cached, next_pod(review, uuid.uuid4().hex, uuid.uuid4().hex))
    relabelled = namespace_labels != labels[ns]
    labels[ns] = namespace_labels  # relabelled: the tenant may change
    after = next_pod(review, uuid.uuid4().hex, uuid.uuid4().hex)
    assert answer(cached, after) == answer(app(labels, reuse=False), after)
    assert cached.reuse is not None
    if review["request"]["kind"]["kind"] == "Pod":
        assert cached.reuse.decisions.hits == (0 if relabelled else 1)


def test_a_new_policy_is_never_answered_from_the_cache(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    text = POLICY_FILE.read_text()
    policy.write_text(text)
    cached = app(LABELS, reuse=True, policy=policy)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": "trainer-", "namespace": "research"},
           "spec": {"containers": [{"name": "t", "image": "x",
                                    "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}
    review = request_review(pod, uid="u-1")
    # Every pod comes as a controller's do (next_pod): the second, under the same
    # policy, is answered from the cache, so only the policy can keep the third from it.
    before = answer(cached, next_pod(review, "u-1", "o-1"))
    answer(cached, next_pod(review, "u-2", "o-2"))
    assert cached.reuse is not None and cached.reuse.decisions.hits == 1
    # The platform team moves the tenant's default product from A100 to H100.
    assert "defaultProduct: a100" in text
    policy.write_text(text.replace("defaultProduct: a100", "defaultProduct: h100", 1))
    cached.runtime.policy.load()
    after = next_pod(review, "u-1", "o-3")  # the same request uid: only the policy changed
    again = answer(cached, after)
    assert again != before
    assert again == answer(app(LABELS, reuse=False, policy=policy), after)
    assert cached.reuse.decisions.hits == 1


def test_each_reused_review_is_logged_and_counted_as_itself() -> None:
    logs.setup("info")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logs.BufferedHandler)
    raw = io.BytesIO()
    handler.setStream(io.TextIOWrapper(raw, encoding="utf-8", write_through=False))
    cached = app(LABELS, reuse=True)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": "serve-6d4cf56db7-", "namespace": "research"},
           "spec": {"containers": [{"name": "t", "image": "x",
                                    "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    counted = metrics.child(metrics.ADMISSIONS, "mutate", "CREATE", "Pod", "allowed")
    before = counted._value.get()
    for i in range(5):
        # The ReplicaSet controller creates each pod; the exemptions read the user, so
        # the user is part of the shape.
        answer(cached, request_review(pod, uid=f"pod-{i}",
                                      username="system:serviceaccount:kube-system:rs"))
    logs.flush()
    lines = [orjson.loads(x) for x in raw.getvalue().splitlines()]
    decisions = [x for x in lines if x.get("msg") == "decision"]
    assert [(d["uid"], d["decision"], d["changes"]) for d in decisions] == [
        (f"pod-{i}", "allowed", decisions[0]["changes"]) for i in range(5)]
    assert decisions[0]["changes"]  # a GPU pod that was mutated
    assert counted._value.get() - before == 5
    assert cached.reuse is not None and cached.reuse.decisions.hits == 4


def test_the_cache_holds_at_most_its_size() -> None:
    cache = DecisionCache(size=3)
    for i in range(10):
        cache.put(str(i).encode(), Decision())
    assert len(cache) == 3
    assert cache.get(b"9") is not None and cache.get(b"0") is None


@pytest.mark.parametrize("field", ["resourceClaims"])
def test_pods_naming_dra_claims_are_always_decided_afresh(field: str) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": "p-", "namespace": "research"},
           "spec": {field: [{"name": "gpu", "resourceClaimName": "c"}],
                    "containers": [{"name": "t", "image": "x"}]}}
    req = parse_review(orjson.dumps(request_review(pod)))
    assert DecisionCache().key(req, None, 1) is None


# ---------------------------------------------------------------- the validating webhook

CONTROLLERS = [("apps/v1", "ReplicaSet", "trainer-7c9f8d6b5"), ("batch/v1", "Job", "trainer")]


def series(template: dict[str, Any], namespace: str, controller: tuple[str, str, str],
           dry_run: bool, n: int, mutated: bool = True) -> list[dict[str, Any]]:
    """The validating reviews of ``n`` pods a controller creates from one template, as
    the API server sends them (``mutated``: as our mutating webhook left them): each
    with its generated name, its uid, its own request uid and its field manager's
    second; nothing else differs."""
    api, kind, owner = controller
    meta = {**template["metadata"], "namespace": namespace, "generateName": f"{owner}-",
            "ownerReferences": [{"apiVersion": api, "kind": kind, "name": owner,
                                 "uid": "owner-uid", "controller": True}]}
    meta.pop("name", None)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
           "spec": copy.deepcopy(template["spec"])}
    if mutated:
        req = parse_review(orjson.dumps(request_review(pod)))
        mutating(req, POLICY, LABELS.get)  # edits the object in place, as patched
        assert req.object is not None
        pod = req.object
    out = []
    for i in range(n):
        review = next_pod(request_review(pod, uid=f"req-{i}", dry_run=dry_run),
                          f"req-{i}", f"pod-uid-{i}")
        review["request"]["object"]["metadata"]["name"] = f"{owner}-{i:05d}"
        review["request"]["name"] = f"{owner}-{i:05d}"
        out.append(review)
    return out


def validating_app(*, reuse: bool, policy: Path = POLICY_FILE) -> AdmissionApp:
    source = PolicySource(str(policy))
    source.load()
    return AdmissionApp(Runtime(policy=source, namespace_labels=LABELS.get,
                                store=MemoryStore(), reuse_size=1024 if reuse else 0))


def validated(a: AdmissionApp, review: dict[str, Any]) -> bytes:
    reply = asyncio.run(a.decide("validate", parse_review(orjson.dumps(review)), 1.0))
    return orjson.dumps(reply, option=orjson.OPT_SORT_KEYS)


def reservations(a: AdmissionApp, n: int) -> list[Any]:
    """Each pod's reservation in the app's store (None: none kept for it)."""
    assert isinstance(a.runtime.store, MemoryStore)
    return [a.runtime.store.reserved.charge(f"pod-uid-{i}") for i in range(n)]


@EXAMPLES
@given(template=pod_templates(), namespace=st.sampled_from(NAMESPACES),
       controller=st.sampled_from(CONTROLLERS), dry_run=st.booleans(), mutated=st.booleans())
def test_a_reused_validation_is_the_validation_made_afresh(
        template: dict[str, Any], namespace: str, controller: tuple[str, str, str],
        dry_run: bool, mutated: bool) -> None:
    # Six pods of one shape: enough to pass some tenants' caps, so that quota refuses
    # the later ones by the pods admitted before them (quota is never reused).
    cached, fresh = validating_app(reuse=True), validating_app(reuse=False)
    pods = series(template, namespace, controller, dry_run, 6, mutated)
    # The last create tried again (a client's retry: the same name, a new uid) is one
    # charge: the name the reservation is kept under is this pod's.
    retry = next_pod(pods[-1], "req-retry", "pod-uid-6")
    for review in [*pods, retry]:
        assert validated(cached, review) == validated(fresh, review)
    assert reservations(cached, 7) == reservations(fresh, 7)


def test_quota_is_decided_for_each_pod_whose_checks_were_reused() -> None:
    # research-dev: at most 4 GPUs in the namespace (the example policy); pods of 2.
    assert "research-dev: {gpus: 4}" in POLICY_FILE.read_text()
    cached = validating_app(reuse=True)
    template = {"metadata": {}, "spec": {"containers": [{
        "name": "t", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}
    pods = series(template, "research-dev", CONTROLLERS[0], False, 3)
    answers = [orjson.loads(validated(cached, r))["response"] for r in pods]
    assert [a["allowed"] for a in answers] == [True, True, False]
    assert cached.reuse is not None and cached.reuse.checks.hits == 2
    # The refusal names the pod it refuses, not the one whose checks were reused.
    assert "trainer-7c9f8d6b5-00002" in answers[2]["status"]["message"]
    assert "trainer-7c9f8d6b5-00000" not in answers[2]["status"]["message"]
    assert reservations(cached, 3)[:2] != [None, None] and reservations(cached, 3)[2] is None


def test_pods_without_a_controller_are_checked_afresh() -> None:
    # A pod of its own is charged to "pod/<its name>": nothing of it is shared.
    cached = validating_app(reuse=True)
    template = {"metadata": {}, "spec": {"containers": [{
        "name": "t", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    for review in series(template, "research", CONTROLLERS[0], False, 3):
        review["request"]["object"]["metadata"].pop("ownerReferences")
        validated(cached, review)
    assert cached.reuse is not None and cached.reuse.checks.hits == 0


@pytest.mark.parametrize("webhook", ["mutate", "validate"])
def test_a_priority_class_seen_since_is_never_answered_from_the_cache(webhook: str) -> None:
    # The tenant's ceiling is 0 (the default); a pod names a class the PriorityClass
    # watch has not delivered yet (its value unknown: allowed), then the class arrives
    # at a value above the ceiling: the next pod of the shape is refused.
    classes: dict[str, tuple[int, str]] = {}

    def served(reuse: bool) -> AdmissionApp:
        source = PolicySource(str(POLICY_FILE))
        source.load()
        return AdmissionApp(Runtime(policy=source, namespace_labels=LABELS.get,
                                    store=MemoryStore(), reuse_size=1024 if reuse else 0,
                                    sights=Sights(priority_class=classes.get)))

    cached = served(True)
    template = {"metadata": {}, "spec": {"priorityClassName": "urgent", "containers": [{
        "name": "t", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    first, second, third = series(template, "research", CONTROLLERS[0], False, 3)

    def answered(a: AdmissionApp, review: dict[str, Any]) -> dict[str, Any]:
        reply = asyncio.run(a.decide(webhook, parse_review(orjson.dumps(review)), 1.0))
        return dict(reply["response"])

    assert answered(cached, first)["allowed"] and answered(cached, second)["allowed"]
    classes["urgent"] = (1_000_000, "PreemptLowerPriority")
    assert answered(cached, third) == answered(served(False), third)
    if webhook == "validate":
        assert not answered(cached, third)["allowed"]
