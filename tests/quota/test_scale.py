"""The scale subresource (``kubectl scale``, an HPA): a scale-up is checked against quota
as a workload UPDATE is, on the pod template of the workload read from the API server.

The pure part (``webhook.engine.scale``) is table-driven here; then the server's path
with a fake workload reader (what is read, when, and what happens when the read fails),
and the cluster adapter's timeout and error mapping. The real API server's side (the
webhook configuration's rules and matchConditions, the RBAC the read needs) is in
tests/e2e/test_e2e_scale.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from quotakit import POLICY, pod
from urllib3.exceptions import ProtocolError

from webhook.admission.webhooks import Cluster, WorkloadUnreadable, scaling
from webhook.engine.charge import charge_of_pod
from webhook.engine.cost import Ask
from webhook.engine.decision import Decision
from webhook.engine.scale import ScaleUp, check_scale, scale_up, unchecked_scale
from webhook.engine.target import no_labels
from webhook.k8s.review import AdmissionRequest, BadReview, parse_review, request_review
from webhook.libs import kube
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text
from webhook.quota.store import MemoryStore
from webhook.server import cluster, metrics
from webhook.server.sources.reload import PolicySource
from webhook.server.web.app import AdmissionApp, Runtime

# The quota tests' policy, plus exemptions and a tenant without quota.
SCALE_POLICY = POLICY.replace("  tenants:\n", """  exemptions:
    namespaces: [ops]
    users: [admin]
  tenants:
    - name: team-c
      namespaces: [team-c]
""")
TAG = "[rule quota, tenant team-a]"


def policy(text: str = SCALE_POLICY) -> CompiledPolicy:
    return compile_policy(load_text(text))


def scale_object(name: str, namespace: str, replicas: int | None) -> dict[str, Any]:
    """A Scale as the API server sends it (``spec.replicas`` is omitted when 0)."""
    spec: dict[str, Any] = {} if replicas is None else {"replicas": replicas}
    return {"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec,
            "status": {"replicas": 1, "selector": "app=x"}}


def scale_review(old: int | None, new: int | None, *, resource: str = "deployments",
                 name: str = "trainer", namespace: str = "team-a", group: str = "apps",
                 sub: str = "scale", operation: str = "UPDATE", user: str = "developer",
                 dry_run: bool = False, old_object: bool = True) -> AdmissionRequest:
    """A scale subresource review, parsed as the server parses it."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "5c4f0f0e-0000-4000-8000-000000000001",
        "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "subResource": sub,
        "requestKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "name": name, "namespace": namespace, "operation": operation,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": scale_object(name, namespace, new),
        "oldObject": scale_object(name, namespace, old) if old_object else None,
        "dryRun": dry_run, "options": None,
    }}
    return parse_review(orjson.dumps(review))


