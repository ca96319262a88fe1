"""Scale run on the simulated GPU cluster (a benchmark, not a test): GPU pods created by
the real Job controller as fast as the API server takes them, with and without the
webhook, on hundreds of kwok GPU nodes, with two webhook replicas sharing the quota ledger.

    .venv/bin/python -m bench.scale                      # 500 GPU nodes, 20 tenants, 200 Jobs
    .venv/bin/python -m bench.scale --gpu-nodes 100 --jobs 100 --pods-per-job 20  # smaller

The cluster is ``tests/e2e/gpucluster/sim.py up`` (the e2e suite's simulated cluster, its
GPU node groups scaled to ``--gpu-nodes``), started in a child process that also runs the
round-robin TCP proxy in front of the two replicas (a Service's part). Rate limits are
lifted as kwokctl's ``--disable-qps-limits`` lifts them (kube-apiserver inflight limits and
priority-and-fairness off, controller-manager and scheduler client QPS 5000), and the Job
controller syncs 50 Jobs at once, so that the API server, not a client's limiter, is what
saturates (and finished pods are kept: the pod garbage collector's default threshold,
12,500, would make it delete pods during the second phase only). The policy is
generated: ``--tenants`` tenants, each with a GPU quota 20 % above what its Jobs can hold
at once (so quota is checked and committed for every pod but is not what paces the run),
and a tight cap on one race namespace per tenant.

Three phases on the one cluster, in this order:

1. ``without``: the webhook configurations are not installed. ``--jobs`` Jobs (spread over
   the tenants' namespaces) of ``--pods-per-job`` pods, ``--parallelism`` at a time, one
   GPU each, each pod completing ``--run-for`` after it runs (kwok). The pods carry the
   toleration and node affinity the webhook would have added, so the scheduler and kwok
   do the same work in both phases.
2. ``with``: the configurations installed, the same Jobs written as a developer writes
   them (a GPU limit, nothing else), in fresh namespaces: every pod goes through mutate,
   validate and a ledger commit.
3. ``race``: per tenant, two Jobs in its race namespace that together want twice its cap,
   for ``--race-seconds``: admissions denied and retried by the Job controller, ledger
   compare-and-swap conflicts between the replicas.

Each phase starts from the same cluster: the last phase's pods and Jobs are deleted first
(``--keep`` keeps them). ``--rounds N`` repeats ``without`` and ``with`` N times in
alternating order (without, with; with, without; ...) and gives the median of the rounds'
ratios; ``--floor`` adds a third condition to every round, ``nothing``: the do-nothing
webhook (``bench/baseline.py``) behind the webhook's own configurations, its Jobs those
of the phase without (the webhook patches a Job's template once and its pods need no
patch): what calling any webhook twice per pod costs. The cluster's CPU with nothing to
do is measured first (``--idle-seconds``), and ``--profile-apiserver SECONDS`` writes a
CPU profile of the API server over each condition's first phase.

Measured: pods created per second (first Job POST to last pod seen), from a watch on pods
(events timestamped as they arrive); admission latency p50/p99 from the API server's
``apiserver_admission_webhook_admission_duration_seconds`` (and the webhook's own
``gpu_webhook_admission_duration_seconds``); over-admits per tenant and race namespace,
found by replaying the watch in resourceVersion order (a pod counts from its ADDED event
until it is Succeeded, Failed or deleted; an over-admit is any moment when the sum
exceeds the cap); ledger conflicts per second and CPU seconds and RSS of each replica and
of every other process (/proc). Results: a table on stdout and
``bench/results/scale-<nodes>.json``. Numbers and what limits them: bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench.servers import Server, gpu_webhook, start_baseline

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "tests" / "e2e" / "gpucluster" / "sim.py"
RESULTS = ROOT / "bench" / "results"
TENANT_LABEL = "gpu.example.com/tenant"
MUTATED = "gpu-webhook.dev/mutated"
GPU = "nvidia.com/gpu"
QUOTA_GATE = "gpu-webhook.dev/quota"  # webhook.engine.waiting.GATE
A100 = "NVIDIA-A100-SXM4-80GB"
TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The rate limits kwokctl lifts with --disable-qps-limits.
UNLIMITED = ["--kube-api-qps=5000", "--kube-api-burst=10000"]
APISERVER_ARGS = ["--max-requests-inflight=0", "--max-mutating-requests-inflight=0",
                  "--enable-priority-and-fairness=false"]


# --------------------------------------------------------------------------- policy


def policy(tenants: int, tenant_gpus: int, race_gpus: int, over_quota: str = "deny"
           ) -> dict[str, Any]:
    """``tenants`` tenants t00.., each with a GPU quota and a tighter cap on t<NN>-race;
    ``over_quota`` ``wait``: their pods over quota wait behind the quota gate."""
    return {
        "apiVersion": "gpu-webhook.dev/v1alpha1",
        "kind": "GPUPolicy",
        "metadata": {"name": "scale-bench"},
        "spec": {
            "mode": "enforce",
            "gpuResources": {"names": [GPU]},
            "products": {"nodeLabel": "nvidia.com/gpu.product",
                         "aliases": {"a100": A100, "h100": "NVIDIA-H100-80GB-HBM3"}},
            "tolerations": [TOLERATION],
            "unassignedNamespaces": "deny",
            "exemptions": {"namespaces": ["kube-system", "gpu-webhook"]},
            "tenants": [{
                "name": t,
                "namespaceSelector": {"matchLabels": {TENANT_LABEL: t}},
                "allowedProducts": ["a100"],
                "maxGpusPerPod": 8,
                "quota": {"gpus": tenant_gpus,
                          "namespaces": {f"{t}-race": {"gpus": race_gpus}}},
                **({"overQuota": "wait"} if over_quota == "wait" else {}),
            } for t in tenant_names(tenants)],
        },
    }


def tenant_names(n: int) -> list[str]:
    return [f"t{i:02d}" for i in range(n)]


def job(name: str, completions: int, parallelism: int, run_for: str,
        premutated: bool) -> dict[str, Any]:
    """A Job of 1-GPU pods. ``premutated``: with the toleration and product affinity the
    webhook would add (for the phase without it)."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "train", "image": "registry.local/train:1",
                        "resources": {"limits": {GPU: "1"}}}],
    }
    if premutated:
        spec["tolerations"] = [TOLERATION]
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": [A100]}]}]}}}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"completions": completions, "parallelism": parallelism,
                 "backoffLimit": 10 * completions,
                 "template": {"metadata": {"annotations": {
                     "sim.gpu-webhook.dev/run-for": run_for}}, "spec": spec}},
    }


