"""GPU-hour budgets and GPU time on a simulated GPU cluster of its own: the real
kube-apiserver, kube-scheduler and controllers, one kwok node of 8 A100s whose pods run
for set durations (``sim.gpu-webhook.dev/run-for``), two webhook replicas behind a
round-robin proxy, the GPUUsage CRD installed, accounting every 5 s.

What a user sees: a tenant whose pods used its GPU-hours gets its next GPU pod refused
(``deny``) or gated (``wait``) with the numbers, and the next period (the test clock
moved a day on) gives them back; ``gpu-webhook usage -o csv`` matches the pods'
lifetimes; and killing the leader, then every replica, in the middle of accounting
never bills a second twice and loses no more than docs/quota.md says.
"""

from __future__ import annotations

import csv
import io
import re
import signal
import ssl
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import yaml
from e2ekit import gpu_webhook, short_id, start_replica, wait_ready, wait_until
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
from gpucluster.sim import BASE, SimCluster
from kubernetes import client as k8s

from webhook.engine.waiting import REASON
from webhook.quota.gputime import bound_at, ended_at

pytestmark = pytest.mark.e2e

INTERVAL = 5  # spec.accounting.intervalSeconds
LIMIT = 0.02  # GPU-hours: 72 GPU-seconds
SETTLE = 15.0  # ClusterState.settle_time() at the default reservation TTL

CLUSTER = a100_cluster("budget-sim", "a100-budget", 1, 8)

POLICY = own_policy("budget-sim", f"""\
    - name: metered
      namespaceSelector:
        matchLabels: {{gpu.example.com/tenant: metered}}
      budget: {{gpuHours: {LIMIT}, period: day}}
    - name: patient
      namespaceSelector:
        matchLabels: {{gpu.example.com/tenant: patient}}
      budget: {{gpuHours: {LIMIT}, period: day, onExhausted: wait}}
    - name: billed
      namespaceSelector:
        matchLabels: {{gpu.example.com/tenant: billed}}
      budget: {{gpuHours: 1000}}
    - name: heavy
      namespaceSelector:
        matchLabels: {{gpu.example.com/tenant: heavy}}
      quota: {{gpus: 1}}
      cohort: {{name: lab, fairShare: {{halfLifeHours: 168}}}}
      overQuota: wait
    - name: light
      namespaceSelector:
        matchLabels: {{gpu.example.com/tenant: light}}
      quota: {{gpus: 1}}
      cohort: {{name: lab, fairShare: {{halfLifeHours: 168}}}}
      overQuota: wait
    - name: lender
      namespaceSelector:
        matchLabels: {{gpu.example.com/tenant: lender}}
      quota: {{gpus: 2}}
      cohort: {{name: lab, fairShare: {{halfLifeHours: 168}}}}
""", spec=f"""\
  accounting: {{intervalSeconds: {INTERVAL}}}
""")


@pytest.fixture(scope="module")
def budget_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    work = tmp_path_factory.mktemp("budget-sim")
    clock = work / "clock-offset"
    clock.write_text("0")
    sim = own_sim(work, CLUSTER, POLICY, replicas=2,
                  webhook_args=["--test-clock-offset-file", str(clock)])
    with started(sim) as cluster:
        cluster.cp.kubectl("apply", "-f", str(BASE / "crd-gpuusage.yaml"), "-f",
                           str(BASE / "crd-gpuquota.yaml"), "-f",
                           str(BASE / "priority-borrowed.yaml"))
        cluster.cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                           "crd/gpuusages.gpu-webhook.dev", "crd/gpuquotas.gpu-webhook.dev")
        # GPU time is counted from its first record (the install): pods before it would
        # be counted from then, not from their start.
        wait_until("the leader to start accounting", lambda: accounted_until(cluster) > 0,
                   timeout=60, every=0.5)
        yield cluster


@pytest.fixture(scope="module")
def api(budget_sim: SimCluster) -> k8s.CoreV1Api:
    return core_api(budget_sim)


