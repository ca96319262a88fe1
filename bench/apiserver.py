"""What the webhook adds to a pod creation, measured through a real kube-apiserver.

    .venv/bin/python -m bench.apiserver             # part of `make bench` (~10 min)
    .venv/bin/python -m bench.apiserver --quick     # every part briefly (~1 min): a smoke run
    .venv/bin/python -m bench.apiserver --help

A real etcd + kube-apiserver (v1.37.2, ``tests/e2e/controlplane``) and, in alternating
rounds, one admission condition at a time:

- ``none``: no webhook configured;
- ``nothing``: the do-nothing webhook (``bench/baseline.py``: uvicorn with the webhook's
  TLS context, reads the review and allows it) registered exactly as ours is (the same
  rendered configurations, mutating and validating, matchConditions included);
- ``patching``: the same with ``--patch``: it answers each pod's mutating review with a
  patch of the shape ours returns, made without a policy, so what it adds over
  ``nothing`` is what the API server spends applying a patch (the floor of any webhook
  that changes pods, Kyverno's included);
- ``ours``: ``gpu-webhook serve`` connected to the cluster (pod and namespace watches,
  the quota ledger in ConfigMaps), its configurations from ``gpu-webhook manifests``;
- ``kyverno``: Kyverno v1.19.0 run out of cluster (``tools/kyverno.sh`` builds it; left
  out with ``--quick`` and when it is not built), with a ClusterPolicy doing the same
  stateless work: GPU requests must equal limits, GPU pods get the GPU toleration and a
  node affinity for the GPU product.

Clients create pods (``POST /api/v1/namespaces/NS/pods``, dry-run and real) one at a
time and from 8 and 32 concurrent clients, for ``--seconds`` per run, from a realistic
mix: pods of a ReplicaSet and of a Job (one shape each, named by ``generateName``),
unique pods, non-GPU pods (one tolerating the GPU taint, so the configurations send it),
pods our policy denies, and, in real runs, a quota ledger commit for every GPU pod
admitted by ours. Real pods are deleted after each run.

Reported per condition and load: the added p50/p99 over ``none`` in the same round
(client timings; medians over rounds) and the ratio ours/do-nothing; and from the API
server's own ``apiserver_admission_webhook_admission_duration_seconds`` the mean time
per webhook call (its buckets, 5/25/100 ms, are too coarse for percentiles at these
latencies; its interpolated p50/p99 are reported beside the mean for what they are
worth). Results: a table on stdout and ``bench/results/apiserver.json``.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import mix
from bench.scale import Samples, buckets, delta, parse_metrics, quantile, total
from bench.servers import gpu_webhook

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from controlplane.cluster import ControlPlane, build_binaries, free_port  # noqa: E402

TENANT_LABEL = "gpu.example.com/tenant"
TENANTS = ["vision", "speech", "llm", "rl"]
LEDGER_NAMESPACE = "gpu-webhook"
# The leader-decides webhook's Lease, apart from the ledger webhook's (which leads its own).
LEADER_NAMESPACE = "gpu-webhook-leader"
METRIC = "apiserver_admission_webhook_admission_duration_seconds"
CONDITIONS = ("none", "nothing", "patching", "ours", "leader", "relayed", "kyverno")
OWN = ("ours", "leader", "relayed")  # the conditions that are a gpu-webhook serve
FLOORS = ("nothing", "patching")  # bench.baseline, without and with --patch
# Each ratio reported: (condition, the condition it is divided by).
RATIOS = [*((mine, other) for mine in OWN for other in (*FLOORS, "kyverno")),
          ("patching", "nothing")]
KYVERNO_TOOL = ROOT / "tools" / "kyverno.sh"
KYVERNO_NAMESPACE = "kyverno"
KYVERNO_PORT_ENV = "GPU_WEBHOOK_BENCH_KYVERNO_PORT"


# --------------------------------------------------------------------------- the policy


def policy() -> dict[str, Any]:
    """Four tenants, one namespace each, each with a GPU quota no run can reach (so every
    GPU pod is checked and, when real, committed to its tenant's ledger), at most 8 GPUs
    per pod (the denials), pinned to a product by toleration and node affinity."""
    return {
        "apiVersion": "gpu-webhook.dev/v1alpha1", "kind": "GPUPolicy",
        "metadata": {"name": "bench-apiserver"},
        "spec": {
            "mode": "enforce",
            "gpuResources": {"names": ["nvidia.com/gpu"]},
            "products": {"nodeLabel": "nvidia.com/gpu.product",
                         "aliases": {"a100": "NVIDIA-A100-SXM4-80GB"}},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "nonGpuPodsToleratingGpuTaints": "strip",
            "unassignedNamespaces": "deny",
            "exemptions": {"namespaces": [LEDGER_NAMESPACE, KYVERNO_NAMESPACE]},
            "tenants": [{"name": t, "namespaces": [f"bench-{t}"],
                         "allowedResources": ["nvidia.com/gpu"], "allowedProducts": ["a100"],
                         "defaultProduct": "a100", "maxGpusPerPod": 8,
                         "quota": {"gpus": 1_000_000}} for t in TENANTS],
        },
    }


KYVERNO_POLICY = Path(__file__).with_name("kyverno-policy.yaml")


# --------------------------------------------------------------------------- the mix


def _gpu_pod(gpus: int, **meta: Any) -> dict[str, Any]:
    spec = mix.pod_spec([mix.container("trainer", {"nvidia.com/gpu": gpus})])
    # As a developer writes it: a GPU limit only (the webhook completes the request), and
    # no defaulted fields the API server adds itself after mutation.
    del spec["containers"][0]["resources"]["requests"]
    spec["volumes"] = spec["volumes"][:1]
    spec["containers"][0]["volumeMounts"] = spec["containers"][0]["volumeMounts"][:1]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _owned(kind: str, api: str, name: str, uid: str, labels: dict[str, str],
           gpus: int) -> dict[str, Any]:
    return _gpu_pod(gpus, generateName=f"{name}-", labels=labels, ownerReferences=[{
        "apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True,
        "blockOwnerDeletion": True}])


@dataclass(frozen=True)
class Item:
    kind: str  # what the mix calls it
    tenant: str
    body: Callable[[int], bytes]  # request number -> the Pod's JSON


def _fixed(obj: dict[str, Any]) -> Callable[[int], bytes]:
    data = json.dumps(obj).encode()
    return lambda n: data


def _unique(tenant: str) -> Callable[[int], bytes]:
    def body(n: int) -> bytes:
        pod = _gpu_pod(1 + n % 4, generateName=f"notebook-{n}-",
                       labels={"app": "notebook", "user": f"u{n % 97}"})
        pod["spec"]["containers"][0]["image"] = f"registry.example.com/ml/nb:{n}"
        return json.dumps(pod).encode()
    return body


def items() -> list[Item]:
    """The realistic mix, in the order requests are drawn (round-robin over it)."""
    out: list[Item] = []
    for i, t in enumerate(TENANTS):
        rs = _owned("ReplicaSet", "apps/v1", f"serve-{t}-6d4cf56db7",
                    f"00000000-0000-4000-8000-00000000010{i}",
                    {"app": "serve", "pod-template-hash": "6d4cf56db7"}, 1)
        job = _owned("Job", "batch/v1", f"train-{t}", f"00000000-0000-4000-8000-00000000020{i}",
                     {"batch.kubernetes.io/job-name": f"train-{t}",
                      "batch.kubernetes.io/controller-uid":
                          f"00000000-0000-4000-8000-00000000020{i}",
                      "job-name": f"train-{t}"}, 2)
        denied = _gpu_pod(16, generateName="too-big-")  # past maxGpusPerPod (8)
        tolerating = {"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"generateName": "etl-"},
                      "spec": {"containers": [{"name": "etl", "image": "etl:1"}],
                               "tolerations": [{"key": "nvidia.com/gpu",
                                                "operator": "Exists"}]}}
        plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-"},
                 "spec": {"containers": [{"name": "web", "image": "web:1"}]}}
        out += [Item("replicaset", t, _fixed(rs)), Item("job", t, _fixed(job)),
                Item("replicaset", t, _fixed(rs)), Item("unique", t, _unique(t)),
                Item("job", t, _fixed(job)), Item("non-gpu-tolerating", t, _fixed(tolerating)),
                Item("replicaset", t, _fixed(rs)), Item("job", t, _fixed(job)),
                Item("non-gpu", t, _fixed(plain)), Item("denied", t, _fixed(denied))]
    return out


# --------------------------------------------------------------------------- clients


class Client:
    """One keep-alive HTTPS connection to the API server with admin credentials."""

    def __init__(self, cp: ControlPlane) -> None:
        host, port = cp.server.removeprefix("https://").split(":")
        ctx = ssl.create_default_context(cafile=str(cp.ca_cert))
        ctx.load_cert_chain(str(cp.admin_cert), str(cp.admin_key))
        self.conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                r = self.conn.getresponse()
                return r.status, r.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()  # the server closed a kept-alive connection: once more
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)  # seconds, every request
    statuses: dict[int, int] = field(default_factory=dict)
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0


def load(cp: ControlPlane, mixed: list[Item], clients: int, seconds: float, dry_run: bool
         ) -> Run:
    """``clients`` threads, each on its own connection, creating pods from the mix for
    ``seconds`` (closed loop: each sends its next request when the last is answered)."""
    counter = itertools.count()
    lock = threading.Lock()
    run = Run()
    qs = "?dryRun=All" if dry_run else ""
    stop = time.monotonic() + seconds
    errors: list[str] = []
    conns = [Client(cp) for _ in range(clients)]

    def worker(c: Client) -> None:
        lat: list[tuple[str, int, float]] = []
        try:
            while time.monotonic() < stop:
                n = next(counter)
                item = mixed[n % len(mixed)]
                body = item.body(n)
                t0 = time.perf_counter()
                status, reply = c.request("POST", f"/api/v1/namespaces/bench-{item.tenant}"
                                                  f"/pods{qs}", body)
                lat.append((item.kind, status, time.perf_counter() - t0))
                if status not in (201, 403):
                    errors.append(f"{item.kind}: {status} {reply[:300]!r}")
                    return
        except Exception as exc:  # reported below, never a silent hole in the data
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            c.close()
            with lock:
                for kind, status, s in lat:
                    run.latencies.append(s)
                    run.statuses[status] = run.statuses.get(status, 0) + 1
                    run.by_kind.setdefault(kind, []).append(s)

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.seconds = time.monotonic() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} client errors, first: {errors[0]}")
    return run


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


# --------------------------------------------------------------------------- conditions


def _kubectl(cp: ControlPlane, *args: str, input: str | None = None) -> str:
    return str(cp.kubectl(*args, input=input).stdout)


def webhook_calls(cp: ControlPlane) -> dict[str, float]:
    """Calls so far per webhook name, from the API server's admission metric."""
    _, text = cp.get_raw("/metrics", timeout=30)
    out: dict[str, float] = {}
    for name, labels, v in parse_metrics(text, METRIC + "_count"):
        if name == METRIC + "_count":
            out[labels["name"]] = out.get(labels["name"], 0.0) + v
    return out


def _probe(cp: ControlPlane) -> set[str]:
    """The webhooks a dry-run GPU pod creation calls now and that answer it (a webhook
    whose call failed, e.g. one still without its serving certificate, is left out)."""
    before = webhook_calls(cp)
    client = Client(cp)
    try:
        body = json.dumps(_gpu_pod(1, generateName="probe-")).encode()
        status, _ = client.request(
            "POST", f"/api/v1/namespaces/bench-{TENANTS[0]}/pods?dryRun=All", body)
    finally:
        client.close()
    after = webhook_calls(cp)
    if status not in (201, 403):
        return set()
    return {n for n, v in after.items() if v > before.get(n, 0.0)}


def wait_calls(cp: ControlPlane, ok: Callable[[set[str]], bool], what: str,
               timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    called: set[str] = set()
    while time.monotonic() < deadline:
        called = _probe(cp)
        if ok(called):
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what} (a pod creation calls {sorted(called)})")


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=25)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def cpu_seconds(self) -> float:
        try:
            with open(f"/proc/{self.process.pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn(name: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    with open(log, "ab") as out:
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return Proc(name, p, log)


def wait_https(proc: Proc, port: int, timeout: float = 90.0) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.process.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.process.returncode}:\n"
                               f"{proc.log.read_text(errors='replace')[-3000:]}")
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
        try:
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            c.close()
        time.sleep(0.3)
    raise RuntimeError(f"{proc.name} not ready on :{port} after {timeout:.0f} s:\n"
                       f"{proc.log.read_text(errors='replace')[-3000:]}")


