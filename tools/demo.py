"""``make demo``: the whole product on a simulated GPU cluster, in a few minutes.

Starts the simulated GPU cluster of the end-to-end tests (a real kube-apiserver,
kube-scheduler and kube-controller-manager, kwok's fake GPU nodes from
``tests/e2e/gpucluster/gpu-cluster.yaml``) with the webhook deployed on it and its policy
``tests/e2e/gpucluster/policy.yaml``; applies a scripted set of workloads with kubectl as
developers would; prints what happened to each (pod, node, GPU product, rack, or the
message that refused it); and leaves the cluster up with a kubeconfig to play with.

    python tools/demo.py              # make demo
    python tools/demo.py down         # make demo-down: stop what the demo left running
    python tools/demo.py --down-after # non-interactive: stop at the end (the e2e test)

Every step has an expected outcome, checked as the demo runs: the command exits 1 if the
cluster did something else (``tests/e2e/test_e2e_sim_demo.py`` runs it so it cannot rot).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "tests")]

import yaml  # noqa: E402
from gpucluster.fixtures import deployment, job, pod  # noqa: E402
from gpucluster.sim import SimCluster  # noqa: E402

DEFAULT_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "gpu-webhook-demo"
PRODUCT = "nvidia.com/gpu.product"
RACK = "topology.example.com/gpu-rack"
# Tenants of policy.yaml, each in a namespace named after it (plus the exempt one).
NAMESPACES = {"research": "research", "vision": "vision", "inference": "inference",
              "notebooks": "notebooks", "batch": "batch", "gang": "gang", "waiting": "waiting",
              "sim-exempt": None}
# Stop order: what talks to the API server first, etcd last.
STOP_ORDER = ["kwok", "kube-scheduler", "kube-controller-manager"]


@dataclass
class Step:
    """One workload: what is applied, and what should become of it."""

    namespace: str
    obj: dict[str, Any]
    expect: str          # "run", "pending", "denied", "queued" (a Job refused, then run),
    #                      "waits" (a Job's pods gated until quota frees, then run)
    note: str
    product: str | None = None     # the product its pods must land on
    racks: tuple[str, ...] = ()    # the racks they may land in
    pods: int = 1
    # Filled in as it runs.
    apply_out: str = ""
    apply_err: str = ""
    ok: bool = False
    message: str = ""

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def workload(self) -> str:
        return f"{self.namespace}/{self.kind.lower()}/{self.name}"


def with_labels(obj: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    obj["metadata"].setdefault("labels", {}).update(labels)
    return obj


def script() -> list[Step]:
    """The workloads, in the order applied: the README's tour on a cluster."""
    a100, h100 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"
    mismatched = pod("half-set", 2)
    mismatched["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": "1"}
    return [
        Step("research", pod("trainer-0", 2), "run",
             "2 GPUs by limit only: request, toleration, A100 + rack pinning added",
             a100, ("rack-a", "rack-b")),
        Step("research", with_labels(pod("trainer-h100", 4),
                                     {"gpu.example.com/product": "h100"}), "run",
             "asks for H100 by label", h100, ("rack-a", "rack-b")),
        Step("research", deployment("llm-serve", replicas=3, count=1), "run",
             "a Deployment: the ReplicaSet's pods", a100, ("rack-a", "rack-b"), pods=3),
        Step("vision", job("resnet", parallelism=3, count=8, run_for="10m"), "run",
             "tenant vision is pinned to rack-b", a100, ("rack-b",), pods=3),
        Step("inference",
             deployment("chat", replicas=2, count=1, resource="nvidia.com/gpu.shared"), "run",
             "time-sliced L4 replicas (nvidia.com/gpu.shared)", "NVIDIA-L4", pods=2),
        Step("notebooks", pod("notebook-0", 1, "nvidia.com/mig-1g.10gb"), "run",
             "a MIG slice on the A100 MIG node", a100),
        Step("notebooks", pod("notebook-gpu", 1), "run",
             "a whole GPU, not the MIG slices notebooks may use: warned (warn mode), runs, "
             "and the audit's PolicyReport says so", a100),
        Step("research", pod("too-big", 12), "denied",
             "over the 8 per container and per pod: told once"),
        Step("research", mismatched, "denied", "request differs from limit: the fix is named"),
        Step("gang", job("allreduce", parallelism=4, count=5, run_for="1m"), "denied",
             "a gang of 4 x 5 GPUs with a 16-GPU quota: refused at apply"),
        Step("batch", job("epoch-1", parallelism=2, count=4, run_for="15s"), "run",
             "holds tenant batch's 8 GPUs for 15 s", a100, pods=2),
        Step("batch", job("epoch-2", parallelism=1, count=4, run_for="15s"), "queued",
             "over quota now: refused in the Job's events, runs when epoch-1 completes",
             a100),
        Step("waiting", job("sweep-1", parallelism=2, count=4, run_for="15s"), "run",
             "holds tenant waiting's 8 GPUs for 15 s (overQuota: wait)", a100, pods=2),
        Step("waiting", job("sweep-2", parallelism=2, count=4, run_for="15s"), "waits",
             "over quota now: created behind the quota gate, no error, released whole "
             "when sweep-1 completes", a100, pods=2),
        Step("sim-exempt", pod("no-webhook", 1), "pending",
             "control: a namespace the webhook skips gets no toleration"),
    ]


