"""The simulated GPU cluster with the webhook deployed on it, as one object.

:class:`SimCluster` starts a control plane with the real kube-scheduler,
kube-controller-manager and kwok (``controlplane/cluster.py``), creates the nodes,
ResourceSlices and DeviceClasses of ``gpu-cluster.yaml`` (``nodes.py``), and deploys the
webhook on it exactly as the e2e suite does (``e2ekit``: ``gpu-webhook certs``, ``serve``
replicas, the configurations ``gpu-webhook manifests`` renders), with ``policy.yaml``.
The e2e fixtures (``fixtures.py``), ``make demo`` (``tools/demo.py``) and the scale bench
(``bench/scale.py``, through ``python tests/e2e/gpucluster/sim.py up``) all start their
cluster here, so what the demo shows is what the tests check.

Command line (the bench drives it; ``--help`` for the flags)::

    python tests/e2e/gpucluster/sim.py up --work-dir DIR [--gpu-nodes 500] [--replicas 2]

prints ``ready kubeconfig=...`` and keeps the cluster up until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

# Run as a script (the bench) or imported by tools/demo.py: the e2e helpers import their
# siblings as top-level modules, as under pytest.
_E2E = Path(__file__).resolve().parents[1]
for _p in (_E2E, _E2E.parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from controlplane.cluster import SIMULATED, ControlPlane, build_binaries  # noqa: E402
from e2ekit import (  # noqa: E402
    LEDGER_NAMESPACE,
    Deployment,
    RoundRobinProxy,
    gpu_webhook,
    start_replica,
    wait_installed,
    wait_ready,
    wait_until,
)
from gpucluster import nodes  # noqa: E402

HERE = Path(__file__).resolve().parent
POLICY = HERE / "policy.yaml"
BASE = HERE.parents[2] / "deploy" / "base"
# The cluster-wide objects of deploy/base (the webhook's own Deployment, Service and
# configurations are played by e2ekit), and the PolicyReport CRD of Kyverno's project.
CLUSTER_OBJECTS = ("crd-gpupolicy.yaml", "crd-gpuquota.yaml", "crd-gpuusage.yaml",
                   "priority-borrowed.yaml")
REPORT_CRD = _E2E / "crds" / "wgpolicyk8s.io_policyreports.yaml"
TENANT_LABEL = "gpu.example.com/tenant"


class SimCluster:
    """Control plane + scheduler + controllers + kwok nodes + the webhook."""

    def __init__(self, work_dir: Path, *, policy: Path = POLICY,
                 description: Path = nodes.DESCRIPTION, gpu_nodes: int | None = None,
                 replicas: int = 1, component_args: dict[str, list[str]] | None = None,
                 apiserver_args: list[str] | None = None, install: bool = True,
                 as_installed: bool = False, webhook_args: Sequence[str] = ()) -> None:
        self.work_dir = Path(work_dir)
        self.as_installed = as_installed
        self.webhook_args = list(webhook_args)
        self.policy = policy
        self.cluster = nodes.load(description, gpu_nodes=gpu_nodes)
        self.replicas = replicas
        self.install_webhook = install
        self.cp = ControlPlane(build_binaries(), self.work_dir / "controlplane",
                               components=SIMULATED, component_args=component_args,
                               extra_apiserver_args=apiserver_args)
        self.webhook: Deployment | None = None
        self.mount: subprocess.Popen[bytes] | None = None
        self.timings: dict[str, float] = {}

    def start(self) -> SimCluster:
        t0 = time.monotonic()
        try:
            self.cp.start()
            self.timings["control plane"] = time.monotonic() - t0
            self.cp.kubectl("create", "namespace", LEDGER_NAMESPACE)
            nodes.create(self.cp, self.cluster)
            self.timings["nodes"] = time.monotonic() - t0
            if self.as_installed:
                self._install_cluster_objects()
            self.webhook = self._deploy()
            if self.install_webhook:
                self.webhook.install()
                wait_installed(self.cp, self.webhook)
            self.timings["webhook"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        return self

    def _install_cluster_objects(self) -> None:
        """What an install puts in the cluster besides the webhook's own pods, before
        they start (``as_installed``): the CRDs (GPUPolicy, GPUQuota, and Kyverno's
        PolicyReport that the leader's audit writes), the borrowed pods' PriorityClass,
        the ClusterRole that lets whoever may view a namespace read its GPUQuota, and the
        policy ConfigMap ``gpu-webhook status`` and ``audit`` read (the served policy)."""
        self.cp.kubectl("apply", *(f"-f={BASE / name}" for name in CLUSTER_OBJECTS),
                        f"-f={REPORT_CRD}")
        [view] = [d for d in yaml.safe_load_all((BASE / "rbac.yaml").read_text())
                  if d and d["metadata"]["name"] == "gpu-webhook-quota-view"]
        self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(view))
        policy = yaml.safe_dump({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "gpu-webhook-policy", "namespace": LEDGER_NAMESPACE},
            "data": {"policy.yaml": self.policy.read_text()}})
        self.cp.kubectl("apply", "-f", "-", input=policy)
        self.cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/gpuquotas.gpu-webhook.dev", "crd/gpupolicies.gpu-webhook.dev",
                        "crd/policyreports.wgpolicyk8s.io")
        self._mount_policy()

    def _mount_policy(self) -> None:
        """The replicas serve the ConfigMap's policy as a pod would: the key mounted as a
        file, rewritten when the ConfigMap changes (mount.py plays the kubelet), so an
        edit of the ConfigMap is what the webhook enforces next."""
        mounted = self.work_dir / "webhook" / "mounted" / "policy.yaml"
        mounted.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / "webhook" / "mount.log", "ab")  # noqa: SIM115
        with log:
            self.mount = subprocess.Popen(
                [sys.executable, str(HERE / "mount.py"), "--kubeconfig",
                 str(self.cp.kubeconfig), "--namespace", LEDGER_NAMESPACE, "--name",
                 "gpu-webhook-policy", "--key", "policy.yaml", "--to", str(mounted)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        wait_until("the policy ConfigMap to be mounted", lambda: mounted.exists()
                   or self.mount is None or self.mount.poll() is not None, timeout=60)
        assert self.mount.poll() is None, (self.work_dir / "webhook" / "mount.log").read_text()
        self.policy = mounted

    def _deploy(self) -> Deployment:
        """The webhook as ``e2ekit.deployed`` runs it, kept running past this call (the
        demo leaves it up): certificates, replicas sharing them, a round-robin proxy
        playing the Service when there are several."""
        workdir = self.work_dir / "webhook"
        workdir.mkdir(parents=True, exist_ok=True)
        cert_dir = workdir / "certs"
        gpu_webhook("certs", "--out", str(cert_dir), "--dns", "localhost", "--ip", "127.0.0.1")
        d = Deployment(self.cp, workdir, cert_dir, self.policy)
        self.webhook = d
        for i in range(self.replicas):
            d.replicas.append(start_replica(workdir, cert_dir, self.policy,
                                            self.cp.kubeconfig, i, self.webhook_args))
        for r in d.replicas:
            wait_ready(r, d.ca_file)
        if self.replicas > 1:
            d.proxy = RoundRobinProxy([r.port for r in d.replicas]).start()
        return d

    def namespace(self, name: str, tenant: str | None) -> str:
        """Create namespace ``name``, labelled to join ``tenant`` (None: no tenant)."""
        labels = f"\n  labels:\n    {TENANT_LABEL}: {tenant}" if tenant else ""
        self.cp.kubectl("apply", "-f", "-",
                        input=f"apiVersion: v1\nkind: Namespace\nmetadata:\n"
                              f"  name: {name}{labels}\n")
        return name

    def pids(self) -> dict[str, int]:
        pids = self.cp.pids()
        if self.mount is not None and self.mount.poll() is None:
            pids["gpu-webhook-policy-mount"] = self.mount.pid
        if self.webhook is not None:
            for i, r in enumerate(self.webhook.replicas):
                if r.process.poll() is None:
                    pids[f"gpu-webhook-{i}"] = r.process.pid
        return pids

    def detach(self) -> dict[str, int]:
        """Leave every process running after this one exits (the demo); their pids."""
        if self.webhook is not None and self.webhook.proxy is not None:
            raise RuntimeError("the round-robin proxy lives in this process: detach "
                               "only a single-replica deployment")
        pids = self.pids()
        self.cp.detach()
        self.webhook = None
        self.mount = None
        return pids

    def stop(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()
            self.webhook = None
        if self.mount is not None:
            self.mount.terminate()
            self.mount.wait(timeout=30)
            self.mount = None
        self.cp.stop()

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _up(args: argparse.Namespace) -> int:
    component_args: dict[str, list[str]] = {}
    for spec in args.component_arg:
        name, _, flag = spec.partition("=")
        component_args.setdefault(name, []).append(flag)
    sim = SimCluster(Path(args.work_dir), policy=Path(args.policy), gpu_nodes=args.gpu_nodes,
                     replicas=args.replicas, component_args=component_args,
                     apiserver_args=args.apiserver_arg, install=not args.no_install,
                     webhook_args=args.webhook_arg)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with sim:
        assert sim.webhook is not None
        info: dict[str, Any] = {
            "kubeconfig": str(sim.cp.kubeconfig), "server": sim.cp.server,
            "nodes": len(sim.cluster.nodes), "webhook_url": sim.webhook.url,
            "webhook_pids": [r.process.pid for r in sim.webhook.replicas],
            "webhook_ports": [r.port for r in sim.webhook.replicas],
            "ca_file": str(sim.webhook.ca_file),
            "pids": sim.pids(),
            "timings": sim.timings,
        }
        # The webhook configurations, for a caller that installs and removes them
        # itself (the bench measures pod creation with and without the webhook).
        webhooks = Path(args.work_dir) / "webhooks.yaml"
        webhooks.write_text(sim.webhook.render())
        info["webhooks"] = str(webhooks)
        (Path(args.work_dir) / "sim.json").write_text(json.dumps(info, indent=1))
        print(f"ready kubeconfig={sim.cp.kubeconfig}", flush=True)
        while not stop.wait(1.0):
            sim.cp.check_components()
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the cluster and the webhook; stop on SIGTERM")
    up.add_argument("--work-dir", required=True)
    up.add_argument("--gpu-nodes", type=int, default=None,
                    help="scale the plain GPU node groups to this many nodes in all")
    up.add_argument("--replicas", type=int, default=1, help="webhook replicas")
    up.add_argument("--policy", default=str(POLICY), help="the webhook's policy file")
    up.add_argument("--apiserver-arg", action="append", default=[], metavar="--flag=value",
                    help="an extra kube-apiserver flag")
    up.add_argument("--no-install", action="store_true",
                    help="run the webhook but do not install its configurations")
    up.add_argument("--webhook-arg", action="append", default=[], metavar="--flag=value",
                    help="an extra flag for each webhook replica's serve")
    up.add_argument("--component-arg", action="append", default=[],
                    metavar="COMPONENT=--flag=value",
                    help="an extra flag for kube-scheduler, kube-controller-manager or kwok")
    args = parser.parse_args(argv)
    return _up(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