class Conditions:
    """The servers of every condition, started once; one condition installed at a time."""

    def __init__(self, cp: ControlPlane, work: Path, kyverno_dir: Path | None) -> None:
        self.cp, self.work = cp, work
        self.policy = work / "policy.yaml"
        self.policy.write_text(yaml.safe_dump(policy()))
        self.cert_dir = work / "certs"
        gpu_webhook("certs", "--out", str(self.cert_dir), "--dns", "localhost",
                    "--ip", "127.0.0.1")
        self.procs: dict[str, Proc] = {}
        self.configs: dict[str, str] = {}
        self.names: dict[str, set[str]] = {}
        self.kyverno_dir = kyverno_dir
        self.current = "none"
        self.ports: dict[str, int] = {}  # the gpu-webhook conditions' ports

    def _serve(self, condition: str, log: str, namespace: str, *flags: str) -> int:
        """Start ``gpu-webhook serve`` for ``condition``, its configurations rendered
        for it; its port."""
        port: int = free_port()
        self.procs[condition] = spawn(f"gpu-webhook ({condition})", [
            str(Path(sys.executable).with_name("gpu-webhook")), "serve", "--host", "127.0.0.1",
            "--port", str(port), "--cert-dir", str(self.cert_dir), "--policy", str(self.policy),
            "--kubeconfig", str(self.cp.kubeconfig), "--namespace", namespace, *flags],
            self.work / log)
        wait_https(self.procs[condition], port)
        self.configs[condition] = self._render(f"https://127.0.0.1:{port}")
        self.names[condition] = _hook_names(self.configs[condition])
        return port

    def start(self, conditions: list[str]) -> None:
        """Start the servers of ``conditions`` and no others: each gpu-webhook watches
        every pod the runs create, so one left running beside another's runs would be
        measured with it."""
        if "ours" in conditions:
            self.ports["ours"] = self._serve("ours", "ours.log", LEDGER_NAMESPACE)
        if {"leader", "relayed"} & set(conditions):
            # The same webhook deciding quota in its memory as the leader replica
            # (--quota-commit leader: no ledger write), one replica: the relay's hop is
            # not in it. Measured once it decides (after its hand-over).
            self.ports["leader"] = self._serve("leader", "leader.log", LEADER_NAMESPACE,
                                               "--quota-commit", "leader")
        if "relayed" in conditions:
            # A second replica of it, started after the first took the Lease: the API
            # server calls this one, which relays each real review to the leader (the
            # hop a Service's other endpoints add).
            self.ports["relayed"] = self._serve("relayed", "relaying.log", LEADER_NAMESPACE,
                                                "--quota-commit", "leader")
        for floor in FLOORS:
            if floor not in conditions:
                continue
            port = free_port()
            self.procs[floor] = spawn(f"do-{floor}", [
                sys.executable, "-m", "bench.baseline", "--host", "127.0.0.1", "--port",
                str(port), "--cert-dir", str(self.cert_dir),
                *(["--patch"] if floor == "patching" else [])], self.work / f"{floor}.log")
            wait_https(self.procs[floor], port)
            config = self._render(f"https://127.0.0.1:{port}").replace(
                "name: gpu-webhook", f"name: do-{floor}").replace(
                ".gpu-webhook.dev", f".do-{floor}.dev")
            self.configs[floor] = config
            self.names[floor] = _hook_names(config)
        if self.kyverno_dir is not None:
            self._start_kyverno(self.kyverno_dir)

    def _render(self, url: str) -> str:
        return gpu_webhook("manifests", "--policy", str(self.policy), "--url", url,
                           "--ca-file", str(self.cert_dir / "ca.pem"))

    def _start_kyverno(self, d: Path) -> None:
        cp = self.cp
        for crd in sorted((d / "crds").rglob("*.yaml")):
            _kubectl(cp, "apply", "--server-side", "-f", str(crd))
        _kubectl(cp, "create", "namespace", KYVERNO_NAMESPACE)
        port = int(os.environ.get(KYVERNO_PORT_ENV, free_port()))
        self.procs["kyverno"] = spawn("kyverno", [
            str(d / "kyverno"), f"--kubeconfig={cp.kubeconfig}",
            f"--serverIP=127.0.0.1:{port}", f"--webhookServerPort={port}",
            # The Secrets its certificate controller keeps its CA and serving pair in
            # (the Helm chart's names); it generates both and puts the CA in caBundle.
            "--caSecretName=kyverno-svc.kyverno.svc.kyverno-tls-ca",
            "--tlsSecretName=kyverno-svc.kyverno.svc.kyverno-tls-pair",
            f"--metricsPort={free_port()}", "--disableMetrics=true",
            "--admissionReports=false", "--v=1", "--disableLogColor",
            "--protectManagedResources=false"], self.work / "kyverno.log",
            env={"KYVERNO_NAMESPACE": KYVERNO_NAMESPACE, "KYVERNO_SERVICEACCOUNT_NAME": "kyverno",
                 "KYVERNO_DEPLOYMENT": "kyverno", "KYVERNO_POD_NAME": "kyverno-bench",
                 "INIT_CONFIG": "kyverno", "METRICS_CONFIG": "kyverno-metrics"})
        self.kyverno_port = port

    def install(self, condition: str) -> None:
        """Take the current condition out and put ``condition`` in, then wait until a pod
        creation calls exactly its webhooks."""
        cp = self.cp
        if self.current in (*OWN, *FLOORS):
            _kubectl(cp, "delete", "--wait=true", "-f", "-", input=self.configs[self.current])
        elif self.current == "kyverno":
            _kubectl(cp, "delete", "clusterpolicy", "gpu-pods", "--wait=true")
        self.current = "none"
        wait_calls(cp, lambda called: not called, "no webhook to be called")
        if condition in (*OWN, *FLOORS):
            _kubectl(cp, "apply", "-f", "-", input=self.configs[condition])
            names = self.names[condition]
            # Pods go through its pod webhooks, not the ones for claims or scale requests.
            wait_calls(cp, lambda called: len(called) >= 2 and called <= names,
                       f"the {condition} webhooks")
        elif condition == "kyverno":
            _kubectl(cp, "apply", "-f", str(KYVERNO_POLICY))
            kyverno = self.procs["kyverno"]

            def kyverno_called(called: set[str]) -> bool:
                if kyverno.process.poll() is not None:
                    raise RuntimeError(f"kyverno exited with {kyverno.process.returncode}:\n"
                                       + kyverno.log.read_text(errors="replace")[-3000:])
                return bool(called) and all("kyverno" in n for n in called)

            wait_calls(cp, kyverno_called, "Kyverno's webhooks", timeout=300)
            check_kyverno(cp)
        self.current = condition

    def wait_deciding(self, timeout: float = 180.0) -> None:
        """Until the leader-decides webhook decides quota (its hand-over is over)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if total(self.samples("leader") or [], "gpu_webhook_quota_deciding") == 1.0:
                return
            time.sleep(1.0)
        raise RuntimeError("the leader-decides webhook did not start deciding quota")

    def samples(self, condition: str) -> Samples | None:
        """A gpu-webhook condition's own metrics (its /metrics); None for the others."""
        port = self.ports.get(condition)
        if port is None:
            return None
        ctx = ssl.create_default_context(cafile=str(self.cert_dir / "ca.pem"))
        c = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=30)
        try:
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
        finally:
            c.close()
        return parse_metrics(text, "gpu_webhook_")

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()


