"""Seeing the GPUs on a real API server: the GPUQuota objects a developer reads with
``kubectl get``, the periodic audit's PolicyReports, and the leader Lease that makes one
replica write them.

This module runs its own control plane with kube-controller-manager: the ``view``
ClusterRole gets the GPUQuota rules the shipped ClusterRole aggregates into it only
when the clusterrole-aggregation controller runs, as in every real cluster. Two webhook
replicas serve it, writing the quota status every second and auditing every two.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from controlplane.cluster import CONTROLLER_MANAGER, ControlPlane, build_binaries
from e2ekit import (
    LEDGER_NAMESPACE,
    POLICY,
    ROOT,
    Deployment,
    apply,
    create_namespace,
    deployed,
    get_if_there,
    gpu_pod,
    gpu_webhook,
    service_account_kubeconfig,
    short_id,
    wait_until,
)

from webhook.libs import kube
from webhook.server.leading.leader import Leadership

pytestmark = pytest.mark.e2e

BASE = ROOT / "deploy" / "base"
REPORT_CRD = Path(__file__).parent / "crds" / "wgpolicyk8s.io_policyreports.yaml"
ARGS = ["--quota-status-seconds", "1", "--audit-seconds", "2", "--policy-poll-seconds", "0.5"]
# Generous: the machine is shared; only waited out on failure.
TIMEOUT = 90.0

# Tenant audit of the e2e policy, and the same with its cap lowered under what runs.
CURRENT = ("    - name: audit\n      namespaceSelector:\n        matchLabels: "
           "{gpu.example.com/tenant: audit}\n      maxGpusPerPod: 8\n      quota:\n"
           "        gpus: 8\n")
LOWERED = CURRENT.replace("gpus: 8", "gpus: 4")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(build_binaries(), tmp_path_factory.mktemp("seeing-cp"),
                      components=(CONTROLLER_MANAGER,))
    cp.start()
    try:
        cp.kubectl("create", "namespace", LEDGER_NAMESPACE)
        cp.kubectl("apply", "-f", str(BASE / "crd-gpuquota.yaml"), "-f", str(REPORT_CRD))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                   "crd/gpuquotas.gpu-webhook.dev", "crd/policyreports.wgpolicyk8s.io")
        # The shipped ClusterRole that aggregates read access into `view`.
        [view] = [d for d in yaml.safe_load_all((BASE / "rbac.yaml").read_text())
                  if d and d["metadata"]["name"] == "gpu-webhook-quota-view"]
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(view))
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seeing-policy") / "policy.yaml"
    text = POLICY.read_text()
    assert text.count(CURRENT) == 1
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def replicas(cluster: ControlPlane, policy_file: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    workdir = tmp_path_factory.mktemp("seeing-webhook")
    with deployed(cluster, workdir, replicas=2, policy=policy_file, args=ARGS) as d, \
            d.installed():
        yield d


def developer(cp: ControlPlane, ns: str, path: Path) -> list[str]:
    """kubectl as a ServiceAccount of ``ns`` whose only grant is the `view` ClusterRole
    in its own namespace (a RoleBinding, as a platform team gives a team)."""
    service_account_kubeconfig(cp, ns, path, "dev-view", "--clusterrole=view")
    return [str(cp.bin_dir / "kubectl"), f"--kubeconfig={path}"]


def run(argv: list[str]) -> tuple[int, str, str]:
    import subprocess

    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout, done.stderr


def report_of(cp: ControlPlane, ns: str) -> dict[str, Any] | None:
    """The webhook's PolicyReport of ``ns``, or None while there is none."""
    return get_if_there(cp, ns, "policyreports.wgpolicyk8s.io", "gpu-webhook")


