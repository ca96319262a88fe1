"""What each admission mode adds to a pod creation, measured through a real kube-apiserver.

    .venv/bin/python -m bench.native             # ~4 min
    .venv/bin/python -m bench.native --quick     # every condition briefly (~1 min)

A real etcd + kube-apiserver (v1.37.2) and, in alternating rounds, one condition at a time
(``gpu-webhook manifests --admission-mode``; docs/security.md):

- ``none``: no admission of ours;
- ``native-alone``: the native admission policies alone (MutatingAdmissionPolicy,
  ValidatingAdmissionPolicy), no webhook: what the API server spends on them;
- ``nothing``: the do-nothing webhook (``bench/baseline.py``) registered as ours is in
  mode ``webhook`` (same configurations, renamed);
- ``webhook``: ``gpu-webhook serve`` in mode ``webhook``;
- ``native``: ``gpu-webhook serve`` in mode ``native``: the native policies, and the
  webhook sent only what needs its state.

Two loads, dry runs, sequential and from 8 clients: a tenant's pod without GPUs (``plain``)
and a GPU pod of a tenant whose rules need no mutation from the webhook (``gpu``: no
product pinning, waiting, borrowing or per-user caps; its quota is checked). Reported:
the p50 added over ``none`` in the same round (medians over rounds), the ratios the issue
asks (``native`` over ``native-alone`` for ``plain``; ``native`` over ``nothing`` for
``gpu``), and the CPU per 1,000 pods of the kube-apiserver and of the webhook process.
Results: a table on stdout and ``bench/results/native.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.apiserver import (
    Client,
    Item,
    Proc,
    _fixed,
    _hook_names,
    load,
    pct,
    spawn,
    wait_https,
    webhook_calls,
)
from bench.servers import gpu_webhook

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from controlplane.cluster import ControlPlane, build_binaries, free_port  # noqa: E402

TENANTS = ["vision", "speech"]
CONDITIONS = ("none", "native-alone", "nothing", "webhook", "native")
LOADS = {"plain": 0, "gpu": 1}  # the Item each load sends
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def policy() -> dict[str, Any]:
    """Two tenants, a namespace each: allowed resources, every route closed, a quota no
    run reaches; no product pinning, so a GPU pod needs nothing of the webhook but its
    quota check."""
    return {
        "apiVersion": "gpu-webhook.dev/v1alpha1", "kind": "GPUPolicy",
        "metadata": {"name": "bench-native"},
        "spec": {
            "gpuResources": {"names": ["nvidia.com/gpu"]},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "exemptions": {"namespaces": ["gpu-webhook"]},
            "tenants": [{"name": t, "namespaces": [f"bench-{t}"],
                         "allowedResources": ["nvidia.com/gpu"], "maxGpusPerPod": 8,
                         "quota": {"gpus": 1_000_000}} for t in TENANTS],
        },
    }


def pods() -> dict[str, list[Item]]:
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-"},
             "spec": {"containers": [{"name": "web", "image": "web:1"},
                                     {"name": "log", "image": "fluent-bit:3"}]}}
    gpu = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "train-"},
           "spec": {"containers": [{"name": "train", "image": "pytorch:2",
                                    "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
    return {"plain": [Item("plain", t, _fixed(plain)) for t in TENANTS],
            "gpu": [Item("gpu", t, _fixed(gpu)) for t in TENANTS]}


class Conditions:
    """The servers, started once; one condition installed at a time."""

    def __init__(self, cp: ControlPlane, work: Path) -> None:
        self.cp, self.work = cp, work
        self.policy = work / "policy.yaml"
        self.policy.write_text(yaml.safe_dump(policy()))
        self.certs = work / "certs"
        gpu_webhook("certs", "--out", str(self.certs), "--dns", "localhost", "--ip",
                    "127.0.0.1")
        self.procs: dict[str, Proc] = {}
        self.docs: dict[str, list[dict[str, Any]]] = {}
        self.current = "none"
        cp.kubectl("create", "namespace", "gpu-webhook")
        for t in TENANTS:
            cp.kubectl("create", "namespace", f"bench-{t}")

    def _render(self, url: str, mode: str) -> list[dict[str, Any]]:
        out = gpu_webhook("manifests", "--policy", str(self.policy), "--url", url,
                          "--ca-file", str(self.certs / "ca.pem"), "--admission-mode", mode)
        return [d for d in yaml.safe_load_all(out) if d]

    def start(self) -> None:
        port = free_port()
        self.procs["ours"] = spawn("gpu-webhook", [
            str(Path(sys.executable).with_name("gpu-webhook")), "serve", "--host",
            "127.0.0.1", "--port", str(port), "--cert-dir", str(self.certs), "--policy",
            str(self.policy), "--kubeconfig", str(self.cp.kubeconfig), "--namespace",
            "gpu-webhook"], self.work / "ours.log")
        wait_https(self.procs["ours"], port)
        ours = f"https://127.0.0.1:{port}"
        self.docs["webhook"] = self._render(ours, "webhook")
        self.docs["native"] = self._render(ours, "native")
        self.docs["native-alone"] = [d for d in self.docs["native"]
                                     if "AdmissionPolicy" in d["kind"]]
        port = free_port()
        self.procs["nothing"] = spawn("do-nothing", [
            sys.executable, "-m", "bench.baseline", "--host", "127.0.0.1", "--port",
            str(port), "--cert-dir", str(self.certs)], self.work / "nothing.log")
        wait_https(self.procs["nothing"], port)
        text = yaml.safe_dump_all(self._render(f"https://127.0.0.1:{port}", "webhook"))
        self.docs["nothing"] = [d for d in yaml.safe_load_all(
            text.replace("name: gpu-webhook", "name: do-nothing").replace(
                ".gpu-webhook.dev", ".do-nothing.dev")) if d]

    def _probe(self) -> tuple[bool, set[str]]:
        """Whether a plain pod is voided, and the webhooks a GPU pod's creation calls."""
        client = Client(self.cp)
        try:
            _, body = client.request("POST", f"/api/v1/namespaces/bench-{TENANTS[0]}/pods"
                                             "?dryRun=All", pods()["plain"][0].body(0))
            voided = VOID in (json.loads(body).get("spec", {}).get("containers", [{}])[0]
                              .get("env") or [])
            before = webhook_calls(self.cp)
            client.request("POST", f"/api/v1/namespaces/bench-{TENANTS[0]}/pods?dryRun=All",
                           pods()["gpu"][0].body(0))
            after = webhook_calls(self.cp)
        finally:
            client.close()
        return voided, {n for n, v in after.items() if v > before.get(n, 0.0)}

    def _wait(self, what: str, ok: Callable[[bool, set[str]], bool]) -> None:
        deadline = time.monotonic() + 120
        seen: tuple[bool, set[str]] = (False, set())
        while time.monotonic() < deadline:
            seen = self._probe()
            if ok(*seen):
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what} (voided, called: {seen})")

    def install(self, condition: str) -> None:
        cp = self.cp
        if self.current != "none":
            cp.kubectl("delete", "--wait=true", "-f", "-",
                       input=yaml.safe_dump_all(self.docs[self.current]))
        self.current = "none"
        self._wait("nothing installed", lambda voided, called: not voided and not called)
        if condition == "none":
            return
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(self.docs[condition]))
        names = _hook_names(yaml.safe_dump_all(self.docs[condition])) \
            if condition != "native-alone" else set()
        native = condition in ("native", "native-alone")
        self._wait(condition, lambda voided, called: (voided or not native) and (
            called == set() if condition == "native-alone"
            else len(called) >= (1 if native else 2) and called <= names))
        self.current = condition

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()