def ours_counted(b: Samples, a: Samples) -> dict[str, float]:
    """Between two scrapes of ours: mutating reviews answered and those answered with a
    reused decision (webhook.server.web.reuse)."""
    def moved(name: str, **match: str) -> float:
        return total(a, name, **match) - total(b, name, **match)

    return {"mutating": moved("gpu_webhook_admission_requests_total", webhook="mutate"),
            "reused": moved("gpu_webhook_mutating_decisions_reused_total")}


def ours_phases(b: Samples, a: Samples) -> dict[str, Any]:
    """Between two scrapes of ours, where each webhook's review time went: its own
    histogram (mean, p50, p99 of gpu_webhook_admission_duration_seconds, from its first
    byte to its reply) and, per review, the mean ms of parse and decide
    (gpu_webhook_admission_phase_seconds); for the validating webhook, of decide, the
    wait for the quota commit (ask to answer; of that, queued: waiting for the tenant's
    commit to start) and ``engine``, the rest; and per ledger write, what it carried
    (admissions per write) and the mean ms of its read, decide, write and back-off."""
    def moved(name: str, **match: str) -> float:
        return total(a, name, **match) - total(b, name, **match)

    def phase(webhook: str, name: str, what: str = "sum") -> float:
        return moved(f"gpu_webhook_admission_phase_seconds_{what}", webhook=webhook,
                     phase=name)

    out: dict[str, Any] = {}
    for webhook in ("mutate", "validate"):
        n = moved("gpu_webhook_admission_duration_seconds_count", webhook=webhook)
        if n <= 0:
            continue
        hist = delta(buckets(a, "gpu_webhook_admission_duration_seconds", webhook=webhook),
                     buckets(b, "gpu_webhook_admission_duration_seconds", webhook=webhook))
        e: dict[str, Any] = {
            "reviews": n,
            "mean_ms": _ms3(moved("gpu_webhook_admission_duration_seconds_sum",
                                  webhook=webhook) / n),
            "p50_ms": _ms3(quantile(0.5, hist)), "p99_ms": _ms3(quantile(0.99, hist)),
            "parse_ms": _ms3(phase(webhook, "parse") / n),
            "decide_ms": _ms3(phase(webhook, "decide") / n)}
        if webhook == "validate":
            e["commit_ms"] = _ms3(phase("ledger", "commit") / n)
            e["queued_ms"] = _ms3(phase("ledger", "queued") / n)
            e["engine_ms"] = round(max(e["decide_ms"] - e["commit_ms"], 0.0), 3)
            writes = phase("ledger", "write", "count")
            e["ledger_writes"] = writes
            e["admissions_per_write"] = (round(phase("ledger", "commit", "count") / writes, 2)
                                         if writes else None)
            for name in ("read", "decide", "write", "backoff"):
                count = phase("ledger", name, "count")
                e[f"per_write_{name}_ms"] = (_ms3(phase("ledger", name) / count) if count
                                             else 0.0)
        out[webhook] = e
    return out


