"""Over-quota work waits its turn (``tenants[].overQuota: wait``), on a simulated GPU
cluster of its own: the real kube-apiserver, kube-scheduler and Job controller, one kwok
node of 4 A100s, two webhook replicas behind a round-robin proxy sharing the ledger.

Tenant ``line`` has 4 GPUs of quota, the node's 4. What a user sees: no pod creation is
refused, never more than the cap runs, every pod runs in the end, a Job's pods start as
soon as the GPUs are free, a gang only whole (a Job's, and a training workload's: a
PyTorchJob, its CRD installed, whose pods the test creates as the training operator
does), nothing lost or over-admitted when the leader replica dies, and no
FailedScheduling from the pods that wait (the scheduler never sees them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2ekit import gpu_webhook, short_id, wait_until
from gpucluster.fixtures import (
    SCHEDULE_TIMEOUT,
    a100_cluster,
    core_api,
    job,
    namespaces,
    own_policy,
    own_sim,
    pod,
    pods,
    started,
)
from gpucluster.sim import SimCluster
from kubernetes import client as k8s

pytestmark = pytest.mark.e2e

GATE = "gpu-webhook.dev/quota"
CAP = 4

CLUSTER = a100_cluster("waiting-sim", "a100-line", 1, CAP)

POLICY = own_policy("waiting-sim", f"""\
    - name: line
      namespaceSelector:
        matchLabels: {{gpu.example.com/tenant: line}}
      quota: {{gpus: {CAP}}}
      overQuota: wait
""")


@pytest.fixture(scope="module")
def line_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    work = tmp_path_factory.mktemp("waiting-sim")
    with started(own_sim(work, CLUSTER, POLICY, replicas=2)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def api(line_sim: SimCluster) -> k8s.CoreV1Api:
    return core_api(line_sim)


PYTORCHJOB_CRD = Path(__file__).resolve().parent / "crds" / "kubeflow.org_pytorchjobs.yaml"


@pytest.fixture(scope="module")
def pytorchjobs(line_sim: SimCluster) -> None:
    """The PyTorchJob CRD, served (no training operator: the test makes its pods)."""
    line_sim.cp.kubectl("apply", "-f", str(PYTORCHJOB_CRD))
    line_sim.cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/pytorchjobs.kubeflow.org")
    wait_until("PyTorchJobs are served", lambda: "pytorchjobs" in line_sim.cp.kubectl(
        "api-resources", "--api-group=kubeflow.org", check=False).stdout, timeout=60)


@pytest.fixture
def ns(line_sim: SimCluster, api: k8s.CoreV1Api) -> Iterator[str]:
    with namespaces(line_sim, api, lambda t: f"{t}-{short_id()}") as make:
        yield make("line")


def gated(p: Any) -> bool:
    return any(g.name == GATE for g in p.spec.scheduling_gates or ())


@dataclass
class Watch:
    """What the namespace's pods did, sampled every 0.2 s from the API server."""

    most_running: int = 0
    first_running: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    ungated: dict[str, float] = field(default_factory=dict)
    samples: list[tuple[float, dict[str, tuple[str, bool]]]] = field(default_factory=list)


@pytest.fixture
def watch(line_sim: SimCluster, ns: str) -> Iterator[Watch]:
    w, stop = Watch(), threading.Event()
    client = core_api(line_sim)

    def sample() -> None:
        while not stop.is_set():
            now = time.monotonic()
            try:
                items = pods(client, ns)
            except Exception:  # a sample lost to a busy API server: the next one counts
                stop.wait(0.2)
                continue
            seen = {p.metadata.name: (p.status.phase, gated(p)) for p in items}
            w.samples.append((now, seen))
            w.most_running = max(w.most_running,
                                 sum(1 for ph, _ in seen.values() if ph == "Running"))
            for name, (ph, g) in seen.items():
                if ph == "Running":
                    w.first_running.setdefault(name, now)
                if ph in ("Succeeded", "Failed"):
                    w.ended.setdefault(name, now)
                if not g:
                    w.ungated.setdefault(name, now)
            stop.wait(0.2)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    yield w
    stop.set()
    t.join(5)