# --------------------------------------------------------------------------- running


def wait(what: str, ok: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            print(f"  ! timed out after {timeout:.0f}s waiting for {what}", file=sys.stderr)
            return False
        time.sleep(0.5)
    return True


class Demo:
    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self.nodes: dict[str, dict[str, str]] = {}

    def get(self, *args: str) -> dict[str, Any]:
        out = self.sim.cp.kubectl("get", *args, "-o", "json").stdout
        obj: dict[str, Any] = json.loads(out)
        return obj

    def node_labels(self, name: str) -> dict[str, str]:
        if name not in self.nodes:
            self.nodes[name] = self.get("node", name)["metadata"].get("labels") or {}
        return self.nodes[name]

    def pods_of(self, step: Step) -> list[dict[str, Any]]:
        items = self.get("pods", "-n", step.namespace)["items"]
        if step.kind == "Pod":
            return [p for p in items if p["metadata"]["name"] == step.name]
        if step.kind == "Job":
            key = "batch.kubernetes.io/job-name"
            return [p for p in items if (p["metadata"].get("labels") or {}).get(key) == step.name]
        return [p for p in items
                if (p["metadata"].get("labels") or {}).get("app") == step.name]

    def events(self, step: Step, kind: str, name: str, reason: str) -> list[str]:
        items = self.get("events", "-n", step.namespace, "--field-selector",
                         f"involvedObject.kind={kind},involvedObject.name={name}")["items"]
        return [str(e["message"]) for e in items if e["reason"] == reason]

    def apply(self, step: Step) -> None:
        proc = self.sim.cp.kubectl("apply", "-n", step.namespace, "-f", "-",
                                   input=yaml.safe_dump(step.obj), check=False)
        step.apply_out, step.apply_err = proc.stdout.strip(), proc.stderr.strip()
        if step.expect == "denied":
            step.ok = proc.returncode != 0 and "denied the request" in step.apply_err
        elif proc.returncode != 0:
            step.ok = False

    def settle(self, step: Step, timeout: float) -> None:
        """Wait for the step's expected outcome; the message that refused it, if any."""
        if step.expect == "denied":
            step.message = "DENIED at apply: " + step.apply_err.split("denied the request: ",
                                                                      1)[-1]
            return
        if step.apply_err.startswith("Error"):
            step.ok, step.message = False, f"apply failed: {step.apply_err}"
            return
        if step.expect == "pending":
            def scheduling() -> list[str]:
                return self.events(step, "Pod", step.name, "FailedScheduling")

            if wait(f"{step.workload} to fail scheduling", lambda: bool(scheduling()), timeout):
                step.message = f"Pending: {scheduling()[0]}"
                step.ok = "untolerated taint" in step.message
            return
        if step.expect == "queued":
            def refused() -> list[str]:
                return self.events(step, "Job", step.name, "FailedCreate")

            if not wait(f"{step.workload}'s pods to be refused", lambda: bool(refused()),
                        timeout):
                return
            step.message = ("REFUSED (Job event): "
                            + refused()[0].split("denied the request: ", 1)[-1])
            # ... and once the Job before it completed, its pod is admitted and runs.
            timeout += 120
        if step.expect == "waits":
            def told() -> list[str]:
                items = self.get("events", "-n", step.namespace)["items"]
                return [str(e["message"]) for e in items if e["reason"] == "WaitingForQuota"
                        and str(e["involvedObject"]["name"]).startswith(step.name + "-")]

            if not wait(f"{step.workload}'s pods to wait for quota", lambda: bool(told()),
                        timeout):
                return
            step.message = "WAITED (pod event): " + told()[0]
            # ... and once the Job before it completed, its pods are released whole.
            timeout += 120
        # A Job's pods may have completed already (kwok's run-for): they ran.
        step.ok = wait(f"{step.pods} running pods of {step.workload}", lambda: sum(
            p["status"].get("phase") in ("Running", "Succeeded")
            for p in self.pods_of(step)) >= step.pods, timeout)

    def rows(self, step: Step, after: Step | None) -> list[list[str]]:
        """The step's table rows, from the pods as they are now; checks where they ran
        (and for a queued Job, that its pod was made only after ``after`` completed)."""
        rows = [[step.workload, "-", "-", "-", "-", step.message]] if step.message else []
        if step.expect in ("denied", "pending"):
            if step.expect == "pending":
                rows[0][1] = step.name
            return rows
        done = ""
        if after is not None:
            done = max((c["state"].get("terminated", {}).get("finishedAt", "~")
                        for p in self.pods_of(after)
                        for c in p["status"].get("containerStatuses") or []), default="~")
        for p in sorted(self.pods_of(step), key=lambda p: p["metadata"]["name"]):
            node = p["spec"].get("nodeName") or "-"
            labels = self.node_labels(node) if node != "-" else {}
            product, rack = labels.get(PRODUCT, "-"), labels.get(RACK, "-")
            step.ok &= product == step.product and (not step.racks or rack in step.racks)
            status = p["status"].get("phase", "?")
            if after is not None and step.expect == "waits":
                # Created at once, behind the gate; started only once released.
                created = p["metadata"]["creationTimestamp"]
                started = str(p["status"].get("startTime") or "")
                step.ok &= started >= done
                status += (f" (created {created[11:19]}, started {started[11:19]}, after "
                           f"{after.name} ended {done[11:19]})")
            elif after is not None:
                # RFC 3339 UTC timestamps of the API server compare as strings.
                created = p["metadata"]["creationTimestamp"]
                step.ok &= created >= done
                status += f" (created {created[11:19]}, after {after.name} ended {done[11:19]})"
            rows.append([step.workload, p["metadata"]["name"], node, product, rack, status])
        return rows


    def seen(self, steps: list[Step], timeout: float) -> None:
        """Wait until what the leader writes shows what runs: research's GPUQuota object
        counts its running pods, and the PolicyReport of notebooks (in warn mode) has the
        warned pod. The namespace's first step is marked failed if they never do."""
        research = [s for s in steps if s.namespace == "research"]
        running = sum(s.pods for s in research if s.expect == "run")

        def counted() -> bool:
            quotas = self.get("gpuquotas", "-n", "research")["items"]
            return [q.get("status", {}).get("pods") for q in quotas] == [running]

        def reported() -> bool:
            reports = self.get("policyreports", "-n", "notebooks")["items"]
            return any(r.get("summary", {}).get("warn") for r in reports)

        for ns, ok in (("research", counted), ("notebooks", reported)):
            if not wait(f"the leader's GPUQuota and PolicyReport for {ns}", ok, timeout):
                next(s for s in steps if s.namespace == ns).ok = False


def table(rows: list[list[str]], width: int | None = None) -> str:
    width = width or max(120, shutil.get_terminal_size((150, 40)).columns)
    head = ["WORKLOAD", "POD", "NODE", "PRODUCT", "RACK", "RESULT"]
    cols = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    last = max(40, width - sum(cols) - 2 * 5)
    lines = []
    for r in [head, *rows]:
        lead = "  ".join(c.ljust(w) for c, w in zip(r[:5], cols, strict=True))
        wrapped = textwrap.wrap(r[5], last) or [""]
        lines.append(f"{lead}  {wrapped[0]}")
        lines += [" " * (len(lead) + 2) + more for more in wrapped[1:]]
    return "\n".join(lines)


def run(work_dir: Path, down_after: bool, timeout: float) -> int:
    state = work_dir / "demo.json"
    if state.exists():
        print(f"A demo is already running (see {state}): `make demo-down` first.")
        return 1
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    t0 = time.monotonic()
    print("Starting the simulated GPU cluster: kube-apiserver, etcd, kube-scheduler, "
          "kube-controller-manager, kwok,")
    print("16 GPU/CPU nodes from tests/e2e/gpucluster/gpu-cluster.yaml, and the webhook "
          "with tests/e2e/gpucluster/policy.yaml ...")
    # The product as installed (CRDs, the policy ConfigMap, the leader writing GPUQuota
    # objects and PolicyReports), its status written every 2 s and its audit run every
    # 10 s rather than every 10 s and 5 min, so that both are there when the table is.
    sim = SimCluster(work_dir, as_installed=True,
                     webhook_args=["--quota-status-seconds", "2", "--audit-seconds", "10",
                                   "--webhook-configurations-sync", "fix"])
    sim.start()
    try:
        print(f"  ready in {time.monotonic() - t0:.0f}s ({sim.cp.version}); "
              f"nodes: {', '.join(n.name for n in sim.cluster.nodes)}")
        for ns, tenant in NAMESPACES.items():
            sim.namespace(ns, tenant)
        demo = Demo(sim)
        steps = script()
        print("\nApplying the workloads with kubectl:")
        for step in steps:
            demo.apply(step)
            print(f"  {step.workload:<34} {step.note}")
            for line in step.apply_err.splitlines():
                if line.startswith("Warning:"):
                    print(f"      {textwrap.shorten(line, 140)}")
        for step in steps:
            demo.settle(step, timeout)
        print()
        rows: list[list[str]] = []
        for i, step in enumerate(steps):
            rows += demo.rows(step, steps[i - 1] if step.expect in ("queued", "waits")
                              else None)
        print(table(rows))
        demo.seen(steps, timeout)
        failed = [s for s in steps if not s.ok]
        for s in failed:
            print(f"\nUNEXPECTED: {s.workload} should have been '{s.expect}': "
                  f"{s.apply_out} {s.apply_err}", file=sys.stderr)
        print(f"\n{len(steps) - len(failed)} of {len(steps)} workloads behaved as expected "
              f"({time.monotonic() - t0:.0f}s).")
    except BaseException:
        sim.stop()
        raise
    if down_after:
        sim.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
        return 1 if failed else 0
    pids = sim.detach()
    state.write_text(json.dumps({"pids": pids, "kubeconfig": str(sim.cp.kubeconfig)}))
    # kubectl and gpu-webhook on the PATH, the demo's kubeconfig: one file to source.
    env = work_dir / "env"
    env.write_text(f"export KUBECONFIG={sim.cp.kubeconfig}\n"
                   f"export PATH={sim.cp.bin_dir}:{Path(sys.executable).parent}:$PATH\n")
    print(f"""
The cluster is still up, with the webhook installed as on a cluster (CRDs, the policy
ConfigMap, the leader writing GPUQuota objects and PolicyReports). Try it:
  . {env}
  kubectl get gpuquotas -n research
  gpu-webhook status -n research
  gpu-webhook audit
  kubectl get policyreports -n notebooks
  kubectl describe job epoch-2 -n batch
Webhook logs: {work_dir / 'webhook'}/replica-0.log; component logs: {sim.cp.work_dir}
Stop it: make demo-down   (or: kill {' '.join(str(p) for p in pids.values())})""")
    return 1 if failed else 0


def down(work_dir: Path) -> int:
    state = work_dir / "demo.json"
    if not state.exists():
        print(f"No demo running ({state} not found).")
        return 0
    pids: dict[str, int] = json.loads(state.read_text())["pids"]
    webhooks = [n for n in pids if n.startswith("gpu-webhook")]
    order = [*webhooks, *STOP_ORDER, "kube-apiserver", "etcd"]
    for name in [n for n in order if n in pids]:
        pid = pids[name]
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
        print(f"stopped {name} ({pid})")
    shutil.rmtree(work_dir, ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=["up", "down"], default="up")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--down-after", action="store_true",
                        help="stop the cluster at the end (non-interactive runs)")
    parser.add_argument("--timeout", type=float, default=90.0,
                        help="seconds to wait for each workload's outcome")
    args = parser.parse_args(argv)
    if args.command == "down":
        return down(args.work_dir)
    return run(args.work_dir, args.down_after, args.timeout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