def _ms3(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 3)


def check_kyverno(cp: ControlPlane) -> None:
    """Kyverno does the work it is compared on: a GPU pod comes back with the GPU
    toleration and product affinity, and a GPU request unlike its limit is refused."""
    # (Both webhooks' requests = limits rule matters for a pod with a limit only, which
    # they complete; unequal halves never get past the API server's validation.)
    client = Client(cp)
    path = f"/api/v1/namespaces/bench-{TENANTS[0]}/pods?dryRun=All"
    try:
        status, body = client.request(
            "POST", path, json.dumps(_gpu_pod(1, generateName="check-")).encode())
        spec = json.loads(body).get("spec", {})
        if status != 201 or not any(t.get("key") == "nvidia.com/gpu"
                                    for t in spec.get("tolerations", [])) \
                or "nodeAffinity" not in spec.get("affinity", {}):
            raise RuntimeError(f"Kyverno did not mutate the GPU pod: {status} {body[:500]!r}")
        wrong = _gpu_pod(2, generateName="check-")
        wrong["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": 1}
        status, body = client.request("POST", path, json.dumps(wrong).encode())
        # The API server's own validation refuses it too (422: an extended resource's
        # request must equal its limit), after mutating admission, before validating.
        if status not in (403, 422):
            raise RuntimeError(f"a GPU request unlike its limit was admitted: {status}")
    finally:
        client.close()