def apply(sim: SimCluster, namespace: str, obj: dict[str, Any]) -> Any:
    return sim.cp.kubectl("apply", "-n", namespace, "-f", "-", check=False,
                          input=yaml.safe_dump(obj))


def bare(name: str) -> dict[str, Any]:
    obj = pod(name, 1)
    obj["spec"]["restartPolicy"] = "Never"
    return obj


def reasons(api: k8s.CoreV1Api, namespace: str) -> list[Any]:
    items: list[Any] = api.list_namespaced_event(namespace).items
    return items


def test_two_jobs_over_the_cap_both_run_in_turn_none_refused(
        line_sim: SimCluster, api: k8s.CoreV1Api, ns: str, watch: Watch) -> None:
    # Two Jobs of 4 one-GPU pods each: twice the tenant's 4 GPUs.
    first = apply(line_sim, ns, job("first", 4, 1, "8s"))
    assert first.returncode == 0, first.stderr
    wait_until("the first Job's pods", lambda: len(pods(api, ns)) >= 4,
               timeout=SCHEDULE_TIMEOUT, every=0.3)
    second = apply(line_sim, ns, job("second", 4, 1, "3s"))
    assert second.returncode == 0, second.stderr  # a warning at most: it waits, not fails
    wait_until("every pod of both Jobs to finish",
               lambda: sum(1 for p in pods(api, ns) if p.status.phase == "Succeeded") >= 8,
               timeout=2 * SCHEDULE_TIMEOUT, every=0.5)
    names = [p.metadata.name for p in pods(api, ns)]
    assert len(names) == 8  # no pod of a refused creation replaced, none lost
    assert watch.most_running <= CAP
    firsts = [n for n in names if n.startswith("first-")]
    seconds = [n for n in names if n.startswith("second-")]
    # The second Job's pods waited behind the gate, and were released together soon
    # after the first's ended (one release round plus the watch's delay, not a backoff).
    assert max(watch.ended.get(n, 0.0) for n in firsts) <= min(
        watch.first_running[n] for n in seconds) + 1.0
    gap = min(watch.first_running[n] for n in seconds) - max(watch.ended[n] for n in firsts)
    assert gap < 10.0, f"the second Job started {gap:.1f}s after the first ended"
    events = reasons(api, ns)
    assert not [e for e in events if e.reason in ("FailedCreate", "FailedScheduling")], [
        (e.reason, e.message) for e in events if e.reason.startswith("Failed")]
    waiting = [e.message for e in events if e.reason == "WaitingForQuota"]
    assert any("in line in tenant line" in m and "gang of 4 pods" in m for m in waiting), waiting
    assert any(e.reason == "QuotaReleased" for e in events)


def test_a_gang_starts_whole_only_once_the_pods_before_it_end(
        line_sim: SimCluster, api: k8s.CoreV1Api, ns: str, watch: Watch) -> None:
    for i in range(2):
        assert apply(line_sim, ns, bare(f"holder-{i}")).returncode == 0
    wait_until("the two holders to run",
               lambda: sum(1 for p in pods(api, ns) if p.status.phase == "Running") == 2,
               timeout=SCHEDULE_TIMEOUT, every=0.3)
    done = apply(line_sim, ns, job("gang", 4, 1, "30s"))
    assert done.returncode == 0, done.stderr
    wait_until("the gang's 4 pods, gated",
               lambda: len([p for p in pods(api, ns, "job-name=gang") if gated(p)]) == 4,
               timeout=SCHEDULE_TIMEOUT, every=0.3)
    wait_until("the leader to have passed over the gang a few rounds",
               lambda: any(e.reason == "WaitingForQuota" and "gang of 4 pods" in e.message
                           for e in reasons(api, ns)), timeout=30, every=0.3)
    # 2 GPUs are free; the gang needs 4: none of it may start.
    assert not [p.metadata.name for p in pods(api, ns, "job-name=gang") if not gated(p)]
    line_sim.cp.kubectl("delete", "pod", "-n", ns, "holder-0", "holder-1", "--wait=false")
    wait_until("the gang to run",
               lambda: sum(1 for p in pods(api, ns, "job-name=gang")
                           if p.status.phase == "Running") == 4,
               timeout=SCHEDULE_TIMEOUT, every=0.3)
    gang = [p.metadata.name for p in pods(api, ns, "job-name=gang")]
    # The sampler lists every 0.2 s: it may not have seen the last gate go yet.
    wait_until("the sampler to see every gang pod ungated",
               lambda: all(n in watch.ungated for n in gang), timeout=30, every=0.1)
    # Never part of the gang beside a holder: each sample with a holder running shows
    # every gang pod still gated.
    for _, seen in watch.samples:
        holders = [n for n, (ph, _) in seen.items() if n.startswith("holder-") and ph == "Running"]
        if holders:
            assert all(seen[n][1] for n in gang if n in seen), seen
    spread = max(watch.ungated[n] for n in gang) - min(watch.ungated[n] for n in gang)
    assert spread < 1.0, f"the gang's gates were removed {spread:.1f}s apart"
    assert watch.most_running <= CAP


