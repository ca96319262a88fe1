"""Borrowing idle quota in a cohort, on a simulated GPU cluster of its own: the real
kube-apiserver (its Priority admission plugin), kube-scheduler (its preemption),
controllers and one kwok node of 8 A100s, with two webhook replicas behind a
round-robin proxy sharing the ledger.

Tenants lab-a and lab-b hold 4 GPUs of quota each in cohort ``lab``: the cohort's total
is the node's 8 GPUs. lab-a fills its own 4 and borrows lab-b's idle 4 (its pods marked
and at the shipped borrowed PriorityClass); then lab-b's own pods are all admitted (its
quota is never refused while lab-a borrows), and the scheduler preempts lab-a's borrowed
pods, and only those, to run them.

In cohort ``burst`` (tenant ``owner``, 2 GPUs; tenant ``burst``, 1 GPU, ``overQuota:
wait``), a pod bigger than its own quota waits, marked, for GPUs to borrow, and starts on
them once the owner's pods end.

Then the fact the design rests on, on the same API server: what its Priority admission
plugin does with a PriorityClass a mutating webhook sets (docs/quota.md).
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml
from e2ekit import ROOT, assert_denied, short_id, wait_until
from gpucluster.fixtures import (
    SCHEDULE_TIMEOUT,
    a100_cluster,
    own_policy,
    own_sim,
    pod,
    pods,
    running,
    started,
)
from gpucluster.sim import SimCluster
from kubernetes import client as k8s

pytestmark = pytest.mark.e2e

BORROWED = "gpu-webhook.dev/borrowed"

CLUSTER = a100_cluster("cohort-sim", "a100-lab", 1, 8)

POLICY = own_policy("cohort-sim", """\
    - name: lab-a
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: lab-a}
      quota: {gpus: 4}
      cohort: {name: lab}
    - name: lab-b
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: lab-b}
      quota: {gpus: 4}
      cohort: {name: lab}
    - name: owner
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: owner}
      quota: {gpus: 2}
      cohort: {name: burst}
    - name: burst
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: burst}
      quota: {gpus: 1}
      cohort: {name: burst, borrowingLimit: 2}
      overQuota: wait