def _hook_names(manifests: str) -> set[str]:
    """The webhooks of the configurations that pods go through (not the scale one)."""
    return {h["name"] for doc in yaml.safe_load_all(manifests) if doc
            for h in doc.get("webhooks", []) if not h["name"].startswith("scale.")}


# --------------------------------------------------------------------------- one run


def apiserver_hist(cp: ControlPlane) -> dict[str, Any]:
    _, text = cp.get_raw("/metrics", timeout=30)
    return {"samples": parse_metrics(text, METRIC)}


def webhook_metric(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The API server's own view of the webhook calls between two scrapes: calls, mean
    seconds per call, and bucket-interpolated p50/p99, over every webhook called (and
    which were called: a run under ``none`` must name none)."""
    b, a = before["samples"], after["samples"]
    seen_before: dict[str, float] = {}
    for n, labels, v in b:
        if n == METRIC + "_count":
            seen_before[labels["name"]] = seen_before.get(labels["name"], 0.0) + v
    seen_after: dict[str, float] = {}
    for n, labels, v in a:
        if n == METRIC + "_count":
            seen_after[labels["name"]] = seen_after.get(labels["name"], 0.0) + v
    names = {k for k, v in seen_after.items() if v > seen_before.get(k, 0.0)}
    calls = total(a, METRIC + "_count") - total(b, METRIC + "_count")
    secs = total(a, METRIC + "_sum") - total(b, METRIC + "_sum")
    hist = delta(buckets(a, METRIC), buckets(b, METRIC))
    return {"calls": calls, "mean_ms": 1000 * secs / calls if calls else None,
            "p50_ms": _ms(quantile(0.5, hist)), "p99_ms": _ms(quantile(0.99, hist)),
            "seconds": secs, "webhooks": sorted(names)}


def _ms(s: float | None) -> float | None:
    return None if s is None else round(1000 * s, 3)


def delete_pods(cp: ControlPlane) -> None:
    c = Client(cp)
    try:
        for t in TENANTS:
            status, body = c.request("DELETE", f"/api/v1/namespaces/bench-{t}/pods")
            if status != 200:
                raise RuntimeError(f"deleting the bench pods: {status} {body[:200]!r}")
    finally:
        c.close()


LEDGER_PREFIX = "gpu-webhook-ledger-"


def ledgers(cp: ControlPlane) -> dict[str, dict[str, str]]:
    """Our quota ledgers' data as they are now, by tenant."""
    c = Client(cp)
    try:
        out = {}
        for t in TENANTS:
            status, body = c.request(
                "GET", f"/api/v1/namespaces/{LEDGER_NAMESPACE}/configmaps/{LEDGER_PREFIX}{t}")
            if status == 200:
                out[t] = json.loads(body).get("data") or {}
        return out
    finally:
        c.close()


def entries(data: dict[str, str]) -> int:
    return len(json.loads(data.get("reservations") or "{}"))


def write_cost(cp: ControlPlane, data: dict[str, str], writes: int = 200) -> dict[str, Any]:
    """What one ledger commit costs at the API server, alone: ``writes`` conditional PUTs
    of a ConfigMap holding ``data``, one after the other, as a commit writes (the
    resourceVersion of the last answer in each). The floor under our added latency in a
    real creation, which a webhook that writes nothing does not pay."""
    name = "bench-ledger-write"
    c = Client(cp)
    path = f"/api/v1/namespaces/{LEDGER_NAMESPACE}/configmaps"
    try:
        status, body = c.request("POST", path, json.dumps(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
             "data": data}).encode())
        if status != 201:
            raise RuntimeError(f"creating {name}: {status} {body[:200]!r}")
        version = json.loads(body)["metadata"]["resourceVersion"]
        times = []
        for _ in range(writes):
            obj = {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": name, "resourceVersion": version}, "data": data}
            t0 = time.perf_counter()
            status, body = c.request("PUT", f"{path}/{name}", json.dumps(obj).encode())
            times.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"writing {name}: {status} {body[:200]!r}")
            version = json.loads(body)["metadata"]["resourceVersion"]
        c.request("DELETE", f"{path}/{name}")
        return {"entries": entries(data), "bytes": sum(len(v) for v in data.values()),
                "p50_ms": round(1000 * pct(times, 0.5), 3),
                "p99_ms": round(1000 * pct(times, 0.99), 3)}
    finally:
        c.close()


