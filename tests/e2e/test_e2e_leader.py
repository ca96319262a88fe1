"""The leader decides GPU quota (``serve --quota-commit leader``), through the real API
server with two replicas: the API server calls the replica that does not lead, which
relays each real review to the leader; the cap holds; the leader is killed (SIGKILL)
and the other replica takes the Lease over, refuses GPU pods while it waits out the
hand-over (saying so), then admits exactly what is free. Each replica is told its pod
(POD_NAME, a stand-in Pod object nothing runs): the one that leads labels its own, for a
Service that sends reviews only to the leader (deploy/components/leader-decides).

The policy's reservation TTL is short (6 s), so the hand-over (TTL + the watches'
settle time) lasts seconds, not a minute.
"""

from __future__ import annotations

import re
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from controlplane.cluster import ControlPlane
from e2ekit import (
    LEDGER_NAMESPACE,
    Deployment,
    NamespaceFactory,
    capped_policy,
    core_client,
    gpu_pod,
    gpu_webhook,
    sees_free_gpus,
    start_replica,
    wait_ready,
    wait_until,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.server.leading.upkeep import LEADER_LABEL

pytestmark = pytest.mark.e2e

CAP = 3
LEADER_ARGS = ("--quota-commit", "leader")


def metric(d: Deployment, index: int, name: str) -> float:
    """The sum of a metric's samples on replica ``index`` (0 when it has none)."""
    ctx = ssl.create_default_context(cafile=str(d.ca_file))
    with httpx.Client(verify=ctx, timeout=5) as http:
        text = http.get(f"https://localhost:{d.replicas[index].port}/metrics").text
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def deciding(d: Deployment) -> int | None:
    """The index of the replica that decides GPU quota now, if one does."""
    live = [i for i, r in enumerate(d.replicas) if r.process.poll() is None]
    return next((i for i in live if metric(d, i, "gpu_webhook_quota_deciding") == 1), None)


@pytest.fixture(scope="module")
def core(control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    with core_client(control_plane) as api:
        yield api


def replica(d: Deployment, core: client.CoreV1Api) -> None:
    """Start one more replica, with a stand-in Pod object of its own to label."""
    index = len(d.replicas)
    pod = f"replica-{index}"
    core.create_namespaced_pod(LEDGER_NAMESPACE, client.V1Pod(
        metadata=client.V1ObjectMeta(name=pod),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="none")])))
    d.replicas.append(start_replica(
        d.workdir, d.cert_dir, d.policy, d.cp.kubeconfig, index, LEADER_ARGS,
        env={"POD_NAME": pod, "POD_NAMESPACE": LEDGER_NAMESPACE}))


def labelled(core: client.CoreV1Api) -> set[str]:
    """The stand-in pods that carry the leader label."""
    pods = core.list_namespaced_pod(LEDGER_NAMESPACE, label_selector=LEADER_LABEL).items
    return {p.metadata.name for p in pods if p.metadata.name.startswith("replica-")}