# --------------------------------------------------------------------------- cluster


class Kube:
    """The API server as admin, over httpx with the kubeconfig's client certificate."""

    def __init__(self, kubeconfig: Path) -> None:
        conf = yaml.safe_load(kubeconfig.read_text())
        cluster = conf["clusters"][0]["cluster"]
        user = conf["users"][0]["user"]
        ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        ctx.load_cert_chain(user["client-certificate"], user["client-key"])
        self.server = str(cluster["server"])
        self.ssl = ctx
        self.http = httpx.Client(base_url=self.server, verify=ctx, timeout=60)

    def get(self, path: str) -> Any:
        r = self.http.get(path)
        r.raise_for_status()
        return orjson.loads(r.content)

    def post(self, path: str, obj: dict[str, Any], params: dict[str, str] | None = None
             ) -> httpx.Response:
        return self.http.post(path, content=orjson.dumps(obj), params=params,
                              headers={"Content-Type": "application/json"})

    def delete(self, path: str) -> None:
        self.http.delete(path)

    def text(self, path: str) -> str:
        r = self.http.get(path)
        r.raise_for_status()
        return r.text


@dataclass
class Sim:
    process: subprocess.Popen[bytes]
    info: dict[str, Any]
    work: Path


def start_sim(work: Path, gpu_nodes: int, replicas: int, policy_file: Path,
              timeout: float, webhook_args: list[str] | None = None,
              apiserver_args: list[str] | None = None) -> Sim:
    args = [sys.executable, str(SIM), "up", "--work-dir", str(work), "--gpu-nodes",
            str(gpu_nodes), "--replicas", str(replicas), "--no-install",
            "--policy", str(policy_file)]
    args += [f"--webhook-arg={a}" for a in webhook_args or ()]
    args += [f"--apiserver-arg={a}" for a in APISERVER_ARGS + list(apiserver_args or ())]
    for component in ("kube-controller-manager", "kube-scheduler"):
        args += [f"--component-arg={component}={a}" for a in UNLIMITED]
    args += ["--component-arg=kube-controller-manager=--concurrent-job-syncs=50",
             # The pod garbage collector deletes finished pods past 12,500 by default:
             # it would start in the second phase only, and load it alone.
             "--component-arg=kube-controller-manager=--terminated-pod-gc-threshold=1000000"]
    log = open(work / "sim.log", "wb")  # noqa: SIM115 (kept open for the child's life)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log,
                            start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if line.startswith("ready "):
            info: dict[str, Any] = json.loads((work / "sim.json").read_text())
            return Sim(proc, info, work)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"the simulated cluster did not start; see {work / 'sim.log'}:\n"
                     + (work / "sim.log").read_text()[-3000:])


def stop_sim(sim: Sim) -> None:
    if sim.process.poll() is None:
        sim.process.send_signal(signal.SIGTERM)
        try:
            sim.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            sim.process.kill()


# --------------------------------------------------------------------------- watching


@dataclass
class PodEvent:
    at: float      # time.monotonic() when it arrived
    type: str      # ADDED, MODIFIED, DELETED
    namespace: str
    name: str
    phase: str
    gpus: int
    gated: bool = False  # behind the quota gate (overQuota wait): holds no GPU yet