def apiserver_cpu(cp: ControlPlane) -> float:
    """The kube-apiserver's CPU seconds so far."""
    pid = cp.pids()["kube-apiserver"]
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    import os
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(cp: ControlPlane, conds: Conditions, condition: str, load_name: str,
            clients: int, seconds: float) -> dict[str, Any]:
    cpu0 = apiserver_cpu(cp)
    ours0 = conds.procs["ours"].cpu_seconds()
    run = load(cp, pods()[load_name], clients, seconds, dry_run=True)
    n = len(run.latencies)
    return {"p50_ms": pct(run.latencies, 0.5) * 1000, "p99_ms": pct(run.latencies, 0.99) * 1000,
            "pods": n, "pods_per_s": n / run.seconds,
            "apiserver_cpu_ms_per_pod": (apiserver_cpu(cp) - cpu0) * 1000 / max(n, 1),
            "webhook_cpu_ms_per_pod": (conds.procs["ours"].cpu_seconds() - ours0) * 1000
            / max(n, 1) if condition in ("webhook", "native") else 0.0,
            "statuses": run.statuses}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of each (condition, load, clients): the p50 added over
    ``none`` of the same round, and the ratios."""
    out: dict[str, Any] = {}
    keys = {(r["load"], r["clients"]) for r in runs}
    for load_name, clients in sorted(keys):
        row: dict[str, Any] = {}
        for condition in CONDITIONS:
            added, cpu, hook_cpu = [], [], []
            for rnd in {r["round"] for r in runs}:
                mine = [r for r in runs if (r["round"], r["condition"], r["load"],
                                            r["clients"]) == (rnd, condition, load_name,
                                                              clients)]
                base = [r for r in runs if (r["round"], r["condition"], r["load"],
                                            r["clients"]) == (rnd, "none", load_name, clients)]
                if mine and base:
                    added.append(mine[0]["p50_ms"] - base[0]["p50_ms"])
                    cpu.append(mine[0]["apiserver_cpu_ms_per_pod"])
                    hook_cpu.append(mine[0]["webhook_cpu_ms_per_pod"])
            if added:
                row[condition] = {"added_p50_ms": statistics.median(added),
                                  "apiserver_cpu_ms_per_pod": statistics.median(cpu),
                                  "webhook_cpu_ms_per_pod": statistics.median(hook_cpu)}
        ref = "native-alone" if load_name == "plain" else "nothing"
        if "native" in row and ref in row:
            # None when the reference added nothing measurable in this run (a short run on
            # a busy machine can time it under no admission at all): no ratio to give.
            base = row[ref]["added_p50_ms"]
            row["ratio"] = {"of": f"native / {ref}",
                            "value": row["native"]["added_p50_ms"] / base if base > 0 else None,
                            "target": 1.2 if load_name == "plain" else 1.3}
        out[f"{load_name} x{clients}"] = row
    return out


def table(summary: dict[str, Any]) -> str:
    lines = [f"{'load':<10} " + " ".join(f"{c:>13}" for c in CONDITIONS)
             + "   ratio (target)", ""]
    for key, row in summary.items():
        cells = " ".join(f"{row[c]['added_p50_ms']:>11.2f}ms" if c in row else f"{'-':>13}"
                         for c in CONDITIONS)
        ratio = row.get("ratio")
        said = "" if ratio is None else (
            f"   {ratio['of']} {ratio['value']:.2f} (<= {ratio['target']})"
            if ratio["value"] is not None else
            f"   {ratio['of']} not measurable: {ratio['of'].split(' / ')[1]} added nothing")
        lines.append(f"{key:<10} {cells}{said}")
    lines += ["", "API server CPU ms per pod (webhook process CPU ms per pod):"]
    for key, row in summary.items():
        lines.append(f"{key:<10} " + " ".join(
            f"{row[c]['apiserver_cpu_ms_per_pod']:>6.2f} ({row[c]['webhook_cpu_ms_per_pod']:.2f})"
            if c in row else f"{'-':>13}" for c in CONDITIONS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.native", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="per run [5]")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds [3]")
    ap.add_argument("--quick", action="store_true", help="1 round of 1 s runs")
    ap.add_argument("--out", type=Path, default=RESULTS / "native.json")
    opts = ap.parse_args(argv)
    if opts.quick:
        opts.seconds, opts.rounds = 1.0, 1
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-native-") as tmp:
        work = Path(tmp)
        cp = ControlPlane(build_binaries(), work / "cp")
        cp.start()
        conds = Conditions(cp, work)
        try:
            conds.start()
            for rnd in range(opts.rounds):
                # Each round in another order: no condition always runs first or last.
                order = list(CONDITIONS[rnd % len(CONDITIONS):] + CONDITIONS[
                    :rnd % len(CONDITIONS)])
                for condition in order:
                    conds.install(condition)
                    for load_name in LOADS:
                        for clients in (1, 8):
                            r = measure(cp, conds, condition, load_name, clients,
                                        opts.seconds)
                            runs.append({"round": rnd, "condition": condition,
                                         "load": load_name, "clients": clients, **r})
            version = cp.version
        finally:
            conds.stop()
            cp.stop()
    summary = summarize(runs)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps({"apiserver_version": version, "seconds": opts.seconds,
                                    "rounds": opts.rounds, "summary": summary, "runs": runs},
                                   indent=1))
    print(table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