def measure(cp: ControlPlane, conds: Conditions, mixed: list[Item], clients: int,
            seconds: float, dry_run: bool) -> dict[str, Any]:
    before = apiserver_hist(cp)
    own_before = conds.samples(conds.current)
    cpu0 = {n: p.cpu_seconds() for n, p in conds.procs.items()}
    run = load(cp, mixed, clients, seconds, dry_run)
    after = apiserver_hist(cp)
    own_after = conds.samples(conds.current)
    cpu = {n: p.cpu_seconds() - cpu0[n] for n, p in conds.procs.items()}
    held = ledgers(cp) if conds.current == "ours" and not dry_run else {}
    if not dry_run:
        delete_pods(cp)
    n = len(run.latencies)
    counted = (ours_counted(own_before, own_after) if own_before and own_after
               else {"reused": 0.0, "mutating": 0.0})
    return {
        "requests": n, "rps": round(n / run.seconds, 1), "statuses": run.statuses,
        "p50_ms": round(1000 * pct(run.latencies, 0.5), 3),
        "p99_ms": round(1000 * pct(run.latencies, 0.99), 3),
        "by_kind_p50_ms": {k: round(1000 * pct(v, 0.5), 3) for k, v in run.by_kind.items()},
        "apiserver": webhook_metric(before, after),
        "server_cpu_ms_per_request": {k: round(1000 * v / n, 3) for k, v in cpu.items() if n},
        # Of the measured gpu-webhook's mutating reviews, the share answered with a
        # reused decision.
        "ours_reused": round(counted["reused"] / counted["mutating"], 3)
        if counted["mutating"] else None,
        # The measured gpu-webhook's own histograms and the share of each phase.
        "ours_phases": (ours_phases(own_before, own_after) if own_before and own_after
                        else None),
        # Our ledgers at the end of a real run: entries per tenant (the admissions whose
        # pods some replica may not have seen yet: about the last settle time's, see
        # webhook.quota.ledger), and the biggest one's data for the write-cost floor.
        "ledger_entries": {t: entries(d) for t, d in held.items()},
        "biggest_ledger": max(held.values(), key=entries) if held else None,
    }


# --------------------------------------------------------------------------- the rounds


def rounds(opts: argparse.Namespace) -> Iterator[tuple[int, list[str]]]:
    """Round r runs every condition once; the order rotates, so no condition is always
    first after a switch or always last before the machine's other work changes."""
    conds = list(opts.conditions)
    for r in range(opts.rounds):
        k = r % len(conds)
        yield r, conds[k:] + conds[:k]


def summarize(results: list[dict[str, Any]], conditions: list[str]) -> dict[str, Any]:
    """Per load (mode x clients): each condition's added p50/p99 over ``none`` of the same
    round, medians over rounds, and ratios to the do-nothing webhook and to Kyverno."""
    out: dict[str, Any] = {}
    loads = sorted({(r["mode"], r["clients"]) for r in results}, key=lambda x: (x[0], x[1]))
    for mode, clients in loads:
        rows = [r for r in results if r["mode"] == mode and r["clients"] == clients]
        by_round: dict[int, dict[str, dict[str, Any]]] = {}
        for r in rows:
            by_round.setdefault(r["round"], {})[r["condition"]] = r
        entry: dict[str, Any] = {}
        for cond in conditions:
            own = [rr[cond] for rr in by_round.values() if cond in rr]
            if not own:
                continue
            e: dict[str, Any] = {
                "p50_ms": statistics.median(x["p50_ms"] for x in own),
                "p99_ms": statistics.median(x["p99_ms"] for x in own),
                "rps": statistics.median(x["rps"] for x in own)}
            if cond != "none":
                for q in ("p50", "p99"):
                    e[f"added_{q}_ms"] = round(statistics.median(
                        rr[cond][f"{q}_ms"] - rr["none"][f"{q}_ms"]
                        for rr in by_round.values() if cond in rr and "none" in rr), 3)
                means = [x["apiserver"]["mean_ms"] for x in own if x["apiserver"]["mean_ms"]]
                e["apiserver_mean_ms_per_call"] = round(statistics.median(means), 3) \
                    if means else None
                e["apiserver_p50_ms"] = statistics.median(
                    x["apiserver"]["p50_ms"] or 0 for x in own)
                e["apiserver_p99_ms"] = statistics.median(
                    x["apiserver"]["p99_ms"] or 0 for x in own)
                e["apiserver_calls_per_create"] = round(statistics.median(
                    x["apiserver"]["calls"] / x["requests"] for x in own), 3)
            if cond in OWN:
                e["phases"] = _median_phases([x.get("ours_phases") or {} for x in own])
            entry[cond] = e
        for mine, other in RATIOS:
            if mine not in entry or other not in entry:
                continue
            for q in ("p50", "p99"):
                a, b = entry[mine][f"added_{q}_ms"], entry[other][f"added_{q}_ms"]
                entry[f"{mine}/{other}_{q}"] = round(a / b, 2) if b > 0 else None
            a, b = (entry[mine]["apiserver_mean_ms_per_call"],
                    entry[other]["apiserver_mean_ms_per_call"])
            entry[f"{mine}/{other}_apiserver_mean"] = round(a / b, 2) if a and b else None
        out[f"{mode}/{clients}"] = entry
    return out