def pytorchjob(name: str, workers: int) -> dict[str, Any]:
    """A PyTorchJob of a master and ``workers`` workers, one GPU each."""
    spec = {**bare("t")["spec"], "restartPolicy": "OnFailure"}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": {"spec": spec}},
                "Worker": {"replicas": workers, "template": {"spec": spec}}}}}


def operator_pod(job: dict[str, Any], role: str, i: int) -> dict[str, Any]:
    """A pod of the PyTorchJob as the Kubeflow training operator makes it: owned by the
    job and labelled with its name."""
    meta = job["metadata"]
    obj = bare(f"{meta['name']}-{role}-{i}")
    obj["metadata"]["labels"] = {"training.kubeflow.org/job-name": meta["name"],
                                 "training.kubeflow.org/replica-type": role}
    obj["metadata"]["ownerReferences"] = [{
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": meta["name"],
        "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]
    return obj


def test_a_pytorchjob_over_the_free_gpus_waits_and_its_pods_start_together(
        line_sim: SimCluster, api: k8s.CoreV1Api, ns: str, watch: Watch,
        pytorchjobs: None) -> None:
    for i in range(2):
        assert apply(line_sim, ns, bare(f"holder-{i}")).returncode == 0
    wait_until("the two holders to run",
               lambda: sum(1 for p in pods(api, ns) if p.status.phase == "Running") == 2,
               timeout=SCHEDULE_TIMEOUT, every=0.3)
    # Its gang of 4 needs the 4 GPUs; 2 are free. Admitted, told that its pods wait.
    made = apply(line_sim, ns, pytorchjob("ddp", 3))
    assert made.returncode == 0, made.stderr
    assert "Its pods wait behind the scheduling gate gpu-webhook.dev/quota" in made.stderr
    job = yaml.safe_load(line_sim.cp.kubectl("get", "pytorchjob", "ddp", "-n", ns,
                                             "-o", "yaml").stdout)
    members = [operator_pod(job, "master", 0)] + [operator_pod(job, "worker", i)
                                                  for i in range(3)]
    for obj in members:
        done = apply(line_sim, ns, obj)
        assert done.returncode == 0, done.stderr
        # Even the first two, which would fit alone, wait: taken one by one they would
        # hold GPUs the other two then wait for.
        assert "releases its gang's pods together" in done.stderr, done.stderr
    names = [o["metadata"]["name"] for o in members]
    assert all(gated(p) for p in pods(api, ns) if p.metadata.name in names)
    wait_until("the leader to tell the gang its place", lambda: any(
        e.reason == "WaitingForQuota" and "gang of 4 pods" in e.message
        for e in reasons(api, ns)), timeout=30, every=0.3)
    assert not [p.metadata.name for p in pods(api, ns) if p.metadata.name in names
                and not gated(p)]
    line_sim.cp.kubectl("delete", "pod", "-n", ns, "holder-0", "holder-1", "--wait=false")
    wait_until("the PyTorchJob's 4 pods to run", lambda: sum(
        1 for p in pods(api, ns) if p.metadata.name in names and p.status.phase == "Running"
    ) == 4, timeout=SCHEDULE_TIMEOUT, every=0.3)
    wait_until("the sampler to see every pod of it ungated",
               lambda: all(n in watch.ungated for n in names), timeout=30, every=0.1)
    for _, seen in watch.samples:
        if any(n.startswith("holder-") and ph == "Running" for n, (ph, _) in seen.items()):
            assert all(seen[n][1] for n in names if n in seen), seen
    spread = max(watch.ungated[n] for n in names) - min(watch.ungated[n] for n in names)
    assert spread < 1.0, f"the gang's gates were removed {spread:.1f}s apart"
    assert watch.most_running <= CAP
    assert not [e for e in reasons(api, ns) if e.reason == "FailedScheduling"]


def _leader(sim: SimCluster) -> int:
    assert sim.webhook is not None
    for i, r in enumerate(sim.webhook.replicas):
        log = r.log()
        if log.rfind("leading: this replica") > log.rfind("no longer leading"):
            return i
    raise AssertionError("no replica leads")


def test_killing_the_leader_while_pods_wait_loses_none_and_admits_no_extra(
        line_sim: SimCluster, api: k8s.CoreV1Api, ns: str, watch: Watch) -> None:
    # Last in the module: one replica is left after it.
    for i in range(CAP):
        assert apply(line_sim, ns, bare(f"holder-{i}")).returncode == 0
    wait_until("the holders to run",
               lambda: sum(1 for p in pods(api, ns) if p.status.phase == "Running") == CAP,
               timeout=SCHEDULE_TIMEOUT, every=0.3)
    for i in range(CAP):
        done = apply(line_sim, ns, bare(f"waiter-{i}"))
        assert done.returncode == 0, done.stderr
        assert "waits for GPU quota" in done.stderr
    assert all(gated(p) for p in pods(api, ns) if p.metadata.name.startswith("waiter-"))
    # A developer who may edit the namespace's pods cannot take the GPUs uncharged by
    # removing the gate: only the webhook may.
    cp = line_sim.cp
    cp.kubectl("create", "rolebinding", "jane-edit", "-n", ns, "--clusterrole=edit",
               "--user=jane")
    wait_until("jane's RoleBinding to take effect", lambda: cp.kubectl(
        "auth", "can-i", "patch", "pods", "-n", ns, "--as=jane", check=False
    ).stdout.strip() == "yes", timeout=30, every=0.3)
    removed = cp.kubectl("patch", "pod", "waiter-0", "-n", ns, "--as=jane", "--type=json",
                         "-p", '[{"op": "remove", "path": "/spec/schedulingGates/0"}]',
                         check=False)
    assert removed.returncode != 0
    assert "only the GPU webhook removes the scheduling gate" in removed.stderr
    # The waiting work, as `gpu-webhook status` lists it.
    status = gpu_webhook("status", "--kubeconfig", str(cp.kubeconfig), "--policy",
                         str(line_sim.policy), "--tenant", "line")
    assert f"line: {CAP} pods wait for GPU quota ({CAP} GPUs asked)" in status.stdout
    assert line_sim.webhook is not None and line_sim.webhook.proxy is not None
    leader = line_sim.webhook.replicas[_leader(line_sim)]
    leader.process.kill()
    leader.process.wait(10)
    line_sim.webhook.proxy.remove(leader.port)
    line_sim.cp.kubectl("delete", "pod", "-n", ns, *(f"holder-{i}" for i in range(CAP)),
                        "--wait=false")
    # The other replica takes the Lease over (its 15 s duration) and releases them.
    wait_until("the waiters to run",
               lambda: sum(1 for p in pods(api, ns) if p.metadata.name.startswith("waiter-")
                           and p.status.phase == "Running") == CAP,
               timeout=2 * SCHEDULE_TIMEOUT, every=0.5)
    assert sorted(p.metadata.name for p in pods(api, ns)) == [
        f"waiter-{i}" for i in range(CAP)]
    assert watch.most_running <= CAP
    assert not [e for e in reasons(api, ns) if e.reason == "FailedScheduling"]