@pytest.fixture
def ns(budget_sim: SimCluster, api: k8s.CoreV1Api) -> Iterator[Any]:
    with namespaces(budget_sim, api, lambda t: f"{t}-{short_id()}") as make:
        yield make


def bare(name: str, gpus: int) -> dict[str, Any]:
    """A pod that runs until it is deleted."""
    obj = pod(name, gpus)
    obj["spec"]["restartPolicy"] = "Never"
    return obj


def runs_for(name: str, gpus: int, seconds: int) -> dict[str, Any]:
    """A Job of one pod that runs ``seconds`` (kwok ends a Job's pods on time)."""
    return job(name, 1, gpus, f"{seconds}s")


def apply(sim: SimCluster, namespace: str, obj: dict[str, Any], *flags: str) -> Any:
    return sim.cp.kubectl("apply", "-n", namespace, *flags, "-f", "-", check=False,
                          input=yaml.safe_dump(obj))


def replica_metric(sim: SimCluster, index: int, name: str, tenant: str) -> float | None:
    assert sim.webhook is not None
    ctx = ssl.create_default_context(cafile=str(sim.webhook.ca_file))
    with httpx.Client(verify=ctx, timeout=5) as http:
        text = http.get(f"https://localhost:{sim.webhook.replicas[index].port}/metrics").text
    m = re.search(rf'^{name}{{tenant="{tenant}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def every_replica_sees(sim: SimCluster, tenant: str, hours: float) -> bool:
    """Every replica's budget snapshot shows ``hours`` used by the tenant (it is made
    again every few seconds: one taken while the pods ran shows less)."""
    assert sim.webhook is not None
    used = [replica_metric(sim, i, "gpu_webhook_budget_used_gpu_hours", tenant)
            for i in range(len(sim.webhook.replicas))]
    print(f"{time.time():.3f} {tenant} replicas {used} pods {hours}", flush=True)
    return all(u is not None and u == pytest.approx(hours, abs=1e-6) for u in used)


def held_hours(items: list[Any], until: float | None = None) -> float:
    """GPU-hours the pods held, from their own times (bound to ended), as a user would
    compute them from `kubectl get pods -o yaml`."""
    total = 0.0
    for p in items:
        obj = k8s.ApiClient().sanitize_for_serialization(p)
        start, end = bound_at(obj), ended_at(obj)
        gpus = int(obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        assert end is not None or until is not None, obj["metadata"]["name"]
        assert start is not None
        total += gpus * ((end if end is not None else until or 0.0) - start) / 3600
    return total


def accounted_until(sim: SimCluster) -> float:
    out = sim.cp.kubectl("get", "gpuusages", "-o", "json")
    items = yaml.safe_load(out.stdout)["items"]
    return max((float(i["status"]["accountedUntil"]) for i in items), default=0.0)


def usage_csv(sim: SimCluster, tenant: str) -> float:
    """The tenant's GPU-hours as `gpu-webhook usage -o csv` prints them (today and
    yesterday, UTC: a run across midnight is whole)."""
    today = datetime.now(UTC).date()
    out = gpu_webhook("usage", "--kubeconfig", str(sim.cp.kubeconfig), "--policy",
                      str(sim.policy), "--since", f"{today - timedelta(days=1)}", "--until",
                      f"{today + timedelta(days=1)}", "-o", "csv")
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert rows and set(rows[0]) == {"tenant", "namespace", "user", "product", "gpu_hours",
                                     "cost", "currency"}
    return sum(float(r["gpu_hours"]) for r in rows if r["tenant"] == tenant)


def test_a_spent_budget_refuses_or_gates_and_the_next_period_gives_it_back(
        budget_sim: SimCluster, api: k8s.CoreV1Api, ns: Any) -> None:
    metered, patient = ns("metered"), ns("patient")
    # 4 GPUs for 25 s each: 100 GPU-seconds, over the 72 of each budget.
    for namespace in (metered, patient):
        done = apply(budget_sim, namespace, runs_for("burn", 4, 25))
        assert done.returncode == 0, done.stderr
    wait_until("the burning pods to end", lambda: all(
        p.status.phase == "Succeeded" for n in (metered, patient) for p in pods(api, n))
        and len(pods(api, metered)) == len(pods(api, patient)) == 1,
        timeout=SCHEDULE_TIMEOUT + 30, every=0.5)
    used = held_hours(pods(api, metered))
    assert used > LIMIT
    # Every replica sees what was used (within one refresh of the pods' end: no leader
    # write is needed for that).
    wait_until("every replica to see the budgets spent", lambda: every_replica_sees(
        budget_sim, "metered", used) and every_replica_sees(
        budget_sim, "patient", held_hours(pods(api, patient))), timeout=60, every=0.5)
    refused = apply(budget_sim, metered, bare("next", 1))
    assert refused.returncode != 0
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    words = re.search(r"tenant metered has used ([0-9.]+) of its 0\.02 GPU-hours for "
                      rf"{day} \(UTC\): no new GPU pod starts until GPU-hours come back, when "
                      r"the next period starts, \d{4}-\d\d-\d\d 00:00 UTC\.", refused.stderr)
    assert words is not None, refused.stderr
    assert float(words.group(1)) == round(used, 3)
    assert "[rule quota, tenant metered]" in refused.stderr
    assert len(pods(api, metered)) == 1
    # A tenant that waits: its Job's pod is created, gated, holding nothing.
    assert apply(budget_sim, patient, runs_for("later", 1, 5)).returncode == 0
    wait_until("the waiting pod", lambda: len(pods(api, patient)) == 2, timeout=30)
    [later] = [p for p in pods(api, patient) if p.status.phase != "Succeeded"]
    assert [g.name for g in later.spec.scheduling_gates or ()] == ["gpu-webhook.dev/quota"]
    assert later.metadata.annotations[REASON].startswith(
        "this pod waits for GPU-hours: tenant patient has used")
    # The next day: the budgets are whole again. The metered tenant's pods are admitted,
    # and the leader releases the gated one.
    (budget_sim.work_dir / "clock-offset").write_text(str(24 * 3600))
    wait_until("the metered tenant's next pod to be admitted", lambda: apply(
        budget_sim, metered, bare("next", 1), "--dry-run=server").returncode == 0,
        timeout=30, every=1)
    assert apply(budget_sim, metered, runs_for("next", 1, 5)).returncode == 0
    wait_until("the pods of the next day to end", lambda: sum(
        p.status.phase == "Succeeded" for n in (metered, patient) for p in pods(api, n)) == 4,
        timeout=SCHEDULE_TIMEOUT, every=0.5)
    (budget_sim.work_dir / "clock-offset").write_text("0")
    # What usage says of the day matches the pods' lifetimes (to the rounding of the
    # stored seconds: 1 ms a row and hour), once accounting has passed their ends.
    ends = [ended_at(k8s.ApiClient().sanitize_for_serialization(p))
            for n in (metered, patient) for p in pods(api, n)]
    last = max(e for e in ends if e is not None)
    wait_until("accounting to pass the pods' ends", lambda: accounted_until(budget_sim) > last,
               timeout=SETTLE + 4 * INTERVAL + 30, every=1)
    for tenant, namespace in (("metered", metered), ("patient", patient)):
        assert usage_csv(budget_sim, tenant) == pytest.approx(
            held_hours(pods(api, namespace)), abs=1e-4)
    # What the platform team reads of the day's budget: gpu-webhook status (from the
    # kept GPU time), and the GPUQuota object in the tenant's namespace.
    status = gpu_webhook("status", "--kubeconfig", str(budget_sim.cp.kubeconfig), "--policy",
                         str(budget_sim.policy), "--tenant", "patient")
    used = held_hours(pods(api, patient))
    assert (f"patient: {round(100 * used / LIMIT)} % of its 0.02 GPU-hours for {day} (UTC) "
            f"used ({round(used, 3)} GPU-hours); its new GPU pods are refused or wait"
            ) in status.stdout, status.stdout

    def shown() -> Any:
        out = budget_sim.cp.kubectl("get", "gpuquota", "patient", "-n", patient, "-o", "json",
                                    check=False)
        return yaml.safe_load(out.stdout).get("status", {}).get("budget") \
            if out.returncode == 0 else None

    wait_until("the GPUQuota object to show the budget", lambda: (shown() or {}).get(
        "usedGpuHours") == round(used, 3), timeout=60, every=1)
    assert shown() == {"gpuHours": LIMIT, "usedGpuHours": round(used, 3),
                       "period": f"{day} (UTC)", "percent": round(100 * used / LIMIT)}


def gated(p: Any) -> bool:
    return any(g.name == "gpu-webhook.dev/quota" for g in p.spec.scheduling_gates or ())


def week_of_heavy_use(sim: SimCluster) -> None:
    """GPU time kept for the six days before today: tenant heavy ran 6 GPUs around the
    clock (as the leader would have written it)."""
    today = datetime.now(UTC).date()
    for back in range(1, 7):
        day = today - timedelta(days=back)
        end = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
        sim.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump({
            "apiVersion": "gpu-webhook.dev/v1alpha1", "kind": "GPUUsage",
            "metadata": {"name": f"day-{day:%Y%m%d}",
                         "labels": {"app.kubernetes.io/managed-by": "gpu-webhook"}},
            "status": {"version": "1", "accountedUntil": f"{end.timestamp():.3f}",
                       "rows": [{"tenant": "heavy", "namespace": "heavy-history",
                                 "user": "", "product": "",
                                 "hours": {f"{h:02d}": 6 * 3600.0 for h in range(24)}}]}}))


def borrowing_race(sim: SimCluster, api: k8s.CoreV1Api, ns: Any) -> str:
    """Heavy and light each hold their own GPU and ask 2 more (heavy first): both wait to
    borrow; the lender's 2 GPUs come free when its Job ends, enough for one. Which
    tenant's pod is released."""
    heavy, light, lender = ns("heavy"), ns("light"), ns("lender")
    assert apply(sim, lender, runs_for("hold", 2, 20)).returncode == 0
    for n in (heavy, light):
        assert apply(sim, n, bare("own", 1)).returncode == 0
    wait_until("the own pods and the lender's to run", lambda: all(
        [p.status.phase == "Running" for p in pods(api, n)] == [True]
        for n in (heavy, light, lender)), timeout=SCHEDULE_TIMEOUT, every=0.3)
    for n in (heavy, light):
        asked = apply(sim, n, bare("more", 2))
        assert asked.returncode == 0, asked.stderr
        assert "waits for GPUs to borrow from cohort lab" in asked.stderr
    wait_until("one borrowing pod to be released", lambda: any(
        not gated(api.read_namespaced_pod("more", n)) for n in (heavy, light)),
        timeout=SCHEDULE_TIMEOUT, every=0.3)
    released = [n for n in (heavy, light) if not gated(api.read_namespaced_pod("more", n))]
    assert len(released) == 1
    for n in (heavy, light, lender):  # the next race starts from nothing held
        sim.cp.kubectl("delete", "pods", "--all", "-n", n, "--grace-period=0", "--force")
        sim.cp.kubectl("delete", "jobs", "--all", "-n", n)
    wait_until("the race's pods to be gone", lambda: not any(
        pods(api, n) for n in (heavy, light, lender)), timeout=SCHEDULE_TIMEOUT, every=0.3)
    return released[0].split("-")[0]


def test_with_fair_share_the_light_user_borrows_first_and_without_it_arrival_wins(
        budget_sim: SimCluster, api: k8s.CoreV1Api, ns: Any) -> None:
    week_of_heavy_use(budget_sim)
    assert borrowing_race(budget_sim, api, ns) == "light"
    # Fair share off (the policy file edited; every replica reloads it): the line's
    # order, priority then arrival.
    policy = budget_sim.policy.read_text()
    budget_sim.policy.write_text(policy.replace(", fairShare: {halfLifeHours: 168}", ""))
    try:
        assert budget_sim.webhook is not None
        wait_until("every replica to serve the edited policy", lambda: all(
            r.log().count('"policy loaded"') >= 2 for r in budget_sim.webhook.replicas),
            timeout=30, every=0.5)
        assert borrowing_race(budget_sim, api, ns) == "heavy"
    finally:
        budget_sim.policy.write_text(policy)


def _leader(sim: SimCluster) -> int:
    assert sim.webhook is not None
    for i, r in enumerate(sim.webhook.replicas):
        log = r.log()
        if r.process.poll() is None and log.rfind("leading: this replica") > log.rfind(
                "no longer leading"):
            return i
    raise AssertionError("no replica leads")


def test_killing_the_leader_and_then_every_replica_never_bills_a_second_twice(
        budget_sim: SimCluster, api: k8s.CoreV1Api, ns: Any) -> None:
    # Last in the module: it restarts the replicas.
    billed = ns("billed")
    for i in range(3):
        assert apply(budget_sim, billed, runs_for(f"short-{i}", 2, 30)).returncode == 0
    assert apply(budget_sim, billed, bare("long", 2)).returncode == 0
    wait_until("the pods to run", lambda: sum(
        p.status.phase == "Running" for p in pods(api, billed)) == 4,
        timeout=SCHEDULE_TIMEOUT, every=0.3)
    d = budget_sim.webhook
    assert d is not None and d.proxy is not None
    # The leader dies mid-accounting (SIGKILL: no Lease released): the other takes over
    # and accounts on from the watermark.
    leader = _leader(budget_sim)
    d.replicas[leader].process.send_signal(signal.SIGKILL)
    d.replicas[leader].process.wait(10)
    d.proxy.remove(d.replicas[leader].port)
    killed = time.time()
    wait_until("the other replica to account after the kill",
               lambda: accounted_until(budget_sim) > killed, timeout=60, every=1)
    # Then every replica at once; the long pod is deleted while none runs.
    long_pod = k8s.ApiClient().sanitize_for_serialization(
        api.read_namespaced_pod("long", billed))
    for r in d.replicas:
        if r.process.poll() is None:
            r.process.send_signal(signal.SIGKILL)
            r.process.wait(10)
    down = time.time()
    api.delete_namespaced_pod("long", billed, grace_period_seconds=0)
    deleted = time.time()
    workdir = budget_sim.work_dir / "webhook"
    for i, r in enumerate(list(d.replicas)):
        d.replicas[i] = start_replica(workdir, d.cert_dir, budget_sim.policy,
                                      budget_sim.cp.kubeconfig, i, budget_sim.webhook_args,
                                      port=r.port)
    for r in d.replicas:
        wait_ready(r, d.ca_file)
    d.proxy.route([r.port for r in d.replicas])
    downtime = time.time() - down
    wait_until("the short pods to end", lambda: sum(
        p.status.phase == "Succeeded" for p in pods(api, billed)) == 3,
        timeout=SCHEDULE_TIMEOUT, every=0.5)
    last = max(ended_at(k8s.ApiClient().sanitize_for_serialization(p)) or 0.0
               for p in pods(api, billed))
    wait_until("accounting to pass the pods' ends", lambda: accounted_until(budget_sim) > last,
               timeout=SETTLE + 4 * INTERVAL + 60, every=1)
    start = bound_at(long_pod)
    assert start is not None
    truth = held_hours(pods(api, billed)) + 2 * (deleted - start) / 3600
    counted = usage_csv(budget_sim, "billed")
    # Never above the truth (1 ms of rounding a row and hour); below it by no more than
    # the long pod's 2 GPUs over an interval, the settle time and the downtime.
    assert counted <= truth + 1e-4
    assert counted >= truth - 2 * (INTERVAL + SETTLE + downtime + 1) / 3600