class PodWatch:
    """Every pod event of the cluster in resourceVersion order, on a thread."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.events: list[PodEvent] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.rv = str(kube.get("/api/v1/pods?limit=1")["metadata"]["resourceVersion"])
        self.thread = threading.Thread(target=self._run, daemon=True, name="pod-watch")
        self.thread.start()

    def _run(self) -> None:
        with httpx.Client(base_url=self.kube.server, verify=self.kube.ssl,
                          timeout=httpx.Timeout(60, read=None)) as http:
            while not self.stopping.is_set():
                params = {"watch": "1", "resourceVersion": self.rv, "timeoutSeconds": "3600",
                          "allowWatchBookmarks": "true"}
                try:
                    with http.stream("GET", "/api/v1/pods", params=params) as r:
                        for line in r.iter_lines():
                            if self.stopping.is_set():
                                return
                            if line:
                                self._event(orjson.loads(line))
                except httpx.HTTPError:
                    if self.stopping.is_set():
                        return  # the cluster is being stopped under the watch
                    time.sleep(1.0)  # watched again from the last resourceVersion

    def _event(self, ev: dict[str, Any]) -> None:
        obj = ev["object"]
        meta = obj.get("metadata") or {}
        if "resourceVersion" in meta:
            self.rv = meta["resourceVersion"]
        if ev["type"] not in ("ADDED", "MODIFIED", "DELETED"):
            return
        gpus = 0
        for c in obj["spec"].get("containers") or []:
            gpus += int(((c.get("resources") or {}).get("requests") or {}).get(GPU, 0))
        gated = any(g.get("name") == QUOTA_GATE for g in obj["spec"].get("schedulingGates") or [])
        e = PodEvent(time.monotonic(), ev["type"], meta["namespace"], meta["name"],
                     (obj.get("status") or {}).get("phase", ""), gpus, gated)
        with self.lock:
            self.events.append(e)

    def snapshot(self) -> list[PodEvent]:
        with self.lock:
            return list(self.events)

    def stop(self) -> None:
        self.stopping.set()


def holding(events: list[PodEvent], key: Any) -> dict[str, int]:
    """Replay the events in order: the most GPUs held at once per ``key(namespace)``
    (a pod holds from ADDED, or from the removal of its quota gate, until it is
    Succeeded, Failed or DELETED)."""
    held: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)
    live: dict[tuple[str, str], int] = {}
    for e in events:
        k = key(e.namespace)
        pod = (e.namespace, e.name)
        ended = e.type == "DELETED" or e.phase in ("Succeeded", "Failed")
        if pod not in live and not ended and not e.gated and e.type != "DELETED":
            live[pod] = e.gpus
            held[k] += e.gpus
            peak[k] = max(peak[k], held[k])
        elif pod in live and ended:
            held[k] -= live.pop(pod)
    return dict(peak)


# --------------------------------------------------------------------------- metrics

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Samples = list[tuple[str, dict[str, str], float]]


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def parse_metrics(text: str, prefix: str) -> Samples:
    out: Samples = []
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        m = _SAMPLE.match(line)
        if m:
            out.append((m[1], dict(_LABEL.findall(m[2] or "")), float(m[3])))
    return out


def total(samples: Samples, name: str, **match: str) -> float:
    return sum(v for n, labels, v in samples
               if n == name and all(labels.get(k) == x for k, x in match.items()))


def buckets(samples: Samples, name: str, **match: str) -> dict[float, float]:
    out: dict[float, float] = defaultdict(float)
    for n, labels, v in samples:
        if n == f"{name}_bucket" and all(labels.get(k) == x for k, x in match.items()):
            out[float(labels["le"])] += v
    return dict(out)


def delta(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {le: after[le] - before.get(le, 0.0) for le in after}


def quantile(q: float, hist: dict[float, float]) -> float | None:
    """histogram_quantile over cumulative buckets (linear within a bucket)."""
    if not hist or hist.get(float("inf"), 0.0) <= 0:
        return None
    count = hist[float("inf")]
    rank = q * count
    lower, below = 0.0, 0.0
    for le in sorted(hist):
        if hist[le] >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(hist[le] - below, 1e-12)
        lower, below = le, hist[le]
    return lower


@dataclass
class Proc:
    cpu: float      # user + system seconds
    rss_mib: float
    hwm_mib: float  # peak RSS


def proc_stats(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = {k: float(v.split()[0]) for k, v in
           (line.split(":", 1) for line in status.splitlines() if ":" in line)
           if k in ("VmRSS", "VmHWM")}
    return Proc((int(stat[11]) + int(stat[12])) / CLK_TCK, kib.get("VmRSS", 0) / 1024,
                kib.get("VmHWM", 0) / 1024)


@dataclass
class Snapshot:
    at: float
    apiserver: Samples
    webhooks: list[Samples]
    procs: dict[str, Proc]


class Meter:
    def __init__(self, kube: Kube, sim: Sim) -> None:
        self.kube, self.sim = kube, sim
        ctx = ssl.create_default_context(cafile=sim.info["ca_file"])
        self.http = httpx.Client(verify=ctx, timeout=30)
        self.pids: dict[str, int] = dict(sim.info["pids"])
        self.pids["sim (proxy)"] = sim.process.pid

    def snapshot(self) -> Snapshot:
        api = parse_metrics(self.kube.text("/metrics"), "apiserver_")
        hooks = [parse_metrics(self.http.get(f"https://localhost:{p}/metrics").text,
                               "gpu_webhook_") for p in self.sim.info["webhook_ports"]]
        procs = {n: s for n, pid in self.pids.items() if (s := proc_stats(pid)) is not None}
        return Snapshot(time.monotonic(), api, hooks, procs)


# --------------------------------------------------------------------------- phases


@dataclass
class Phase:
    name: str
    namespaces: list[str]
    pods: int
    seconds: float = 0.0
    created: int = 0
    created_per_s: float = 0.0
    to_complete_s: float | None = None
    refused_creates: float = 0.0
    latency_ms: dict[str, dict[str, float | str | None]] = field(default_factory=dict)
    webhook_latency_ms: dict[str, float | str | None] = field(default_factory=dict)
    peaks: dict[str, int] = field(default_factory=dict)
    caps: dict[str, int] = field(default_factory=dict)
    over_admits: dict[str, int] = field(default_factory=dict)
    conflicts: float = 0.0
    commits: float = 0.0
    procs: dict[str, dict[str, float]] = field(default_factory=dict)
    # The machine's 1-minute load average at the end: the machine is shared, and a
    # load far above its 2 cores says the other jobs took much of the CPU.
    load_average: float = 0.0
    # overQuota wait: pods the leader released, and seconds from a pod's creation to its
    # release (gpu_webhook_release_wait_seconds, every replica's), and from the moment it
    # could fit (quota freed, or its arrival) to its release (..._release_latency_seconds).
    # API requests per pod created, by verb and resource (apiserver_request_total), the
    # ten most frequent: what the API server did per pod besides admitting it.
    requests_per_pod: dict[str, float] = field(default_factory=dict)
    released: float = 0.0
    release_wait_s: dict[str, float | str | None] = field(default_factory=dict)
    release_latency_s: dict[str, float | str | None] = field(default_factory=dict)


def make_namespaces(kube: Kube, names: dict[str, str]) -> None:
    for ns, tenant in names.items():
        r = kube.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": ns,
                                                          "labels": {TENANT_LABEL: tenant}}})
        if r.status_code not in (201, 409):
            raise SystemExit(f"namespace {ns}: {r.status_code} {r.text}")


def post_jobs(kube: Kube, jobs: list[tuple[str, dict[str, Any]]]) -> None:
    for ns, obj in jobs:
        r = kube.post(f"/apis/batch/v1/namespaces/{ns}/jobs", obj)
        if r.status_code != 201:
            raise SystemExit(f"job {ns}/{obj['metadata']['name']}: {r.status_code} {r.text}")


def measure(phase: Phase, before: Snapshot, after: Snapshot, events: list[PodEvent],
            t0: float, caps: dict[str, int], key: Any) -> None:
    ours = [e for e in events if e.namespace in set(phase.namespaces) and e.at >= t0]
    added = [e.at for e in ours if e.type == "ADDED"]
    phase.created = len(added)
    phase.seconds = after.at - before.at
    if added:
        phase.created_per_s = len(added) / max(max(added) - t0, 1e-9)
    phase.refused_creates = (total(after.apiserver, "apiserver_request_total", verb="POST",
                                   resource="pods", code="403")
                             - total(before.apiserver, "apiserver_request_total", verb="POST",
                                     resource="pods", code="403"))
    if phase.created:
        requests: dict[str, float] = defaultdict(float)
        for sign, snap in ((1, after), (-1, before)):
            for n, labels, v in snap.apiserver:
                if n == "apiserver_request_total":
                    sub = labels.get("subresource")
                    what = labels.get("resource", "") + (f"/{sub}" if sub else "")
                    requests[f"{labels.get('verb')} {what}"] += sign * v
        top = sorted(requests.items(), key=lambda kv: -kv[1])[:10]
        phase.requests_per_pod = {k: round(v / phase.created, 2) for k, v in top}
    name = "apiserver_admission_webhook_admission_duration_seconds"
    for kind in ("admit", "validating"):
        h = delta(buckets(after.apiserver, name, type=kind, operation="CREATE"),
                  buckets(before.apiserver, name, type=kind, operation="CREATE"))
        if h.get(float("inf"), 0) > 0:
            phase.latency_ms[kind] = {
                "p50": _ms(quantile(0.5, h), h), "p99": _ms(quantile(0.99, h), h),
                "count": h[float("inf")]}
    own: dict[float, float] = defaultdict(float)
    for b, a in zip(before.webhooks, after.webhooks, strict=True):
        for le, v in delta(buckets(a, "gpu_webhook_admission_duration_seconds"),
                           buckets(b, "gpu_webhook_admission_duration_seconds")).items():
            own[le] += v
        phase.conflicts += (total(a, "gpu_webhook_quota_reservation_conflicts_total")
                            - total(b, "gpu_webhook_quota_reservation_conflicts_total"))
        phase.commits += (total(a, "gpu_webhook_quota_reservations_total")
                          - total(b, "gpu_webhook_quota_reservations_total"))
    waited: dict[float, float] = defaultdict(float)
    late: dict[float, float] = defaultdict(float)
    for b, a in zip(before.webhooks, after.webhooks, strict=True):
        phase.released += (total(a, "gpu_webhook_released_pods_total")
                           - total(b, "gpu_webhook_released_pods_total"))
        for into, name in ((waited, "gpu_webhook_release_wait_seconds"),
                           (late, "gpu_webhook_release_latency_seconds")):
            for le, v in delta(buckets(a, name), buckets(b, name)).items():
                into[le] += v
    if waited.get(float("inf"), 0) > 0:
        phase.release_wait_s = {"p50": quantile(0.5, waited), "p99": quantile(0.99, waited)}
    if late.get(float("inf"), 0) > 0:
        phase.release_latency_s = {"p50": quantile(0.5, late), "p99": quantile(0.99, late)}
    if own.get(float("inf"), 0) > 0:
        phase.webhook_latency_ms = {"p50": _ms(quantile(0.5, own), own),
                                    "p99": _ms(quantile(0.99, own), own)}
    phase.load_average = round(os.getloadavg()[0], 1)
    phase.peaks = holding(ours, key)
    phase.caps = caps
    phase.over_admits = {k: v - caps[k] for k, v in phase.peaks.items()
                         if k in caps and v > caps[k]}
    for n, p in after.procs.items():
        was = before.procs.get(n)
        if was is not None:
            phase.procs[n] = {"cpu_s": round(p.cpu - was.cpu, 1),
                              "cpu_pct": round(100 * (p.cpu - was.cpu) / phase.seconds, 1),
                              "rss_mib": round(p.rss_mib, 1), "peak_rss_mib": round(p.hwm_mib, 1)}


def _ms(seconds: float | None, hist: dict[float, float] | None = None) -> float | str | None:
    """Milliseconds; ``">X"`` when the quantile is past the histogram's last finite bound."""
    if seconds is None:
        return None
    top = max((le for le in hist or {} if le != float("inf")), default=None)
    if top is not None and seconds >= top:
        return f">{top * 1000:g}"
    return round(seconds * 1000, 2)


