"""docs/operating.md's troubleshooting stories, tried on a simulated GPU cluster installed
as on a real one (the policy ConfigMap mounted into the replica as the kubelet mounts it,
the leader keeping the webhook configurations): each test is one story, doing what the
story says happens and running the commands it gives.

- "A policy edit does not take": an edit of the ConfigMap decides the next pod; an edit
  that does not load is refused at apply, located; one made while no replica answered is
  not served (the last good policy is), and ``/readyz`` says where it is wrong.
- "A pod stays SchedulingGated": with no replica leading, a waiting pod is not released
  even once quota frees, and ``gpu-webhook status`` says so; a leader releases it. A pod
  the cut quota can never hold is told so and passed over. A pod over its user's cap
  waits for that user's GPUs (``status`` shows the user's row) and starts when they free.
- "The webhook is down": a tenant's pods are refused, GPU or not, other namespaces' are
  not; ``gpu-webhook failure-policy Ignore`` lets them in unchecked (a GPU pod without its
  toleration, the quota gate removable by anyone), and a replica that leads again writes
  the recorded failure policy back.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from e2ekit import LEDGER_NAMESPACE, gpu_webhook, short_id, start_replica, wait_ready, wait_until
from gpucluster.fixtures import (
    SCHEDULE_TIMEOUT,
    a100_cluster,
    core_api,
    namespaces,
    own_policy,
    own_sim,
    pod,
    running,
    started,
)
from gpucluster.sim import SimCluster
from kubernetes import client as k8s

pytestmark = pytest.mark.e2e

GATE = "gpu-webhook.dev/quota"
CLUSTER = a100_cluster("operating-sim", "a100-ops", 2, 4)
POLICY = own_policy("operating-sim", """\
    - name: team
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: team}
      quota: {gpus: 6}
    - name: queue
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: queue}
      quota: {gpus: 2}
      overQuota: wait
    - name: people
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: people}
      quota: {gpus: 4}
      userQuota: {gpus: 1}
      overQuota: wait
