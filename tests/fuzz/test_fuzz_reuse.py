"""Reused mutating decisions (``webhook.server.web.reuse``) are the decisions made afresh.

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
from fuzzkit import NAMESPACES, POLICY_FILE, reviews
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from webhook.engine.decision import Decision
from webhook.k8s.review import parse_review, request_review
from webhook.libs import logs
from webhook.server import metrics
from webhook.server.sources.reload import PolicySource
from webhook.server.web.app import AdmissionApp, Runtime
from webhook.server.web.reuse import DecisionCache

TENANT_LABEL = "gpu.example.com/tenant"
LABELS: dict[str, dict[str, str]] = {"inference": {TENANT_LABEL: "inference"}}
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
        assert cached.reuse.hits == 1  # the second pod was answered from the cache


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
        assert cached.reuse.hits == (0 if relabelled else 1)


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
    assert cached.reuse is not None and cached.reuse.hits == 1
    # The platform team moves the tenant's default product from A100 to H100.
    assert "defaultProduct: a100" in text
    policy.write_text(text.replace("defaultProduct: a100", "defaultProduct: h100", 1))
    cached.runtime.policy.load()
    after = next_pod(review, "u-1", "o-3")  # the same request uid: only the policy changed
    again = answer(cached, after)
    assert again != before
    assert again == answer(app(LABELS, reuse=False, policy=policy), after)
    assert cached.reuse.hits == 1


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
    assert cached.reuse is not None and cached.reuse.hits == 4


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