def _median_phases(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per webhook, each field of :func:`ours_phases` as its median over the runs."""
    out: dict[str, dict[str, float]] = {}
    for webhook in ("mutate", "validate"):
        seen = [r[webhook] for r in runs if webhook in r]
        fields = sorted({k for r in seen for k in r})
        out[webhook] = {k: statistics.median(v for r in seen if (v := r.get(k)) is not None)
                        for k in fields if any(r.get(k) is not None for r in seen)}
    return {w: f for w, f in out.items() if f}


def phase_table(summary: dict[str, Any]) -> str:
    """Ours' own review time beside the API server's view of it, and where it goes: ms
    per review (medians over rounds), each with its share of the webhook's own mean;
    then what one ledger write carried and cost."""
    head = ["load", "condition", "webhook", "API server p50/p99 (every call)", "own p50/p99",
            "own mean",
            "parse", "engine", "quota commit (queued)", "ledger writes: admissions per "
            "write; read / decide / write / backoff ms per attempt"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def share(v: float | None, mean: float) -> str:
        return "-" if v is None else f"{v:.2f} ({100 * v / mean:.0f} %)" if mean else f"{v:.2f}"

    for load_name, e in summary.items():
        for cond in OWN:
            ours = e.get(cond) or {}
            for webhook, p in (ours.get("phases") or {}).items():
                mean = p.get("mean_ms") or 0.0
                engine = p.get("engine_ms", p.get("decide_ms"))
                row = [load_name, cond, webhook,
                       f"{ours.get('apiserver_p50_ms', 0):.2f} / "
                       f"{ours.get('apiserver_p99_ms', 0):.2f}",
                       f"{p.get('p50_ms') or 0:.2f} / {p.get('p99_ms') or 0:.2f}",
                       f"{mean:.2f}", share(p.get("parse_ms"), mean), share(engine, mean)]
                if webhook == "validate" and p.get("ledger_writes"):
                    row.append(f"{share(p.get('commit_ms'), mean)} "
                               f"({p.get('queued_ms', 0):.2f})")
                    row.append(f"{p.get('admissions_per_write')}; " + " / ".join(
                        f"{p.get(f'per_write_{x}_ms', 0):.2f}"
                        for x in ("read", "decide", "write", "backoff")))
                else:
                    row += ["-", "-"]
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def target(ratio: str, load_name: str) -> float | None:
    """The most a gpu-webhook condition's added latency may be, as a multiple of the
    other condition's in ``ratio`` ("ours/nothing", "leader/kyverno", ...), at a load
    ("real/8"); None where no target is set. Real creations commit quota and may cost
    more than dry runs, which commit nothing."""
    mine, other = ratio.split("/")
    mode, clients = load_name.split("/")
    if mine not in OWN or other == "patching":  # a floor against a floor: no target
        return None
    if other == "kyverno":
        return 0.3
    if other != "nothing":
        return None
    if mode == "dry-run":
        return {"1": 1.3, "8": 1.5}.get(clients)
    return 1.5 if clients == "1" else 2.0


def verdicts(summary: dict[str, Any]) -> list[str]:
    lines = []
    for load_name, e in summary.items():
        for q in ("p50", "p99"):
            for mine, other in RATIOS:
                key = f"{mine}/{other}"
                v, limit = e.get(f"{key}_{q}"), target(key, load_name)
                if v is None or limit is None:
                    continue
                ok = v <= limit
                lines.append(f"  [{'met' if ok else 'MISSED'}] {load_name} added {q} "
                             f"{key} {v} <= {limit}")
    return lines


def table(summary: dict[str, Any], conditions: list[str]) -> str:
    others = [c for c in conditions if c != "none"]
    ratios = [(c, other) for c, other in RATIOS if c in conditions and other in conditions]
    head = ["load", "none p50/p99"] + [f"{c} +p50/+p99" for c in others] + \
        [f"{a}/{b} p50/p99" for a, b in ratios] + ["apiserver mean ms/call " +
                                                   "/".join(others)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for load_name, e in summary.items():
        row = [load_name, f"{e['none']['p50_ms']:.2f} / {e['none']['p99_ms']:.2f}"
               if "none" in e else "-"]
        for c in others:
            row.append(f"{e[c]['added_p50_ms']:+.2f} / {e[c]['added_p99_ms']:+.2f}"
                       if c in e else "-")
        for mine, other in ratios:
            a, b = e.get(f"{mine}/{other}_p50"), e.get(f"{mine}/{other}_p99")
            row.append(f"{a} / {b}" if a is not None or b is not None else "-")
        row.append(" / ".join(str(e[c].get("apiserver_mean_ms_per_call")) if c in e else "-"
                              for c in others))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def kyverno_dir(opts: argparse.Namespace) -> tuple[Path | None, str | None]:
    """The built Kyverno (binary and CRDs), or why there is none."""
    if "kyverno" not in opts.conditions:
        return None, "not asked for"
    cache = Path(os.environ.get("GPU_WEBHOOK_CACHE", Path.home() / ".cache" / "gpu-webhook"))
    d = cache / "tools" / "kyverno-v1.19.0"
    if (d / "kyverno").exists() and (d / "crds").is_dir():
        return d, None
    if os.environ.get("KYVERNO_GIT_DIR"):
        proc = subprocess.run(["bash", str(KYVERNO_TOOL)], capture_output=True, text=True)
        if proc.returncode == 0:
            return Path(proc.stdout.strip().splitlines()[-1]), None
        return None, f"tools/kyverno.sh failed: {proc.stderr.strip()[-500:]}"
    return None, (f"not built: run tools/kyverno.sh (with KYVERNO_GIT_DIR) to cache it in {d}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.apiserver", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="one short round of none/nothing/patching/ours at 1 and 8 clients")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0, help="per run")
    p.add_argument("--clients", default="1,8,32", help="concurrent clients, comma-separated")
    p.add_argument("--modes", default="dry-run,real")
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--out", type=Path, default=RESULTS)
    opts = p.parse_args(argv)
    if opts.quick:
        opts.rounds, opts.seconds, opts.clients = 1, 1.0, "1,8"
        opts.conditions = "none,nothing,patching,ours"
    opts.conditions = [c for c in opts.conditions.split(",") if c]
    unknown = set(opts.conditions) - set(CONDITIONS)
    if unknown or "none" not in opts.conditions:
        p.error(f"--conditions: choose from {', '.join(CONDITIONS)}, none included")
    clients = [int(x) for x in opts.clients.split(",")]
    modes = opts.modes.split(",")
    kdir, why = kyverno_dir(opts)
    if kdir is None and "kyverno" in opts.conditions:
        print(f"kyverno left out: {why}", file=sys.stderr)
        opts.conditions.remove("kyverno")

    # A SIGTERM stops the servers and the control plane as Ctrl-C does (they run in
    # sessions of their own and would outlive this process).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="gpu-webhook-bench-apiserver-"))
    res: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "load_average": os.getloadavg(), "cpus": os.cpu_count(),
                           "seconds": opts.seconds, "rounds": opts.rounds,
                           "conditions": opts.conditions, "kyverno": why or str(kdir),
                           "runs": []}
    cp = ControlPlane(build_binaries(), work / "cp")
    conds: Conditions | None = None
    try:
        cp.start()
        res["apiserver_version"] = cp.version
        for ns in [LEDGER_NAMESPACE, LEADER_NAMESPACE] + [f"bench-{t}" for t in TENANTS]:
            _kubectl(cp, "create", "namespace", ns)
        conds = Conditions(cp, work, kdir)
        conds.start(opts.conditions)
        if "kyverno" in opts.conditions:
            # Kyverno registers and rewrites its webhook configurations for a while after
            # it starts (certificates, then its own webhooks): let it finish, once, so
            # that no measured run of another condition meets a half-made one.
            conds.install("kyverno")
            conds.install("none")
            time.sleep(10)
            conds.install("none")
        if {"leader", "relayed"} & set(opts.conditions):
            conds.wait_deciding()
        mixed = items()
        for r, order in rounds(opts):
            for cond in order:
                conds.install(cond)
                for mode in modes:
                    for n in clients:
                        # A short warm-up: connections, caches and the JIT-free Python
                        # paths of the condition's servers, not measured.
                        load(cp, mixed, n, min(1.0, opts.seconds / 2), mode == "dry-run")
                        if mode == "real":
                            delete_pods(cp)
                        m = measure(cp, conds, mixed, n, opts.seconds, mode == "dry-run")
                        m.update(round=r, condition=cond, mode=mode, clients=n)
                        res["runs"].append(m)
                        print(f"round {r} {cond:8} {mode:7} {n:>2} clients: "
                              f"{m['rps']:7.1f} req/s p50 {m['p50_ms']:6.2f} "
                              f"p99 {m['p99_ms']:6.2f} ms  apiserver mean "
                              f"{m['apiserver']['mean_ms']} ms/call", flush=True)
        conds.install("none")
        # One ledger commit alone, at the API server, with no webhook: an empty ledger
        # and the biggest a real run of ours left, one writer (as one client's pods).
        biggest = max((r.pop("biggest_ledger") or {} for r in res["runs"]), key=entries,
                      default={})
        res["ledger_write"] = [write_cost(cp, {"reservations": "{}"}), write_cost(cp, biggest)]
        for r in res["runs"]:
            r.pop("biggest_ledger", None)
    finally:
        if conds is not None:
            conds.stop()
        cp.stop()
    res["summary"] = summarize(res["runs"], opts.conditions)
    res["verdicts"] = verdicts(res["summary"])
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "apiserver.json").write_text(json.dumps(res, indent=1))
    print("\nadded latency over no webhook (client timings, ms; medians over rounds), "
          "ratios ours/other; API server's mean per webhook call")
    print(table(res["summary"], opts.conditions))
    print("\nours, its own histogram beside the API server's (every webhook call), and "
          "where a review's time goes (ms per review, medians over rounds; share of its "
          "own mean; engine: decide without the wait for the quota commit)")
    print(phase_table(res["summary"]))
    print("\none ledger commit alone (sequential conditional PUTs at the API server, no "
          "webhook): " + "; ".join(f"{w['entries']} entries ({w['bytes']} bytes) p50 "
                                    f"{w['p50_ms']} / p99 {w['p99_ms']} ms"
                                    for w in res.get("ledger_write", [])))
    print("targets:")
    print("\n".join(res["verdicts"]))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