def workload(kind: str = "Deployment", gpus: int = 1, product: str | None = "H100", *,
             name: str = "trainer", namespace: str = "team-a", replicas: int = 1,
             resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    """A workload as the API server stores it (its template mutated: pinned, both
    request and limit set)."""
    spec = pod("t", namespace, gpus, product=product, resource=resource)["spec"]
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def store_with(p: CompiledPolicy, *pods: dict[str, Any]) -> MemoryStore:
    store = MemoryStore(ttl=60)
    for obj in pods:
        store.pod_seen(obj["metadata"]["uid"], charge_of_pod(obj, p))
    return store


def decide(req: AdmissionRequest, obj: dict[str, Any], store: MemoryStore | None = None,
           p: CompiledPolicy | None = None) -> Decision:
    """The admission pipeline's scale step, with the workload ``obj`` as if read from the
    API."""
    p = p or policy()
    store = store if store is not None else MemoryStore(ttl=60)
    assert isinstance(scale_up(req, p, no_labels), ScaleUp)

    async def read(resource: str, namespace: str, name: str, timeout: float
                   ) -> dict[str, Any]:
        return obj

    return asyncio.run(scaling(req, p, Cluster(no_labels, store, read)))


def asked(req: AdmissionRequest, obj: dict[str, Any]) -> Ask | None:
    """What the scale-up asks of quota (the engine's half of the step), if anything."""
    up = scale_up(req, policy(), no_labels)
    assert isinstance(up, ScaleUp)
    step = check_scale(up, obj, policy(), no_labels).quota
    return step.ask if step is not None else None


# --- answered from the request alone (no read) --------------------------------------------

@pytest.mark.parametrize(("req", "skipped"), [
    (scale_review(1, 5, sub="status"), "subresource"),
    (scale_review(1, 5, resource="daemonsets"), "subresource"),
    (scale_review(1, 5, resource="replicationcontrollers", group=""), "subresource"),
    (scale_review(1, 5, group="extensions"), "subresource"),
    (scale_review(1, 5, namespace="ops"), "exempt"),
    (scale_review(1, 5, user="admin"), "exempt"),
    (scale_review(3, 3), "scale-down"),
    (scale_review(5, 2), "scale-down"),
    (scale_review(2, None), "scale-down"),  # to 0: spec.replicas omitted
    (scale_review(None, None), "scale-down"),
    (scale_review(1, 5, namespace="nobody"), "no-quota"),  # in no tenant
    (scale_review(1, 5, namespace="team-c"), "no-quota"),  # a tenant without quota
])
def test_requests_answered_without_reading_the_workload(req, skipped) -> None:
    d = scale_up(req, policy(), no_labels)
    assert isinstance(d, Decision)
    assert d.allowed and d.skipped == skipped and not d.warnings and not d.findings


@pytest.mark.parametrize(("req", "old", "new", "kind"), [
    (scale_review(2, 5), 2, 5, "Deployment"),
    (scale_review(None, 3, resource="statefulsets"), 0, 3, "StatefulSet"),
    (scale_review(1, 4, resource="replicasets", dry_run=True), 1, 4, "ReplicaSet"),
    (scale_review(7, 9, old_object=False), 0, 9, "Deployment"),  # no oldObject: all count
    (scale_review(1, 2, namespace="team-a-dev"), 1, 2, "Deployment"),
])
def test_a_scale_up_in_a_tenant_with_quota_needs_the_workload(req, old, new, kind) -> None:
    up = scale_up(req, policy(), no_labels)
    assert isinstance(up, ScaleUp)
    assert (up.old, up.new, up.kind, up.tenant.name) == (old, new, kind, "team-a")
    assert up.subject == (f"{kind.lower()} {req.namespace}/trainer, scaled from {old} to "
                          f"{new} replicas")


@pytest.mark.parametrize("replicas", ["5", -1, 2.5, True])
def test_a_malformed_scale_is_denied_with_the_pointer(replicas) -> None:
    req = scale_review(1, 5)
    assert req.object is not None
    req.object["spec"]["replicas"] = replicas
    d = scale_up(req, policy(), no_labels)
    assert isinstance(d, Decision)
    assert not d.allowed
    assert d.message == ("deployment team-a/trainer, scale: the object is malformed: "
                         "/spec/replicas must be a non-negative integer.")


def test_the_review_names_the_parent_resource_of_a_subresource() -> None:
    req = scale_review(1, 2, resource="statefulsets")
    assert (req.kind, req.sub_resource, req.resource_group, req.resource) == (
        "Scale", "scale", "apps", "statefulsets")


@pytest.mark.parametrize("resource", ["deployments", ["apps"], {"group": 1}])
def test_a_malformed_request_resource_is_a_bad_review(resource) -> None:
    review = orjson.loads(orjson.dumps(request_review(pod("p"))))
    review["request"]["resource"] = resource
    with pytest.raises(BadReview, match=r"request\.resource"):
        parse_review(orjson.dumps(review))


# --- decided on the workload's pod template ------------------------------------------------

SUBJECT = "deployment team-a/trainer, scaled from {} to {} replicas"


@pytest.mark.parametrize(("old", "new", "busy", "gpus", "outcome", "text"), [
    # h100 cap 4 (the tenant's 8 GPUs and 5 pods are looser for these).
    (1, 3, 0, 1, "allowed", None),
    (1, 4, 0, 1, "allowed", None),
    (1, 5, 0, 1, "denied",
     "asks for 5 pods x 1 = 5 h100 GPUs at once, but tenant team-a's quota is 4 h100 GPUs: "
     "it can never run in full. Run at most 4 pods of this size, or fewer h100 GPUs per pod."),
    # 100 of 8 GPUs (4 pods), of 4 h100 (2 pods), of 5 GPU pods: the binding one only.
    (1, 50, 0, 2, "denied",
     "asks for 50 pods x 2 = 100 h100 GPUs at once, but tenant team-a's quota is 4 h100 GPUs: "
     "it can never run in full. Run at most 2 pods of this size (the tightest of the 3 caps "
     "it exceeds), or fewer h100 GPUs per pod."),
    # 3 of 4 h100 in use (the deployment's own pod among them): only the added pods count.
    (1, 2, 3, 1, "allowed", None),
    (1, 3, 3, 1, "warned",
     "asks for 2 pods x 1 h100 GPUs, but only 1 of tenant team-a's 4 h100 GPUs are free now: "
     "1 of its pods can start now and the rest will be refused until quota frees up. A "
     "refused pod is not shown at kubectl apply: it shows up as an event on its ReplicaSet "
     "(kubectl get events)."),
])
def test_the_pods_a_scale_up_adds_are_checked_against_quota(old, new, busy, gpus, outcome,
                                                            text) -> None:
    p = policy()
    store = store_with(p, *(pod(f"busy-{i}", product="H100") for i in range(busy)))
    d = decide(scale_review(old, new), workload(gpus=gpus), store, p)
    assert d.outcome == outcome, (d.message, d.warnings)
    found = [f.message for f in d.findings]
    if text is None:
        assert found == []
    else:  # every cap exceeded is named; the one of this case among them
        assert f"{SUBJECT.format(old, new)}: {text} {TAG}" in found
    ask = asked(scale_review(old, new), workload(gpus=gpus))
    assert ask is not None and (ask.pods, ask.pods_added) == (new, new - old)
    if outcome == "denied":
        assert d.message == "\n".join(found)


def test_a_namespace_cap_applies_to_the_scaled_workload() -> None:
    d = decide(scale_review(1, 3, namespace="team-a-dev"),
               workload(namespace="team-a-dev", product="A100"))
    assert not d.allowed
    assert d.message == (
        "deployment team-a-dev/trainer, scaled from 1 to 3 replicas: asks for 3 pods x 1 = 3 "
        "GPUs at once, but namespace team-a-dev's quota is 2 GPUs: it can never run in full. "
        "Run at most 2 pods of this size, or fewer GPUs per pod. [rule quota, tenant team-a]")


@pytest.mark.parametrize(("resource", "kind"), [("statefulsets", "StatefulSet"),
                                                ("replicasets", "ReplicaSet")])
def test_statefulsets_and_replicasets_are_checked_alike(resource, kind) -> None:
    d = decide(scale_review(1, 6, resource=resource, name="db"), workload(kind, name="db"))
    assert not d.allowed
    assert d.message.startswith(f"{kind.lower()} team-a/db, scaled from 1 to 6 replicas: "
                                "asks for 6 pods x 1 = 6 h100 GPUs at once")


def test_a_workload_without_gpus_is_allowed_without_a_finding() -> None:
    obj = workload()
    obj["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    d = decide(scale_review(1, 500), obj)
    assert d.allowed and d.skipped == "no-gpu" and not d.findings
    assert asked(scale_review(1, 500), obj) is None


def test_only_quota_is_checked_not_the_templates_other_rules() -> None:
    # Unpinned (stored before the webhook was installed): the validating webhook would
    # refuse such a template at apply, but its pods are pinned when they are created.
    unpinned = workload(product=None)
    d = decide(scale_review(1, 3), unpinned)
    assert d.outcome == "allowed" and not d.findings
    d = decide(scale_review(1, 9), unpinned)
    assert {f.rule.value for f in d.findings} == {"quota"}
    # 9 of 8 GPUs and 9 of 5 GPU pods: one answer, from the pod cap, the tighter.
    assert d.message.count("[rule quota") == 1
    assert ("asks for 9 pods x 1 = 9 GPU pods at once, but tenant team-a's quota is 5 GPU "
            "pods: it can never run in full. Run at most 5 pods (the tightest of the 2 caps "
            "it exceeds).") in d.message


def test_a_dry_run_scale_is_checked_too() -> None:
    d = decide(scale_review(1, 5, dry_run=True), workload())
    assert not d.allowed and "it can never run in full" in d.message


@pytest.mark.parametrize("mode", ["warn", "audit"])
def test_quota_in_warn_or_audit_mode_admits_the_scale(mode) -> None:
    p = policy(SCALE_POLICY.replace("  exemptions:", f"  rules:\n    quota: {{mode: {mode}}}\n"
                                    "  exemptions:"))
    d = decide(scale_review(1, 5), workload(), p=p)
    assert d.allowed
    assert bool(d.warnings) == (mode == "warn")
    assert [f.mode.value for f in d.findings] == [mode]


def test_a_workload_that_could_not_be_read_is_allowed_with_a_warning_saying_why() -> None:
    p = policy()
    req = scale_review(1, 50)
    up = scale_up(req, p, no_labels)
    assert isinstance(up, ScaleUp)
    d = unchecked_scale(up, p, "read deployment team-a/trainer: HTTP 403 Forbidden")
    assert d.allowed and d.outcome == "warned"
    assert d.warnings == [
        "deployment team-a/trainer, scaled from 1 to 50 replicas: not checked against GPU "
        "quota: the webhook could not read the deployment to see its pod template (read "
        "deployment team-a/trainer: HTTP 403 Forbidden). Its pods are still checked one by "
        "one when they are created; a pod refused then shows as an event (kubectl get "
        f"events). {TAG}"]


def test_a_malformed_stored_workload_is_not_checked_rather_than_denied() -> None:
    obj = workload()
    obj["spec"]["template"]["spec"]["containers"] = {"not": "a list"}
    d = decide(scale_review(1, 5), obj)
    assert d.allowed and d.outcome == "warned"
    assert "not checked against GPU quota" in d.warnings[0]
    assert "/spec/template/spec/containers must be a list" in d.warnings[0]


# --- the server: when the workload is read, and when it cannot be -------------------------

class FakeReader:
    def __init__(self, result: dict[str, Any] | Exception) -> None:
        self.result = result
        self.calls: list[tuple[str, str, str, float]] = []

    async def __call__(self, resource: str, namespace: str, name: str, timeout: float
                       ) -> dict[str, Any]:
        self.calls.append((resource, namespace, name, timeout))
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def server_app(tmp_path: Path, reader: FakeReader | None) -> AdmissionApp:
    path = tmp_path / "policy.yaml"
    path.write_text(SCALE_POLICY)
    source = PolicySource(str(path))
    source.load()
    return AdmissionApp(Runtime(policy=source, store=MemoryStore(ttl=60),
                                read_workload=reader))


def answer(app: AdmissionApp, req: AdmissionRequest, budget: float = 4.0) -> dict[str, Any]:
    reply = asyncio.run(app.decide("validate", req, budget))
    response: dict[str, Any] = reply["response"]
    return response


def test_the_server_reads_the_workload_of_a_scale_up_within_the_budget(tmp_path) -> None:
    reader = FakeReader(workload())
    app = server_app(tmp_path, reader)
    out = answer(app, scale_review(1, 5), budget=4.0)
    assert reader.calls == [("deployments", "team-a", "trainer", 2.0)]  # capped at 2 s
    assert out["allowed"] is False
    assert out["status"]["message"].startswith(SUBJECT.format(1, 5))
    answer(app, scale_review(1, 5), budget=0.5)
    assert reader.calls[-1][3] == 0.5  # never more than the request has left


@pytest.mark.parametrize("req", [scale_review(5, 2), scale_review(1, 5, namespace="team-c"),
                                 scale_review(1, 5, user="admin"),
                                 scale_review(1, 5, sub="status")])
def test_the_server_does_not_read_when_the_request_alone_decides(tmp_path, req) -> None:
    reader = FakeReader(AssertionError("must not be read"))
    out = answer(server_app(tmp_path, reader), req)
    assert out["allowed"] is True and "warnings" not in out
    assert reader.calls == []


@pytest.mark.parametrize("reader", [
    FakeReader(WorkloadUnreadable("read deployment team-a/trainer: not found")),
    None,  # serve without a cluster
])
def test_a_failed_read_allows_the_scale_with_a_warning(tmp_path, reader) -> None:
    before = metrics.SCALES_UNCHECKED._value.get()
    out = answer(server_app(tmp_path, reader), scale_review(1, 50))
    assert out["allowed"] is True
    (warning,) = out["warnings"]
    assert warning.startswith(f"{SUBJECT.format(1, 50)}: not checked against GPU quota")
    why = ("read deployment team-a/trainer: not found" if reader
           else "the webhook is not connected to a cluster")
    assert f"({why})" in warning
    assert metrics.SCALES_UNCHECKED._value.get() == before + 1


def test_the_mutating_webhook_leaves_a_scale_alone(tmp_path) -> None:
    reader = FakeReader(AssertionError("must not be read"))
    reply = asyncio.run(server_app(tmp_path, reader).decide("mutate", scale_review(1, 50), 4.0))
    assert reply["response"]["allowed"] is True
    assert "patch" not in reply["response"] and "warnings" not in reply["response"]
    assert reader.calls == []


# --- the cluster adapter --------------------------------------------------------------------

class FakeWorkloads:
    def __init__(self, result: dict[str, Any] | Exception, delay: float = 0.0) -> None:
        self.result, self.delay = result, delay

    def read(self, resource: str, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        time.sleep(self.delay)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def read_with(workloads: FakeWorkloads, timeout: float) -> dict[str, Any]:
    read = cluster.workload_reader(workloads)  # type: ignore[arg-type]
    return asyncio.run(read("deployments", "team-a", "trainer", timeout))


def test_the_reader_returns_the_workload() -> None:
    assert read_with(FakeWorkloads({"kind": "Deployment"}), 1.0) == {"kind": "Deployment"}


@pytest.mark.parametrize(("error", "why"), [
    (kube.Unreachable("read deployment team-a/trainer: HTTP 403 Forbidden"), "HTTP 403"),
    (kube.NotFound("read deployment team-a/trainer: not found"), "not found"),
])
def test_the_reader_turns_api_errors_into_a_reason(error, why) -> None:
    with pytest.raises(WorkloadUnreadable, match=why):
        read_with(FakeWorkloads(error), 1.0)


class BlockedWorkloads:
    """An API server that does not answer until the test lets it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.answered = False

    def read(self, resource: str, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        self.release.wait(60)
        self.answered = True
        return {}


def test_the_reader_gives_up_at_its_timeout() -> None:
    # Ordered by events, not timed: the reader must give up while the read is still
    # blocked (it never answered), which only its own 0.1 s timeout can do.
    fake = BlockedWorkloads()
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(WorkloadUnreadable,
                           match=r"no answer from the API server within 0\.1s"):
            loop.run_until_complete(cluster.workload_reader(fake)(  # type: ignore[arg-type]
                "deployments", "team-a", "trainer", 0.1))
        assert not fake.answered
    finally:
        fake.release.set()
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


class _Response:
    def __init__(self, data: bytes) -> None:
        self.data = data


@pytest.mark.parametrize(("outcome", "expected"), [
    (ApiException(status=403, reason="Forbidden"),
     "read deployment team-a/trainer: the webhook's service account is not allowed to do "
     "this (check its RBAC) (HTTP 403)"),
    (ApiException(status=404, reason="Not Found"), "read deployment team-a/trainer: "
                                                         "not found"),
    (ProtocolError("connection reset"), "read deployment team-a/trainer: the connection to "
                                        "the API server broke"),
    (_Response(b"[]"), "read deployment team-a/trainer: the API server's answer is not an "
                       "object"),
])
def test_kube_workloads_maps_failures_to_messages_that_say_what_was_tried(outcome,
                                                                          expected) -> None:
    workloads = kube.Workloads(ApiClient())

    def fake(*args: Any, **kw: Any) -> Any:
        assert kw["_request_timeout"] == 1.5 and kw["_preload_content"] is False
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    workloads._read["deployments"] = fake
    with pytest.raises(kube.KubeError) as err:
        workloads.read("deployments", "team-a", "trainer", 1.5)
    assert str(err.value).startswith(expected)