def profile_apiserver(kube: Kube, seconds: float, into: Path) -> threading.Thread:
    """A CPU profile of the API server (Go's pprof, its ``/debug/pprof/profile``) over
    ``seconds``, written to ``into`` from a thread; read with ``go tool pprof -top``."""
    def run() -> None:
        r = kube.http.get("/debug/pprof/profile", params={"seconds": str(int(seconds))},
                          timeout=seconds + 60)
        if r.status_code == 200:
            into.write_bytes(r.content)
        else:
            print(f"  ! API server profile: {r.status_code} {r.text[:200]}", file=sys.stderr)
    t = threading.Thread(target=run, name="pprof", daemon=True)
    t.start()
    return t


def run_phase(kube: Kube, meter: Meter, watch: PodWatch, phase: Phase,
              jobs: list[tuple[str, dict[str, Any]]], caps: dict[str, int], key: Any,
              timeout: float, window: float | None = None,
              profile: tuple[float, Path] | None = None) -> Phase:
    """Post the Jobs and wait for every pod to be created and to end (or, with
    ``window``, for that many seconds), then measure; with ``profile`` (seconds, a
    directory), the API server's CPU profile of the phase's first seconds too."""
    before = meter.snapshot()
    t0 = time.monotonic()
    post_jobs(kube, jobs)
    profiling = None
    if profile is not None:
        profiling = profile_apiserver(kube, profile[0],
                                      profile[1] / f"apiserver-{phase.name}.pprof")
    namespaces = set(phase.namespaces)
    deadline = t0 + (window if window is not None else timeout)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        if window is not None:
            continue
        evs = [e for e in watch.snapshot() if e.namespace in namespaces and e.at >= t0]
        done = {e.name for e in evs if e.phase == "Succeeded"}
        if len({e.name for e in evs if e.type == "ADDED"}) >= phase.pods \
                and len(done) >= phase.pods:
            phase.to_complete_s = round(time.monotonic() - t0, 1)
            break
    else:
        if window is None:
            print(f"  ! {phase.name}: not complete after {timeout:.0f}s", file=sys.stderr)
    after = meter.snapshot()
    measure(phase, before, after, watch.snapshot(), t0, caps, key)
    if profiling is not None:
        profiling.join()
    return phase