def test_a_developer_sees_used_and_free_gpus_and_the_audit_lists_pods_over_a_lowered_cap(
        cluster: ControlPlane, replicas: Deployment, policy_file: Path,
        tmp_path: Path) -> None:
    cp = cluster
    ns = f"e2e-audit-{short_id()}"  # tenant audit: 8 GPUs
    create_namespace(cp, ns, "audit")
    for name in ("a-0", "a-1", "a-2"):  # 6 GPUs, oldest first
        out = apply(cp, ns, gpu_pod(name, limits="2", requests="2"))
        assert out.returncode == 0, out.stderr
    other = f"e2e-audit-{short_id()}"
    create_namespace(cp, other, "audit")
    kubectl = developer(cp, ns, tmp_path / "dev.kubeconfig")

    # kubectl get, as the developer: the tenant's used and free GPUs.
    seen: list[str] = []

    def shows(row: list[str]) -> bool:
        code, out, err = run([*kubectl, "get", "gpuquotas", "-n", ns])
        seen[:] = [out + err]
        lines = [line.split() for line in out.splitlines()]
        return code == 0 and len(lines) == 2 and lines[1][:7] == row

    try:
        wait_until("the developer's kubectl get gpuquotas to show 6 used, 2 free",
                   lambda: shows(["audit", "audit", "6", "0", "8", "2", "3"]), TIMEOUT, 0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nlast output: {seen}\n{replicas.logs()}") from None
    code, out, _ = run([*kubectl, "get", "gpuquotas", "-n", ns])
    assert out.split()[:8] == ["NAME", "TENANT", "USED", "RESERVED", "LIMIT", "FREE", "PODS",
                               "AGE"]
    code, out, _ = run([*kubectl, "get", "gpuquota", "audit", "-n", ns, "-o", "json"])
    status = orjson.loads(out)["status"]
    assert status["caps"] == [
        {"scope": "tenant", "cap": "gpus", "used": 6, "reserved": 0, "limit": 8, "free": 2}]
    assert [c["gpus"] for c in status["topConsumers"]] == [2, 2, 2]
    assert status["policy"] == "e2e"
    # gpu-webhook status, as the same developer: it may not read the other namespaces,
    # their labels or the ledger, and shows the webhook's numbers from the object.
    done = gpu_webhook("status", "--kubeconfig", str(tmp_path / "dev.kubeconfig"),
                       "--policy", str(policy_file), "-n", ns, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ["audit", "tenant", "gpus", "6", "0", "8", "2"] in [
        line.split() for line in done.stdout.splitlines()]
    assert f"note: numbers from the webhook's GPUQuota {ns}/audit" in done.stdout
    # Its own namespace only: the same tenant's other namespace is not theirs to read.
    code, _, err = run([*kubectl, "get", "gpuquotas", "-n", other])
    assert code != 0 and "forbidden" in err.lower(), err
    # ... and the other namespace's own object says the same tenant-wide numbers (once
    # the leader has seen that namespace: it was made after the pods).
    wait_until("the tenant's other namespace to show the same 2 free GPUs", lambda: cp.kubectl(
        "get", "gpuquota", "audit", "-n", other, "-o", "jsonpath={.status.free}",
        check=False).stdout.strip() == "2", TIMEOUT, 0.5)

    # With nothing over a cap, the audit writes no report for the namespace.
    assert report_of(cp, ns) is None

    # The platform team lowers the cap under what runs.
    policy_file.write_text(policy_file.read_text().replace(CURRENT, LOWERED))

    def lists_a2() -> bool:
        rep = report_of(cp, ns)
        return bool(rep and any(r["resources"][0]["name"] == "a-2" for r in rep["results"]))

    try:
        wait_until("the PolicyReport to list pod a-2 over the lowered cap", lists_a2,
                   TIMEOUT, 0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{replicas.logs()}") from None
    rep = report_of(cp, ns)
    assert rep is not None
    [result] = rep["results"]
    assert (result["source"], result["policy"], result["rule"], result["result"]) == (
        "gpu-webhook", "e2e", "quota", "fail")
    assert result["resources"][0]["kind"] == "Pod"
    assert result["message"].startswith(f"pod {ns}/a-2: exceeded quota: tenant audit would "
                                        "use 6 of its 4 GPUs")
    assert result["properties"] == {"mode": "enforce"}
    assert rep["summary"] == {"pass": 0, "fail": 1, "warn": 0, "error": 0, "skip": 0}
    # As the README's tour shows it (the CRD's columns; no scope: a namespace's report).
    head, row = cp.kubectl("get", "policyreports", "-n", ns).stdout.splitlines()
    assert head.split() == ["NAME", "KIND", "NAME", "PASS", "FAIL", "WARN", "ERROR", "SKIP",
                            "AGE"]
    assert row.split()[:6] == ["gpu-webhook", "0", "1", "0", "0", "0"]
    # The developer's view follows the new cap: nothing free.
    wait_until("the developer's kubectl get gpuquotas to show the lowered cap",
               lambda: shows(["audit", "audit", "6", "0", "4", "0", "3"]), TIMEOUT, 0.5)

    # The one-shot audit against the same API server says the same, and exits 1.
    done = gpu_webhook("audit", "--kubeconfig", str(cp.kubeconfig), "-n", ns,
                       "--policy", str(policy_file), check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("REFUSED")] == [
        f"REFUSED pod {ns}/a-2: {result['message']}"]


def test_warn_mode_admissions_are_reported_as_warnings_of_their_pod(
        cluster: ControlPlane, replicas: Deployment) -> None:
    cp = cluster
    ns = f"e2e-trial-{short_id()}"  # tenant trial: warn mode, at most 1 GPU per pod
    create_namespace(cp, ns, "trial")
    out = apply(cp, ns, gpu_pod("big", limits="2", requests="2"))
    assert out.returncode == 0, out.stderr
    assert "Warning:" in out.stderr  # kubectl printed it at apply

    def warned() -> bool:
        rep = report_of(cp, ns)
        return bool(rep and rep["results"])

    try:
        wait_until("the PolicyReport to hold the warn-mode finding", warned, TIMEOUT, 0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{replicas.logs()}") from None
    rep = report_of(cp, ns)
    assert rep is not None
    [result] = rep["results"]
    assert (result["rule"], result["result"], result["properties"]) == (
        "max-gpus-per-pod", "warn", {"mode": "warn"})
    assert result["resources"][0]["name"] == "big"
    assert rep["summary"]["warn"] == 1

    # The pod gone, the report goes too.
    cp.kubectl("delete", "pod", "big", "-n", ns, "--wait=false")
    wait_until("the PolicyReport of a namespace with nothing to report to be deleted",
               lambda: report_of(cp, ns) is None, TIMEOUT, 0.5)


def test_one_replica_leads_at_a_time(cluster: ControlPlane, replicas: Deployment) -> None:
    ctx = ssl.create_default_context(cafile=str(replicas.ca_file))

    def leading() -> list[bool]:
        with httpx.Client(verify=ctx, timeout=10) as http:
            return [next(line for line in http.get(f"https://localhost:{r.port}/metrics")
                         .text.splitlines() if line.startswith("gpu_webhook_leader "))
                    == "gpu_webhook_leader 1.0" for r in replicas.replicas]

    wait_until("exactly one replica to say it leads (gpu_webhook_leader)",
               lambda: sum(leading()) == 1, TIMEOUT, 0.5)
    leader = replicas.replicas[leading().index(True)]
    lease = orjson.loads(cluster.kubectl("get", "lease", "gpu-webhook-leader", "-n",
                                         LEDGER_NAMESPACE, "-o", "json").stdout)
    assert lease["spec"]["leaseDurationSeconds"] == 15
    # The Lease names the replica that says it leads (its identity, from its log).
    assert f'"identity":"{lease["spec"]["holderIdentity"]}"' in leader.log()


def test_a_namespace_that_refuses_its_object_does_not_hold_up_the_others(
        cluster: ControlPlane, replicas: Deployment) -> None:
    cp = cluster
    # A namespace of tenant dryrun held in Terminating by a finalizer: its GPUQuota is
    # deleted by the namespace controller, and the API server refuses to create it again.
    stuck = f"e2e-dryrun-{short_id()}"
    create_namespace(cp, stuck, "dryrun")
    wait_until("the stuck namespace's GPUQuota", lambda: cp.kubectl(
        "get", "gpuquota", "dryrun", "-n", stuck, check=False).returncode == 0, TIMEOUT, 0.5)
    cp.kubectl("create", "configmap", "hold", "-n", stuck)
    cp.kubectl("patch", "configmap", "hold", "-n", stuck, "--type=merge",
               "-p", '{"metadata":{"finalizers":["e2e.gpu-webhook.dev/hold"]}}')
    cp.kubectl("delete", "namespace", stuck, "--wait=false")
    try:
        wait_until("the leader to be refused the stuck namespace's GPUQuota", lambda: any(
            "quota status object not written" in line and f"{stuck}/dryrun" in line
            for r in replicas.replicas for line in r.log().splitlines()), TIMEOUT, 0.5)
        # Meanwhile another namespace's object is still kept current.
        ns = f"e2e-gang-{short_id()}"  # tenant gang: 16 GPUs
        create_namespace(cp, ns, "gang")
        out = apply(cp, ns, gpu_pod("p", limits="4", requests="4"))
        assert out.returncode == 0, out.stderr
        wait_until("the gang tenant's GPUQuota to show 12 free", lambda: cp.kubectl(
            "get", "gpuquota", "gang", "-n", ns, "-o", "jsonpath={.status.free}",
            check=False).stdout.strip() == "12", TIMEOUT, 0.5)
    finally:
        cp.kubectl("patch", "configmap", "hold", "-n", stuck, "--type=merge",
                   "-p", '{"metadata":{"finalizers":null}}', check=False)


def test_when_the_leader_stops_the_other_replica_takes_over_the_status(
        cluster: ControlPlane, replicas: Deployment) -> None:
    # Last in this module: it stops a replica of the module's deployment.
    ctx = ssl.create_default_context(cafile=str(replicas.ca_file))

    def says_it_leads(r: Any) -> bool:
        with httpx.Client(verify=ctx, timeout=10) as http:
            return "gpu_webhook_leader 1.0" in http.get(
                f"https://localhost:{r.port}/metrics").text.splitlines()

    wait_until("a leader", lambda: any(says_it_leads(r) for r in replicas.replicas),
               TIMEOUT, 0.5)
    leader = next(r for r in replicas.replicas if says_it_leads(r))
    [other] = [r for r in replicas.replicas if r is not leader]
    assert replicas.proxy is not None
    replicas.proxy.remove(leader.port)  # its endpoint goes, as the Service's would
    leader.stop()  # SIGTERM: it drains and releases the Lease
    assert '"msg":"no longer leading"' in leader.log()
    wait_until("the other replica to lead", lambda: says_it_leads(other), TIMEOUT, 0.5)

    # ... and to keep the quota status current: a new pod shows in its namespace's object.
    ns = f"e2e-burst-{short_id()}"  # tenant burst: 10 GPUs
    create_namespace(cluster, ns, "burst")
    out = apply(cluster, ns, gpu_pod("p", limits="3", requests="3"))
    assert out.returncode == 0, out.stderr

    def free() -> Any:
        got = cluster.kubectl("get", "gpuquota", "burst", "-n", ns, "-o",
                              "jsonpath={.status.free}", check=False)
        return got.stdout.strip() if got.returncode == 0 else None

    wait_until("the new leader to write the burst tenant's 7 free GPUs",
               lambda: free() == "7", TIMEOUT, 0.5)


def test_the_lease_passes_on_expiry_and_at_once_on_release(cluster: ControlPlane) -> None:
    api = kube.connect(str(cluster.kubeconfig))
    leases = kube.Leases(api, LEDGER_NAMESPACE)
    name = f"leader-{short_id()}"
    a = Leadership(leases, name, "a", duration=2)
    b = Leadership(leases, name, "b", duration=2)
    assert a.try_once() and a.leading()
    assert not b.try_once()  # held, and b has only just seen it
    assert a.try_once()  # renewed
    assert not b.try_once() and not b.leading()
    # a stops renewing: b takes over once the Lease has stood still for its duration,
    # as b itself observed it.
    wait_until("b to take over the lease a stopped renewing", b.try_once, TIMEOUT, 0.2)
    assert not a.try_once()  # a's next round finds b holding it
    assert leases.read(name).holder == "b"  # type: ignore[union-attr]
    # Released at shutdown: a leads on its next round, without waiting.
    b.release()
    assert not b.leading()
    assert a.try_once()
    stored = leases.read(name)
    assert stored is not None and stored.holder == "a" and stored.transitions == 2


class _HeldRenewal(kube.Leases):
    """The real Leases, with the next write of this holder held until told: a renewal
    in flight (its thread still running) when the replica stops."""

    def __init__(self, api: Any, namespace: str) -> None:
        super().__init__(api, namespace)
        self.hold = False
        self.held = threading.Event()  # the renewal's write is waiting
        self.go = threading.Event()
        self.read_while_held = threading.Event()

    def read(self, name: str) -> kube.StoredLease | None:
        if self.held.is_set() and not self.go.is_set():
            self.read_while_held.set()
        return super().read(name)

    def write(self, name: str, holder: str, *args: Any, **kwargs: Any) -> None:
        if self.hold and holder:
            self.hold = False
            self.held.set()
            self.go.wait(TIMEOUT)
        super().write(name, holder, *args, **kwargs)


def test_a_renewal_in_flight_at_shutdown_neither_spoils_the_release_nor_leads_again(
        cluster: ControlPlane) -> None:
    # Found by the take-over test above: the replica's renewal thread (its task already
    # cancelled) wrote the Lease between the release's read and write; the release got a
    # conflict, the Lease stayed held, and the stopped replica went on leading.
    leases = _HeldRenewal(kube.connect(str(cluster.kubeconfig)), LEDGER_NAMESPACE)
    name = f"leader-{short_id()}"
    a = Leadership(leases, name, "a", duration=30)
    assert a.try_once()
    leases.hold = True
    renewal = threading.Thread(target=a.try_once)
    renewal.start()
    assert leases.held.wait(TIMEOUT)
    release = threading.Thread(target=a.release)
    release.start()
    # The release must wait for the renewal: it reads nothing while the renewal's write
    # is held. (Waited for a second; a release that wrongly goes ahead reads at once.)
    assert not leases.read_while_held.wait(1.0)
    leases.go.set()
    renewal.join(TIMEOUT)
    release.join(TIMEOUT)
    assert not a.leading()
    stored = leases.read(name)
    assert stored is not None and stored.holder == ""  # released: another leads at once
    assert not a.try_once() and not a.leading()  # and this replica never again