""")
ARGS = ["--webhook-configurations-sync", "fix", "--quota-status-seconds", "2",
        "--policy-poll-seconds", "0.5"]


@pytest.fixture(scope="module")
def ops_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    work = tmp_path_factory.mktemp("operating-sim")
    with started(own_sim(work, CLUSTER, POLICY, as_installed=True, webhook_args=ARGS)) as c:
        yield c


@pytest.fixture(scope="module")
def api(ops_sim: SimCluster) -> k8s.CoreV1Api:
    return core_api(ops_sim)


@pytest.fixture
def ns(ops_sim: SimCluster, api: k8s.CoreV1Api) -> Iterator[Any]:
    with namespaces(ops_sim, api, lambda t: f"{t or 'plain'}-{short_id()}") as make:
        yield make


def kubectl(sim: SimCluster, *args: str, input: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    return sim.cp.kubectl(*args, input=input, check=False)


def create(sim: SimCluster, namespace: str, obj: dict[str, Any], dry_run: bool = False
           ) -> subprocess.CompletedProcess[str]:
    return kubectl(sim, "create", "-n", namespace, "-f", "-", "-o", "yaml",
                   *(["--dry-run=server"] if dry_run else []), input=yaml.safe_dump(obj))


def edit_policy(sim: SimCluster, old: str, new: str) -> None:
    """``kubectl edit configmap gpu-webhook-policy``, as a platform engineer does it."""
    cm = json.loads(sim.cp.kubectl("get", "configmap", "gpu-webhook-policy", "-n",
                                   LEDGER_NAMESPACE, "-o", "json").stdout)
    assert cm["data"]["policy.yaml"].count(old) == 1, (old, cm["data"]["policy.yaml"])
    cm["data"]["policy.yaml"] = cm["data"]["policy.yaml"].replace(old, new)
    sim.cp.kubectl("replace", "-f", "-", input=json.dumps(cm))


def readyz(sim: SimCluster) -> dict[str, Any]:
    assert sim.webhook is not None
    got: dict[str, Any] = httpx.get(
        f"https://127.0.0.1:{sim.webhook.replicas[0].port}/readyz",
        verify=str(sim.webhook.ca_file), timeout=10).json()
    return got


def status(sim: SimCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return gpu_webhook("status", "--kubeconfig", str(sim.cp.kubeconfig), *args, check=False)


def stop_replicas(sim: SimCluster) -> None:
    assert sim.webhook is not None
    for r in sim.webhook.replicas:
        r.stop()


def start_replicas(sim: SimCluster) -> None:
    """Every replica again, each on its port (where the configurations call it)."""
    d = sim.webhook
    assert d is not None
    d.replicas = [start_replica(d.workdir, d.cert_dir, sim.policy, sim.cp.kubeconfig, i,
                               ARGS, port=r.port) for i, r in enumerate(d.replicas)]
    for r in d.replicas:
        wait_ready(r, d.ca_file)


def gated(api: k8s.CoreV1Api, namespace: str, name: str) -> bool:
    p = api.read_namespaced_pod(name, namespace)
    return any(g.name == GATE for g in p.spec.scheduling_gates or ())


def test_an_edit_of_the_policy_configmap_decides_the_next_pod(
        ops_sim: SimCluster, ns: Any) -> None:
    team = ns("team")
    assert create(ops_sim, team, pod("first", 4)).returncode == 0
    try:
        edit_policy(ops_sim, "quota: {gpus: 6}", "quota: {gpus: 3}")

        def refused() -> bool:
            out = create(ops_sim, team, pod(f"next-{short_id()}", 1), dry_run=True)
            return out.returncode != 0 and "exceeded quota" in out.stderr

        # The kubelet (here mount.py) writes the file, the replica reloads it.
        wait_until("the next pod to be decided by the edited policy", refused, timeout=60,
                   every=0.5)
        out = create(ops_sim, team, pod("next", 1), dry_run=True)
        assert "team" in out.stderr and "of its 3" in out.stderr, out.stderr
    finally:
        edit_policy(ops_sim, "quota: {gpus: 3}", "quota: {gpus: 6}")
        wait_until("the policy to be put back", lambda: create(
            ops_sim, team, pod(f"back-{short_id()}", 1), dry_run=True).returncode == 0,
            timeout=60, every=0.5)


def test_an_edit_that_does_not_load_is_refused_or_not_served_and_says_where(
        ops_sim: SimCluster, ns: Any) -> None:
    team = ns("team")
    cm = json.loads(ops_sim.cp.kubectl("get", "configmap", "gpu-webhook-policy", "-n",
                                       LEDGER_NAMESPACE, "-o", "json").stdout)
    good = cm["data"]["policy.yaml"]
    bad = good.replace("quota: {gpus: 6}", "quota: {gpus: lots}")
    # A replica answers: the edit is refused at apply, located as policy check locates it.
    cm["data"]["policy.yaml"] = bad
    out = kubectl(ops_sim, "replace", "-f", "-", input=json.dumps(cm))
    assert out.returncode != 0
    assert 'admission webhook "policy-file.gpu-webhook.dev" denied the request' in out.stderr
    assert re.search(r"configmap gpu-webhook/gpu-webhook-policy:\d+: spec\.tenants\[1\]\."
                     r"quota\.gpus: must be a number \(got 'lots'\)", out.stderr), out.stderr
    # An edit made while no replica answered (the check fails open) reaches the mounted
    # file: the replica does not serve it, and says where it is wrong.
    served = readyz(ops_sim)["generation"]
    ops_sim.policy.write_text(bad)  # what the kubelet would deliver
    try:
        wait_until("the replica to refuse the edit", lambda: readyz(ops_sim).get(
            "lastReloadError") is not None, timeout=60, every=0.5)
        said = readyz(ops_sim)
        assert said["ready"] and said["generation"] == served  # the last good one serves
        assert re.search(r"policy\.yaml:\d+: spec\.tenants\[1\]\.quota\.gpus: must be a number "
                         r"\(got 'lots'\)", said["lastReloadError"]), said["lastReloadError"]
        # The last good policy still decides: 6 GPUs.
        assert create(ops_sim, team, pod("fits", 4), dry_run=True).returncode == 0
    finally:
        ops_sim.policy.write_text(good)
        wait_until("the replica to serve the file put right", lambda: readyz(ops_sim).get(
            "lastReloadError") is None, timeout=60, every=0.5)


def test_a_waiting_pod_stays_gated_while_no_replica_leads(
        ops_sim: SimCluster, api: k8s.CoreV1Api, ns: Any) -> None:
    queue = ns("queue")
    assert create(ops_sim, queue, pod("first", 2)).returncode == 0
    running(api, queue, 1)  # seen by the replica: the next one does not fit
    assert create(ops_sim, queue, pod("second", 2)).returncode == 0
    wait_until("the second pod to wait behind the gate", lambda: gated(api, queue, "second"),
               timeout=SCHEDULE_TIMEOUT)
    stop_replicas(ops_sim)
    try:
        kubectl(ops_sim, "delete", "pod", "first", "-n", queue, "--wait=true")
        out = status(ops_sim, "-n", queue)
        assert out.returncode == 0, out.stderr
        assert "queue: 1 pod waits for GPU quota" in out.stdout
        assert ("leader: none (the last leader released Lease gpu-webhook-leader): "
                "1 waiting pod is not released") in out.stdout
        assert gated(api, queue, "second")  # nobody releases it
    finally:
        start_replicas(ops_sim)
    wait_until("the leader to release the waiting pod", lambda: not gated(api, queue, "second"),
               timeout=SCHEDULE_TIMEOUT)
    out = status(ops_sim, "-n", queue)
    assert "\nleader: " in out.stdout and "leader: none" not in out.stdout, out.stdout


def test_a_pod_the_cut_quota_can_never_hold_is_told_and_passed_over(
        ops_sim: SimCluster, api: k8s.CoreV1Api, ns: Any) -> None:
    queue = ns("queue")
    assert create(ops_sim, queue, pod("holds", 2)).returncode == 0
    running(api, queue, 1)
    assert create(ops_sim, queue, pod("big", 2)).returncode == 0  # first in line
    wait_until("the big pod to wait", lambda: gated(api, queue, "big"),
               timeout=SCHEDULE_TIMEOUT)
    assert create(ops_sim, queue, pod("small", 1)).returncode == 0
    wait_until("the small pod to wait", lambda: gated(api, queue, "small"),
               timeout=SCHEDULE_TIMEOUT)
    served = readyz(ops_sim)["generation"]
    edit_policy(ops_sim, "quota: {gpus: 2}", "quota: {gpus: 1}")
    try:
        # Served before the GPUs free up: under the old cap the big pod would fit then.
        wait_until("the cut quota to be served", lambda: readyz(ops_sim)["generation"] > served,
                   timeout=60, every=0.5)
        kubectl(ops_sim, "delete", "pod", "holds", "-n", queue, "--wait=true")
        # The pod behind it in line is released: the one that can never fit holds up no one.
        wait_until("the small pod to be released", lambda: not gated(api, queue, "small"),
                   timeout=SCHEDULE_TIMEOUT)
        assert gated(api, queue, "big")

        def told() -> list[str]:
            return [e.message for e in api.list_namespaced_event(
                queue, field_selector="involvedObject.name=big").items
                if e.reason == "QuotaNeverFits"]

        wait_until("the big pod to be told", lambda: bool(told()), timeout=30, every=0.5)
        assert "can never be released under the quota now" in told()[0]
        assert "of its 1 GPUs" in told()[0] and "Delete it" in told()[0]
    finally:
        edit_policy(ops_sim, "quota: {gpus: 1}", "quota: {gpus: 2}")


def test_a_pod_waits_for_its_users_own_gpus_and_status_shows_the_users_cap(
        ops_sim: SimCluster, api: k8s.CoreV1Api, ns: Any) -> None:
    people = ns("people")
    ops_sim.cp.kubectl("create", "rolebinding", "alice-edit", "--clusterrole=edit",
                       "--user=alice", "-n", people)

    def as_alice(obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return kubectl(ops_sim, "create", "--as=alice", "-n", people, "-f", "-",
                       input=yaml.safe_dump(obj))

    assert as_alice(pod("first", 1)).returncode == 0
    running(api, people, 1)
    out = as_alice(pod("second", 1))
    assert out.returncode == 0, out.stderr
    wait_until("alice's second pod to wait", lambda: gated(api, people, "second"),
               timeout=SCHEDULE_TIMEOUT)
    # Tenant people has 3 of its 4 GPUs free: it waits for alice's own.
    out = status(ops_sim, "-n", people)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert ["people", "user", "alice", "gpus", "1", "0", "1", "0"] in rows, out.stdout
    assert "people: 1 pod waits for GPU quota" in out.stdout
    kubectl(ops_sim, "delete", "pod", "first", "-n", people, "--wait=true")
    wait_until("alice's pod to be released once her first ends",
               lambda: not gated(api, people, "second"), timeout=SCHEDULE_TIMEOUT)


def test_the_webhook_down_and_the_break_glass(ops_sim: SimCluster, api: k8s.CoreV1Api,
                                               ns: Any) -> None:
    team, queue, other = ns("team"), ns("queue"), ns(None)
    assert create(ops_sim, queue, pod("holds", 2)).returncode == 0
    running(api, queue, 1)
    assert create(ops_sim, queue, pod("waits", 2)).returncode == 0
    wait_until("a pod to wait behind the gate", lambda: gated(api, queue, "waits"),
               timeout=SCHEDULE_TIMEOUT)
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
             "spec": {"containers": [{"name": "web", "image": "registry.local/web:1"}]}}
    stop_replicas(ops_sim)
    try:
        # Down, failing closed: a tenant's pods, GPU or not; not another namespace's.
        out = create(ops_sim, team, pod("gpu", 1))
        assert out.returncode != 0 and 'failed calling webhook "mutate.gpu-webhook.dev"' \
            in out.stderr, out.stderr
        out = create(ops_sim, team, plain)
        assert out.returncode != 0 and "failed calling webhook" in out.stderr, out.stderr
        assert create(ops_sim, other, plain).returncode == 0

        # Break glass.
        out = gpu_webhook("failure-policy", "Ignore", "--kubeconfig",
                          str(ops_sim.cp.kubeconfig))
        assert "mutate.gpu-webhook.dev" in out.stdout and "unchecked" in out.stdout

        def let_in() -> bool:
            return create(ops_sim, team, pod(f"gpu-{short_id()}", 1), dry_run=True
                          ).returncode == 0

        wait_until("the API server to let GPU pods in", let_in, timeout=30, every=0.5)
        made = yaml.safe_load(create(ops_sim, team, pod("unchecked", 1)).stdout)
        assert "nvidia.com/gpu" not in json.dumps(made["spec"].get("tolerations"))
        assert create(ops_sim, team, plain).returncode == 0  # its variable kept
        # Anyone who may update pods now removes the quota gate.
        out = kubectl(ops_sim, "patch", "pod", "waits", "-n", queue, "--type=json",
                      "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]')
        assert out.returncode == 0, out.stderr
    finally:
        start_replicas(ops_sim)

    # The leader writes back the failure policy the install recorded.
    def closed() -> bool:
        hooks = json.loads(ops_sim.cp.kubectl(
            "get", "mutatingwebhookconfiguration", "gpu-webhook", "-o", "json").stdout)["webhooks"]
        return all(h["failurePolicy"] == "Fail" for h in hooks)

    wait_until("the leader to restore failurePolicy Fail", closed, timeout=30, every=0.5)
    made = yaml.safe_load(create(ops_sim, team, pod("checked", 1)).stdout)
    assert "nvidia.com/gpu" in json.dumps(made["spec"]["tolerations"])