def clear(kube: Kube, watch: PodWatch, namespaces: list[str], timeout: float) -> float:
    """Delete the Jobs and pods a phase made and wait until the watch has seen every pod
    go, so that the next phase starts from the same cluster as this one did (the API
    server's watch cache, etcd's keys, every controller's and the webhook's caches
    without its 10,000 finished pods). Seconds taken."""
    t0 = time.monotonic()
    # The pods first (every Job is complete: none makes another), then the Jobs, which
    # then have no dependents left for the garbage collector.
    for ns in namespaces:
        kube.http.delete(f"/api/v1/namespaces/{ns}/pods", params={"gracePeriodSeconds": "0"})
    for ns in namespaces:
        kube.http.delete(f"/apis/batch/v1/namespaces/{ns}/jobs",
                         params={"propagationPolicy": "Background"})
    wanted = set(namespaces)
    while time.monotonic() - t0 < timeout:
        live: set[tuple[str, str]] = set()
        for e in watch.snapshot():
            if e.namespace in wanted:
                if e.type == "DELETED":
                    live.discard((e.namespace, e.name))
                else:
                    live.add((e.namespace, e.name))
        if not live:
            return time.monotonic() - t0
        time.sleep(1.0)
    raise SystemExit(f"the pods of {sorted(wanted)} were not all deleted in {timeout:.0f}s")