@pytest.fixture(scope="module")
def leading(control_plane: ControlPlane, core: client.CoreV1Api,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    workdir: Path = tmp_path_factory.mktemp("webhook-leader")
    cert_dir = workdir / "certs"
    gpu_webhook("certs", "--out", str(cert_dir), "--dns", "localhost", "--ip", "127.0.0.1")
    policy = capped_policy(workdir, "policy.yaml", ["lead", "rush"], CAP, ttl=6)
    d = Deployment(control_plane, workdir, cert_dir, policy)
    try:
        for _ in range(2):
            replica(d, core)
        for r in d.replicas:
            wait_ready(r, d.ca_file)
        wait_until("a replica to decide GPU quota", lambda: deciding(d) is not None,
                   timeout=60, every=0.5)
        yield d
    finally:
        d.stop()
        for i in range(len(d.replicas)):
            core.delete_namespaced_pod(f"replica-{i}", LEDGER_NAMESPACE, grace_period_seconds=0)


def create(core: client.CoreV1Api, namespace: str, name: str) -> tuple[int, str]:
    """Create a one-GPU pod: the HTTP status (201, or the refusal's) and its message."""
    try:
        core.create_namespaced_pod(namespace, gpu_pod(name, limits="1"))
    except ApiException as exc:
        return int(exc.status), str(exc.body)
    return 201, ""


def gpus_admitted(core: client.CoreV1Api, namespace: str) -> int:
    return sum(int(c.resources.limits.get("nvidia.com/gpu", 0))
               for p in core.list_namespaced_pod(namespace).items for c in p.spec.containers)


def test_the_leader_decides_for_the_other_replica_and_a_killed_leader_admits_nothing_extra(
        leading: Deployment, core: client.CoreV1Api, namespace: NamespaceFactory) -> None:
    d = leading
    leader = deciding(d)
    assert leader is not None
    follower = 1 - leader
    # The leader labels its own pod, and only it.
    wait_until("the leader to label its pod", lambda: labelled(core) == {f"replica-{leader}"},
               timeout=30, every=0.3)
    # The API server calls the replica that does not lead.
    with d.installed(url=f"https://127.0.0.1:{d.replicas[follower].port}"):
        ns = namespace("lead")
        wait_until(f"both replicas to see namespace {ns}", lambda: sees_free_gpus(d, ns, 1),
                   timeout=60, every=0.2)
        relayed = metric(d, follower, "gpu_webhook_relayed_reviews_total")
        got = [create(core, ns, f"p{i}") for i in range(CAP + 2)]
        assert [s for s, _ in got] == [201] * CAP + [403, 403], got
        assert "would use 4 of its 3" in got[CAP][1], got[CAP][1]
        # Every real review (mutating and validating) went to the leader and back.
        assert metric(d, follower, "gpu_webhook_relayed_reviews_total") - relayed \
            >= 2 * (CAP + 2)
        assert gpus_admitted(core, ns) == CAP

        # The leader dies: what it admitted is in the API server, nothing else.
        d.replicas[leader].process.kill()
        d.replicas[leader].process.wait(timeout=10)
        status, message = create(core, ns, "while-leaderless")
        assert status == 403
        assert "decided by one webhook replica, and none decides it now" in message, message
        core.delete_namespaced_pod("p0", ns, grace_period_seconds=0)
        wait_until("the other replica to take the Lease over",
                   lambda: "took over" in create(core, ns, f"probe-{time.monotonic_ns()}")[1],
                   timeout=60, every=1.0)
        wait_until("the other replica to decide GPU quota", lambda: deciding(d) == follower,
                   timeout=60, every=0.5)
        # The new leader labels its pod (the killed one's label stays with its pod, which
        # a real cluster deletes or restarts, unlabelled, with the container).
        wait_until("the new leader to label its pod",
                   lambda: f"replica-{follower}" in labelled(core), timeout=30, every=0.3)
        # It counted the pods the dead leader admitted: one GPU is free, not more.
        got = [create(core, ns, f"after{i}")[0] for i in range(3)]
        assert got == [201, 403, 403], got
        assert gpus_admitted(core, ns) == CAP


def test_a_leader_killed_while_admissions_are_in_flight_admits_nothing_past_the_cap(
        leading: Deployment, core: client.CoreV1Api, namespace: NamespaceFactory) -> None:
    d = leading
    # A new replica beside the one that leads now (the last test killed the other).
    replica(d, core)
    wait_ready(d.replicas[-1], d.ca_file)
    wait_until("a replica to decide GPU quota", lambda: deciding(d) is not None,
               timeout=120, every=0.5)
    leader = deciding(d)
    assert leader is not None and leader != len(d.replicas) - 1
    with d.installed(url=f"https://127.0.0.1:{d.replicas[-1].port}"):
        ns = namespace("rush")  # a tenant of its own: the last test's pods stay
        wait_until(f"the replicas to see namespace {ns}",
                   lambda: sees_free_gpus(d, ns, 1), timeout=60, every=0.2)
        statuses: list[int] = []

        def burst(i: int) -> None:
            statuses.append(create(core, ns, f"b{i}")[0])

        threads = [threading.Thread(target=burst, args=(i,)) for i in range(2 * CAP)]
        for i, t in enumerate(threads):
            t.start()
            if i == CAP // 2:
                d.replicas[leader].process.kill()  # mid-burst: some reviews are at it
        for t in threads:
            t.join(timeout=60)
        admitted = gpus_admitted(core, ns)
        assert statuses.count(201) == admitted <= CAP, statuses
        wait_until("the remaining replica to decide GPU quota",
                   lambda: deciding(d) == len(d.replicas) - 1, timeout=120, every=0.5)
        # What the dead leader admitted counts: exactly the rest of the cap is free.
        got = [create(core, ns, f"after{i}")[0] for i in range(CAP - admitted + 1)]
        assert got == [201] * (CAP - admitted) + [403], got
        assert gpus_admitted(core, ns) == CAP