""")


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    work = tmp_path_factory.mktemp("cohort-sim")
    with started(own_sim(work, CLUSTER, POLICY, replicas=2)) as cluster:
        # The shipped PriorityClass the policy's default borrowedPriorityClass names.
        cluster.cp.kubectl("apply", "-f", str(ROOT / "deploy/base/priority-borrowed.yaml"))
        yield cluster


def create(sim: SimCluster, namespace: str, name: str) -> Any:
    """kubectl create of a 1-GPU pod, as a developer runs it; the completed process."""
    return sim.cp.kubectl("create", "-n", namespace, "-f", "-", check=False,
                          input=yaml.safe_dump(pod(name, 1)))


def test_a_tenant_borrows_idle_gpus_and_the_lender_takes_them_back_by_preemption(
        own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Callable[[str], str]) -> None:
    a, b = tenant_ns("lab-a"), tenant_ns("lab-b")

    # lab-a's own 4 GPUs: not borrowed, no warning.
    for i in range(4):
        done = create(own_cluster, a, f"own-{i}")
        assert done.returncode == 0, done.stderr
        assert "borrowed" not in done.stderr
    # 4 more: on lab-b's idle quota, marked, and kubectl prints why.
    for i in range(4):
        done = create(own_cluster, a, f"borrowed-{i}")
        assert done.returncode == 0, done.stderr
        assert "borrowed from cohort lab" in done.stderr
        assert "may be preempted" in done.stderr
    running(api, a, 8)  # the node's 8 GPUs, all in use
    marked = {p.metadata.name: p for p in pods(api, a, f"{BORROWED}=true")}
    assert sorted(marked) == [f"borrowed-{i}" for i in range(4)]
    for p in marked.values():
        # The API server kept all three (its Priority plugin checks them against the
        # class after the mutating webhooks).
        assert (p.spec.priority_class_name, p.spec.priority, p.spec.preemption_policy) == (
            "gpu-webhook-borrowed", -100, "Never")

    # The cohort lends nothing more: a ninth pod of lab-a is refused.
    done = create(own_cluster, a, "one-more")
    assert_denied(done, "exceeded quota: tenant lab-a")

    # lab-b's own quota was never lent away from it: all 4 of its pods are admitted, and
    # the scheduler preempts lab-a's borrowed pods to run them.
    for i in range(4):
        done = create(own_cluster, b, f"mine-{i}")
        assert done.returncode == 0, done.stderr
        assert "borrowed" not in done.stderr
    running(api, b, 4, timeout=SCHEDULE_TIMEOUT)
    # The borrowed pods are the ones taken back; lab-a's own 4 still run.
    wait_until("lab-a's borrowed pods to be preempted",
               lambda: not [p for p in pods(api, a, f"{BORROWED}=true")
                            if p.status.phase == "Running" and
                            p.metadata.deletion_timestamp is None],
               timeout=SCHEDULE_TIMEOUT, every=0.3)
    own = [p for p in pods(api, a) if p.metadata.name.startswith("own-")]
    assert sorted(p.metadata.name for p in own if p.status.phase == "Running") == [
        f"own-{i}" for i in range(4)]
    preempted = [e for e in api.list_namespaced_event(a).items
                 if e.reason == "Preempted"]
    assert {e.involved_object.name for e in preempted} <= {f"borrowed-{i}"
                                                           for i in range(4)}
    assert preempted, "the scheduler preempted no borrowed pod"


def test_concurrent_borrowing_through_two_replicas_never_lends_more_than_is_idle(
        own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Callable[[str], str]) -> None:
    # lab-a's own 4 are in use and lab-b's 4 idle; 8 borrowing pods are created at once,
    # through the round-robin proxy to both replicas. The cohort's ledger lets at most 4
    # of them borrow, so every one admitted finds a GPU on the node.
    a = tenant_ns("lab-a")
    for i in range(4):
        assert create(own_cluster, a, f"own-{i}").returncode == 0
    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda i: create(own_cluster, a, f"rush-{i}"), range(8)))
    admitted = [d for d in done if d.returncode == 0]
    assert 1 <= len(admitted) <= 4, [d.stderr for d in done]
    for d in done:
        if d.returncode != 0:
            assert "exceeded quota" in d.stderr or "ledger" in d.stderr, d.stderr
    running(api, a, 4 + len(admitted))
    stored = json.loads(own_cluster.cp.kubectl(
        "get", "configmap", "-n", "gpu-webhook", "gpu-webhook-borrowed-lab", "-o",
        "json").stdout)["data"]
    entries = json.loads(stored["borrowed.lab-a"])
    assert {e["name"] for e in entries.values()} >= {
        f"{a}/{p.metadata.name}" for p in pods(api, a, f"{BORROWED}=true")}


def test_a_pod_only_borrowing_can_hold_waits_for_gpus_to_borrow_and_starts_on_them(
        own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Callable[[str], str]) -> None:
    owner, burst = tenant_ns("owner"), tenant_ns("burst")
    for i in range(2):
        assert create(own_cluster, owner, f"own-{i}").returncode == 0
    running(api, owner, 2)  # the owner's 2 GPUs in use: nothing to lend
    big = pod("big", 2)  # more than burst's own quota of 1 can ever hold
    done = own_cluster.cp.kubectl("create", "-n", burst, "-f", "-", check=False,
                                  input=yaml.safe_dump(big))
    assert done.returncode == 0, done.stderr  # not refused: it waits
    assert "waits for GPUs to borrow from cohort burst" in done.stderr, done.stderr
    [p] = pods(api, burst)
    assert [g.name for g in p.spec.scheduling_gates or ()] == ["gpu-webhook.dev/quota"]
    assert (p.metadata.labels or {}).get(BORROWED) == "true"
    assert (p.spec.priority_class_name, p.spec.priority) == ("gpu-webhook-borrowed", -100)
    wait_until("the leader to tell it what the cohort lends", lambda: any(
        e.reason == "WaitingForQuota" and "waiting to borrow GPUs from cohort burst: "
        "2 GPUs asked, 0 to lend" in e.message
        for e in api.list_namespaced_event(burst).items), timeout=30, every=0.3)
    assert pods(api, burst)[0].status.phase == "Pending"
    own_cluster.cp.kubectl("delete", "pod", "-n", owner, "own-0", "own-1", "--wait=false")
    running(api, burst, 1, timeout=SCHEDULE_TIMEOUT)
    [p] = pods(api, burst)
    assert not p.spec.scheduling_gates
    # Committed as a borrowed pod is, in the cohort's ledger, before its gate came off.
    stored = json.loads(own_cluster.cp.kubectl(
        "get", "configmap", "-n", "gpu-webhook", "gpu-webhook-borrowed-burst", "-o",
        "json").stdout)["data"]
    assert f"{burst}/big" in {e["name"] for e in json.loads(stored["borrowed.burst"]).values()}


# ---------------------------------------------------------------- the Priority plugin
#
# Why the webhook writes priorityClassName, priority and preemptionPolicy together: the
# API server's Priority admission plugin resolves the class before the mutating webhooks
# and checks the pod against it after them. A stand-in mutating webhook (a few lines of
# the standard library, on this cluster's API server) patches a pod each way.

_PATCH: list[dict[str, Any]] = []


class _Patcher(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        resp: dict[str, Any] = {"uid": body["request"]["uid"], "allowed": True,
                                "patchType": "JSONPatch",
                                "patch": base64.b64encode(json.dumps(_PATCH).encode()).decode()}
        out = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                          "response": resp}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def patcher(own_cluster: SimCluster) -> Iterator[str]:
    """A namespace whose pods the stand-in webhook patches with ``_PATCH``."""
    cp = own_cluster.cp
    cert, key = cp.issue_serving_cert("patcher", ["127.0.0.1"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Patcher)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ns = f"patched-{short_id()}"
    cp.kubectl("create", "namespace", ns)
    config = {"apiVersion": "admissionregistration.k8s.io/v1",
              "kind": "MutatingWebhookConfiguration", "metadata": {"name": "e2e-patcher"},
              "webhooks": [{"name": "patcher.e2e.gpu-webhook.dev",
                            "admissionReviewVersions": ["v1"], "sideEffects": "None",
                            "failurePolicy": "Fail",
                            "clientConfig": {"url": f"https://127.0.0.1:{server.server_port}/",
                                             "caBundle": cp.ca_bundle_b64},
                            "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                       "operations": ["CREATE"], "resources": ["pods"]}],
                            "namespaceSelector": {"matchLabels": {
                                "kubernetes.io/metadata.name": ns}}}]}
    cp.kubectl("apply", "-f", "-", input=json.dumps(config))
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
             "spec": {"containers": [{"name": "c", "image": "x"}]}}

    def patched() -> bool:
        # Until the API server calls it: a probe whose label the patch adds.
        _PATCH[:] = [{"op": "add", "path": "/metadata/labels", "value": {"patched": "yes"}}]
        out = cp.kubectl("create", "--dry-run=server", "-o", "json", "-n", ns, "-f", "-",
                         input=json.dumps(probe), check=False)
        return out.returncode == 0 and '"patched": "yes"' in out.stdout

    wait_until("the API server to call the stand-in webhook", patched, timeout=60,
               every=0.3)
    try:
        yield ns
    finally:
        cp.kubectl("delete", "mutatingwebhookconfiguration", "e2e-patcher")
        server.shutdown()


CLASS = "gpu-webhook-borrowed"
NAME = {"op": "add", "path": "/spec/priorityClassName", "value": CLASS}
PRIORITY = {"op": "add", "path": "/spec/priority", "value": -100}
POLICY_NEVER = {"op": "add", "path": "/spec/preemptionPolicy", "value": "Never"}


@pytest.mark.parametrize(("patch", "refused"), [
    ([NAME], "the integer value of priority (0) must not be provided in pod spec; "
             "priority admission controller computed -100 from the given PriorityClass name"),
    ([NAME, PRIORITY], "the string value of PreemptionPolicy (PreemptLowerPriority) must "
                       "not be provided in pod spec; priority admission controller computed "
                       "Never from the given PriorityClass name"),
    ([{**NAME, "value": "no-such-class"}, PRIORITY, POLICY_NEVER],
     "no PriorityClass with name no-such-class was found"),
    ([NAME, PRIORITY, POLICY_NEVER], None),
], ids=["name only", "name and priority", "missing class", "all three"])
def test_the_priority_plugin_checks_a_class_a_mutating_webhook_set(
        own_cluster: SimCluster, patcher: str, patch: list[dict[str, Any]],
        refused: str | None) -> None:
    _PATCH[:] = patch
    name = f"p-{short_id()}"
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [{"name": "c", "image": "x"}]}}
    out = own_cluster.cp.kubectl("create", "-n", patcher, "-f", "-", check=False,
                                 input=json.dumps(obj))
    if refused is not None:
        assert_denied(out, refused)
        return
    assert out.returncode == 0, out.stderr
    got = own_cluster.cp.kubectl(
        "get", "pod", "-n", patcher, name, "-o",
        "jsonpath={.spec.priorityClassName} {.spec.priority} {.spec.preemptionPolicy}")
    assert got.stdout == f"{CLASS} -100 Never"