def wait_deciding(sim: Sim, timeout: float = 300.0) -> None:
    """Until a replica decides GPU quota (--quota-commit leader: its hand-over over)."""
    ctx = ssl.create_default_context(cafile=sim.info["ca_file"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for port in sim.info["webhook_ports"]:
            with httpx.Client(verify=ctx, timeout=10) as http:
                text = http.get(f"https://localhost:{port}/metrics").text
            if total(parse_metrics(text, "gpu_webhook_"), "gpu_webhook_quota_deciding") == 1:
                return
        time.sleep(1.0)
    raise SystemExit("no webhook replica started deciding GPU quota")


PROBE = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
         "spec": {"containers": [{"name": "c", "image": "x",
                                  "resources": {"limits": {GPU: "1"}}}]}}


def _kubectl(sim: Sim, *args: str) -> None:
    subprocess.run([str(bin_dir(sim) / "kubectl"), f"--kubeconfig={sim.info['kubeconfig']}",
                    *args], check=True, capture_output=True)


def _called(kube: Kube, probe_ns: str, floor: bool) -> bool:
    """Whether the API server calls the webhook (``floor``: the do-nothing one) for a GPU
    pod: a dry-run pod comes back mutated, or the do-nothing webhook's calls counted by
    the API server go up."""
    def calls() -> float:
        return sum(v for n, labels, v in parse_metrics(kube.text("/metrics"), "apiserver_")
                   if n == "apiserver_admission_webhook_request_total"
                   and labels.get("name", "").endswith(".do-nothing.dev"))
    before = calls() if floor else 0.0
    r = kube.post(f"/api/v1/namespaces/{probe_ns}/pods", PROBE, params={"dryRun": "All"})
    if r.status_code != 201:
        return False
    if floor:
        return calls() > before
    return MUTATED in (r.json()["metadata"].get("annotations") or {})


def configure(kube: Kube, sim: Sim, probe_ns: str, on: bool, floor: str | None = None
              ) -> None:
    """Apply (``on``) or delete the webhook's configurations (or the do-nothing webhook's,
    the file ``floor``) and wait until the API server calls them, or no longer does."""
    _kubectl(sim, "apply" if on else "delete", "-f", floor or sim.info["webhooks"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if _called(kube, probe_ns, floor is not None) == on:
            return
        time.sleep(0.2)
    raise SystemExit("the API server never called the webhook" if on else
                     "the API server went on calling the webhook after its configurations "
                     "were deleted")


def start_floor(sim: Sim, policy_file: Path) -> tuple[Server, str]:
    """The floor of any webhook (``bench.baseline``: a bare server that allows every
    review and changes nothing) on the webhook's serving certificate, and its
    configurations: the webhook's rules and matchConditions under other names, written
    beside the cluster's. Returns the server and the configurations' file.

    Its phase creates the pods of the phase without (the toleration and affinity in the
    Jobs' templates), as the webhook's phase ends up with: the webhook patches each
    Job's template once, and its pods then need no patch."""
    server = start_baseline(Path(sim.info["ca_file"]).parent, sim.work / "floor.log")
    rendered = gpu_webhook("manifests", "--policy", str(policy_file), "--url", server.url,
                           "--ca-file", sim.info["ca_file"])
    configs = sim.work / "floor-webhooks.yaml"
    configs.write_text(rendered.replace("name: gpu-webhook", "name: do-nothing")
                       .replace(".gpu-webhook.dev", ".do-nothing.dev"))
    return server, str(configs)


def bin_dir(sim: Sim) -> Path:
    apiserver = sim.info["pids"]["kube-apiserver"]
    return Path(os.readlink(f"/proc/{apiserver}/exe")).parent


# --------------------------------------------------------------------------- report


def _above_idle(phase: dict[str, Any], idle: dict[str, float], names: Iterable[str]
                ) -> float:
    """CPU ms per pod the processes ``names`` spent in ``phase`` beyond their idle rate."""
    seconds = float(phase["seconds"])
    spent: float = sum(float(phase["procs"][n]["cpu_s"]) - idle.get(n, 0.0) / 100 * seconds
                       for n in names)
    return 1000 * spent / float(phase["created"])


def report(results: dict[str, Any]) -> str:
    lines = [f"scale run: {results['nodes']} nodes ({results['gpu_nodes']} GPU nodes), "
             f"{results['tenants']} tenants, {results['replicas']} webhook replicas"]
    lines.append(f"{'phase':<8} {'pods':>6} {'pods/s':>7} {'to done':>8} {'refused':>8} "
                 f"{'mut p50/p99 ms':>15} {'val p50/p99 ms':>15} {'own p50/p99':>12} "
                 f"{'conflicts/s':>11} {'over-admits':>11} {'load':>5}")
    for p in results["phases"]:
        lat = p["latency_ms"]

        def pair(d: dict[str, Any] | None) -> str:
            return "-" if not d else f"{d.get('p50')}/{d.get('p99')}"

        lines.append(
            f"{p['name']:<8} {p['created']:>6} {p['created_per_s']:>7.1f} "
            f"{p['to_complete_s'] or '-'!s:>8} {p['refused_creates']:>8.0f} "
            f"{pair(lat.get('admit')):>15} {pair(lat.get('validating')):>15} "
            f"{pair(p['webhook_latency_ms']):>12} {p['conflicts'] / p['seconds']:>11.2f} "
            f"{sum(p['over_admits'].values()):>11} {p.get('load_average', 0):>5}")
    for p in results["phases"]:
        if p.get("released"):
            w = p.get("release_wait_s") or {}
            late = p.get("release_latency_s") or {}
            lines.append(f"  {p['name']}: {p['released']:.0f} pods waited, then released; "
                         f"creation to release p50/p99 {_s(w.get('p50'))}/{_s(w.get('p99'))} s;"
                         f" could fit to released p50/p99 {_s(late.get('p50'))}/"
                         f"{_s(late.get('p99'))} s")
    for name, what in (("with", "with / without the webhook"),
                       ("nothing", "the do-nothing webhook / without")):
        ratio = results.get(f"ratio_{name}_over_without")
        if ratio is not None:
            rounds = results.get(f"ratios_by_round_{name}_over_without") or []
            by_round = (" (median of rounds: " + ", ".join(f"{r:.3f}" for r in rounds) + ")"
                        if len(rounds) > 1 else "")
            lines.append(f"pods/s {what}: {ratio:.3f}{by_round}")
    idle: dict[str, float] = results.get("idle_cpu_pct") or {}
    lines.append("CPU ms per pod created (all processes of the cluster; webhook replicas)"
                 + ("; and above idle (the cluster's CPU with nothing to do, "
                    + ", ".join(f"{n} {v:g}%" for n, v in idle.items()) + ")"
                    if idle else "") + ":")
    for p in results["phases"]:
        if p["created"]:
            cpu = sum(s["cpu_s"] for s in p["procs"].values())
            hooks = sum(s["cpu_s"] for n, s in p["procs"].items() if n.startswith("gpu-webhook"))
            line = (f"  {p['name']}: {1000 * cpu / p['created']:.1f} "
                    f"({1000 * hooks / p['created']:.1f})")
            if idle:
                hooks_above = _above_idle(p, idle, [n for n in p["procs"]
                                                    if n.startswith("gpu-webhook")])
                line += (f"; above idle {_above_idle(p, idle, p['procs']):.1f} "
                         f"({hooks_above:.1f}); the API server's "
                         f"{_above_idle(p, idle, ['kube-apiserver']):.1f}")
            lines.append(line)
    lines.append("API requests per pod created (the most frequent):")
    for p in results["phases"]:
        if p.get("requests_per_pod"):
            lines.append(f"  {p['name']}: " + ", ".join(
                f"{k} {v:g}" for k, v in p["requests_per_pod"].items()))
    lines.append("CPU % of one core (and RSS MiB) per process, by phase:")
    for p in results["phases"]:
        lines.append(f"  {p['name']}: " + ", ".join(
            f"{n} {s['cpu_pct']:.0f}% ({s['rss_mib']:.0f})" for n, s in p["procs"].items()))
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line (bench/README.md's commands are parsed with it by a test)."""
    ap = argparse.ArgumentParser(prog="bench.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu-nodes", type=int, default=500)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=200, help="Jobs per phase (without, with)")
    ap.add_argument("--pods-per-job", type=int, default=50)
    ap.add_argument("--parallelism", type=int, default=3)
    ap.add_argument("--run-for", default="1s", help="how long each pod runs (kwok)")
    ap.add_argument("--race-gpus", type=int, default=8, help="each race namespace's cap")
    ap.add_argument("--race-seconds", type=float, default=60.0)
    ap.add_argument("--over-quota", choices=["deny", "wait"], default="deny",
                    help="the tenants' overQuota: refused (deny) or waiting behind the gate")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--quota-commit", choices=["ledger", "leader"], default="ledger",
                    help="how the replicas commit quota (serve --quota-commit)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per phase")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--skip", action="append", default=[], choices=["without", "with", "race"])
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of the phases without and with (and nothing, --floor), in "
                         "alternating order (without, with; with, without; ...): the ratio "
                         "is the median of the rounds'")
    ap.add_argument("--idle-seconds", type=float, default=30.0,
                    help="measure the cluster's CPU for this long before the first phase, "
                         "with nothing to do (0: not measured)")
    ap.add_argument("--floor", action="store_true",
                    help="a third condition in every round: the do-nothing webhook "
                         "(bench.baseline, with the webhook's configurations pointed at "
                         "it): what calling any webhook twice per pod costs the cluster")
    ap.add_argument("--keep", action="store_true",
                    help="keep each phase's Jobs and pods for the next phases (by default "
                         "they are deleted: each phase starts from the same cluster)")
    ap.add_argument("--profile-apiserver", type=float, default=0.0, metavar="SECONDS",
                    help="a CPU profile of the API server over each phase's first SECONDS, "
                         "written beside the results as apiserver-<phase>.pprof")
    return ap


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)

    tenants = tenant_names(args.tenants)
    jobs_per_tenant = -(-args.jobs // args.tenants)
    # 20 % above the most its Jobs can hold at once: checked and committed, never binding.
    tenant_gpus = int(jobs_per_tenant * args.parallelism * 1.2) + 1
    work = Path(tempfile.mkdtemp(prefix="gpu-webhook-scale-"))
    policy_file = work / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy(args.tenants, tenant_gpus, args.race_gpus,
                                                 args.over_quota), sort_keys=False))
    t_start = time.monotonic()
    print(f"starting the simulated cluster ({args.gpu_nodes} GPU nodes) in {work} ...",
          flush=True)
    sim = start_sim(work, args.gpu_nodes, args.replicas, policy_file, timeout=900,
                    webhook_args=[f"--quota-commit={args.quota_commit}"],
                    # The suite's API server runs with profiling off; the flag given
                    # last wins.
                    apiserver_args=["--profiling=true"] if args.profile_apiserver > 0
                    else [])
    results: dict[str, Any] = {"gpu_nodes": args.gpu_nodes, "nodes": sim.info["nodes"],
                               "tenants": args.tenants, "replicas": args.replicas,
                               "args": {k: str(v) for k, v in vars(args).items()},
                               "startup": sim.info["timings"], "phases": []}
    try:
        kube = Kube(Path(sim.info["kubeconfig"]))
        namespaces: dict[str, str] = {}
        for t in tenants:
            namespaces.update({f"{t}-a": t, f"{t}-b": t, f"{t}-race": t})
        make_namespaces(kube, namespaces)
        meter, watch = Meter(kube, sim), PodWatch(kube)
        if args.idle_seconds > 0:
            # What the cluster spends per second doing nothing (500 nodes' leases and
            # statuses, watches, controllers' periodic work): the CPU a phase spends
            # beyond it is what its pods cost.
            print(f"idle: {args.idle_seconds:.0f}s ...", flush=True)
            before = meter.snapshot()
            time.sleep(args.idle_seconds)
            after = meter.snapshot()
            results["idle_cpu_pct"] = {
                n: round(100 * (p.cpu - before.procs[n].cpu) / (after.at - before.at), 1)
                for n, p in after.procs.items() if n in before.procs}

        def spread(suffix: str, premutated: bool, round_: int
                   ) -> list[tuple[str, dict[str, Any]]]:
            prefix = "train" if round_ == 1 else f"train-r{round_}"
            return [(f"{tenants[i % args.tenants]}-{suffix}",
                     job(f"{prefix}-{i:03d}", args.pods_per_job, args.parallelism,
                         args.run_for, premutated)) for i in range(args.jobs)]

        profile = ((args.profile_apiserver, args.out) if args.profile_apiserver > 0
                   else None)
        args.out.mkdir(parents=True, exist_ok=True)

        def tenant_of(ns: str) -> str:
            return ns.split("-", 1)[0]

        pods = args.jobs * args.pods_per_job
        caps = dict.fromkeys(tenants, tenant_gpus)
        phases: list[Phase] = []
        floor = start_floor(sim, policy_file) if args.floor else None
        if floor is not None:
            meter.pids["do-nothing"] = floor[0].process.pid
        # The configurations installed: None, "with" (the webhook's) or "nothing" (the
        # do-nothing webhook's).
        installed: str | None = None

        def switch(to: str | None) -> None:
            nonlocal installed
            if installed == to:
                return
            if installed is not None:
                configure(kube, sim, f"{tenants[0]}-a", False,
                          floor[1] if installed == "nothing" and floor else None)
            if to is not None:
                configure(kube, sim, f"{tenants[0]}-b", True,
                          floor[1] if to == "nothing" and floor else None)
                if to == "with" and args.quota_commit == "leader":
                    wait_deciding(sim)
            installed = to

        # Rounds alternate the order (without, [nothing,] with; with, [nothing,]
        # without; ...): a condition that always ran first or last would run on a
        # cluster of less history, or on a machine other sessions loaded differently.
        conditions = ["without", *(["nothing"] if floor else []), "with"]
        order = [name for r in range(args.rounds)
                 for name in (conditions if r % 2 == 0 else conditions[::-1])
                 if name not in args.skip]
        suffixes = {"without": "a", "with": "b", "nothing": "c"}
        if floor is not None:
            make_namespaces(kube, {f"{t}-c": t for t in tenants})
        # Each condition's phases in round order, for the ratios.
        by_condition: dict[str, list[Phase]] = defaultdict(list)
        try:
            for n, name in enumerate(order):
                round_ = len(by_condition[name]) + 1
                label = name if round_ == 1 else f"{name}-{round_}"
                switch(None if name == "without" else name)
                suffix = suffixes[name]
                print(f"phase {label}: {args.jobs} Jobs, {pods} pods, "
                      f"{ {'without': 'no webhook', 'with': 'webhook'}.get(name, name)} ...",
                      flush=True)
                phase = run_phase(
                    kube, meter, watch, Phase(label, [f"{t}-{suffix}" for t in tenants], pods),
                    spread(suffix, name != "with", round_),
                    caps if name == "with" else {}, tenant_of, args.timeout,
                    profile=profile if round_ == 1 else None)
                phases.append(phase)
                by_condition[name].append(phase)
                if not args.keep and (n + 1 < len(order) or "race" not in args.skip):
                    took = clear(kube, watch, [f"{t}-{suffix}" for t in tenants],
                                 args.timeout)
                    print(f"  its Jobs and pods deleted ({took:.0f}s)", flush=True)
            switch("with")
        finally:
            if floor is not None:
                floor[0].stop()
        if "race" not in args.skip:
            print(f"phase race: {args.race_seconds:.0f}s, 2 Jobs per race namespace wanting "
                  f"2 x {args.race_gpus} GPUs against a cap of {args.race_gpus} ...", flush=True)
            race_jobs = [(f"{t}-race", job(f"race-{j}", 10_000, args.race_gpus, args.run_for,
                                           False)) for t in tenants for j in range(2)]
            race = run_phase(kube, meter, watch, Phase("race", [f"{t}-race" for t in tenants],
                                                       0),
                             race_jobs, {f"{t}-race": args.race_gpus for t in tenants},
                             lambda ns: ns, args.timeout, window=args.race_seconds)
            phases.append(race)
        watch.stop()
        results["phases"] = [vars(p) for p in phases]
        # Round by round, with (and the do-nothing webhook) over without; the median of the
        # rounds is the run's figure.
        for name, key in (("with", "ratio_with_over_without"),
                          ("nothing", "ratio_nothing_over_without")):
            ratios = [a.created_per_s / b.created_per_s
                      for a, b in zip(by_condition[name], by_condition["without"],
                                      strict=False)
                      if b.created_per_s]
            if ratios:
                results[key.replace("ratio_", "ratios_by_round_")] = [round(r, 3)
                                                                     for r in ratios]
                results[key] = statistics.median(ratios)
        results["total_s"] = round(time.monotonic() - t_start, 1)
    finally:
        stop_sim(sim)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"scale-{args.gpu_nodes}.json"
    out.write_text(json.dumps(results, indent=1))
    print(report(results))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
