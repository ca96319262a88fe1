"""Two replicas serving a GPUPolicy object (``serve --policy-object``) on the real API
server: the object's status shows it Accepted and Active on both, by pod name and
generation, with its tenants in ``kubectl get gpupolicies``; an edit is served by both
and decides the next pod; an edit the loader refuses, stored while the GPUPolicy
validating webhook is absent (as when it fails open), is refused in the status with the
located message while both keep the last good generation; a replica restarted then
serves the last accepted generation; a fixed edit is Active again on both.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import (
    LEDGER_NAMESPACE,
    POLICY,
    ROOT,
    Deployment,
    Replica,
    RoundRobinProxy,
    apply,
    assert_denied,
    gpu_pod,
    gpu_webhook,
    sees_free_gpus,
    wait_ready,
    wait_until,
)
from kit import console_script, free_port

pytestmark = pytest.mark.e2e

CRD = ROOT / "deploy" / "base" / "crd-gpupolicy.yaml"
NAME = "e2e-served"
PODS = ("gpu-webhook-7d9f-a", "gpu-webhook-7d9f-b")
TENANTS = len(yaml.safe_load(POLICY.read_text())["spec"]["tenants"])


def policy_text(max_ops: int = 8, extra_product: bool = False) -> str:
    """The e2e policy as GPUPolicy NAME, the ops tenant's maxGpusPerPod set; with
    ``extra_product``, the research tenant names a product the policy does not define
    (a mistake only the loader sees, not the CRD's schema)."""
    text = POLICY.read_text().replace("  name: e2e\n", f"  name: {NAME}\n", 1)
    ops = "    - name: ops\n"
    head, tail = text.split(ops, 1)
    assert "      maxGpusPerPod: 8\n" in tail
    text = head + ops + tail.replace("      maxGpusPerPod: 8\n",
                                     f"      maxGpusPerPod: {max_ops}\n", 1)
    if extra_product:
        text = text.replace("allowedProducts: [a100, h100]", "allowedProducts: [a100, h100, b200]",
                            1)
    return text


def start(workdir: Path, cert_dir: Path, kubeconfig: Path, pod: str,
          port: int | None = None) -> Replica:
    port = port or free_port()
    log_path = workdir / f"{pod}.log"
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            [console_script(), "serve", "--host", "127.0.0.1", "--port", str(port),
             "--cert-dir", str(cert_dir), "--policy-object", NAME,
             "--kubeconfig", str(kubeconfig), "--namespace", LEDGER_NAMESPACE],
            env={**os.environ, "POD_NAME": pod}, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)
    return Replica(process, port, log_path)


@pytest.fixture(scope="module")
def crd(control_plane: ControlPlane) -> Iterator[None]:
    # Another module may have just deleted the CRD: wait until it is gone, not going.
    wait_until("the GPUPolicy CRD not to be terminating", lambda: control_plane.kubectl(
        "get", "crd", "gpupolicies.gpu-webhook.dev", "-o",
        "jsonpath={.metadata.deletionTimestamp}", check=False).stdout.strip() == "",
        timeout=60, every=0.5)
    control_plane.kubectl("apply", "-f", str(CRD))
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                          "crd/gpupolicies.gpu-webhook.dev")
    yield
    control_plane.kubectl("delete", "gpupolicy", NAME, "--ignore-not-found")


@pytest.fixture(scope="module")
def served(control_plane: ControlPlane, crd: None,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Two replicas of GPUPolicy NAME behind a proxy, with the pod webhooks installed but
    not the GPUPolicy one (so that a bad edit reaches the replicas)."""
    workdir = tmp_path_factory.mktemp("policy-object")
    cert_dir = workdir / "certs"
    gpu_webhook("certs", "--out", str(cert_dir), "--dns", "localhost", "--ip", "127.0.0.1")
    control_plane.kubectl("apply", "-f", "-", input=policy_text())
    d = Deployment(control_plane, workdir, cert_dir, POLICY)
    try:
        d.replicas = [start(workdir, cert_dir, control_plane.kubeconfig, p) for p in PODS]
        for r in d.replicas:
            wait_ready(r, d.ca_file)
        d.proxy = RoundRobinProxy([r.port for r in d.replicas]).start()
        docs = [doc for doc in yaml.safe_load_all(d.render()) if doc]
        for doc in docs:
            doc["webhooks"] = [h for h in doc["webhooks"]
                               if h["name"] != "policies.gpu-webhook.dev"]
        with d.installed(docs):
            yield d
    finally:
        d.stop()


def read(cp: ControlPlane) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(cp.kubectl("get", "gpupolicy", NAME, "-o", "json").stdout)
    return obj


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c["type"] == kind:
            return dict(c)
    return {}


def served_by_both(cp: ControlPlane, generation: int) -> bool:
    obj = read(cp)
    replicas = {r["name"]: r["servedGeneration"]
                for r in (obj.get("status") or {}).get("replicas") or ()}
    active = condition(obj, "Active")
    return (obj["metadata"]["generation"] == generation
            and replicas == dict.fromkeys(PODS, generation)
            and active.get("status") == "True"
            and active.get("observedGeneration") == generation)


def edit(cp: ControlPlane, text: str) -> int:
    cp.kubectl("apply", "-f", "-", input=text)
    return int(read(cp)["metadata"]["generation"])


def test_a_gpupolicy_is_accepted_and_active_on_both_replicas_and_decides_pods(
        control_plane: ControlPlane, served: Deployment, namespace: Any) -> None:
    cp = control_plane
    generation = int(read(cp)["metadata"]["generation"])
    wait_until("both replicas to report the GPUPolicy served",
               lambda: served_by_both(cp, generation), timeout=60, every=0.5)
    obj = read(cp)
    assert condition(obj, "Accepted")["status"] == "True"
    assert condition(obj, "Accepted")["observedGeneration"] == generation
    assert obj["status"]["tenants"] == TENANTS
    assert obj["status"]["lastAccepted"]["generation"] == generation
    header, row = cp.kubectl("get", "gpupolicy", NAME).stdout.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "TENANTS", "MODE", "ACTIVE"]
    assert row.split()[:4] == [NAME, str(TENANTS), "enforce", "True"]

    ns = namespace("ops")
    assert sees_free_gpus(served, ns, 4)  # maxGpusPerPod 8
    lowered = edit(cp, policy_text(max_ops=2))
    assert lowered == generation + 1
    wait_until("both replicas to serve the edit", lambda: served_by_both(cp, lowered),
               timeout=60, every=0.5)
    assert not sees_free_gpus(served, ns, 4)  # each replica now refuses it
    out = apply(cp, ns, gpu_pod("four", limits="4"), dry_run=True)
    assert_denied(out, "max-gpus-per-pod", webhook=served.validating)


def test_a_refused_edit_keeps_the_last_good_one_even_across_a_restart(
        control_plane: ControlPlane, served: Deployment, namespace: Any) -> None:
    cp = control_plane
    good = edit(cp, policy_text(max_ops=2))  # as the previous test left it
    wait_until("both replicas to serve the good policy", lambda: served_by_both(cp, good),
               timeout=60, every=0.5)
    # The CRD's schema takes it (no GPUPolicy webhook here, as when it fails open); the
    # loader does not.
    bad = edit(cp, policy_text(max_ops=8, extra_product=True))
    assert bad == good + 1

    def refused() -> bool:
        obj = read(cp)
        accepted, active = condition(obj, "Accepted"), condition(obj, "Active")
        return (accepted.get("status") == "False" and accepted.get("observedGeneration") == bad
                and active.get("reason") == "ServingLastAccepted")

    wait_until("the status to say the edit is refused", refused, timeout=60, every=0.5)
    obj = read(cp)
    assert ("spec.tenants[0].allowedProducts[2]: tenant research: product 'b200' is not "
            "defined") in condition(obj, "Accepted")["message"]
    assert condition(obj, "Active")["status"] == "False"
    assert {r["name"]: r["servedGeneration"] for r in obj["status"]["replicas"]} == \
        dict.fromkeys(PODS, good)
    assert obj["status"]["lastAccepted"]["generation"] == good
    row = cp.kubectl("get", "gpupolicy", NAME).stdout.splitlines()[1].split()
    assert row[1:4] == [str(TENANTS), "enforce", "False"]
    ns = namespace("ops")
    assert not sees_free_gpus(served, ns, 4)  # still maxGpusPerPod 2, not the refused 8

    # A replica that starts now serves the last accepted generation.
    first = served.replicas[0]
    first.stop()
    # A clean stop takes the replica's entry out: the status lists who serves, not who did.
    wait_until("the stopped replica to leave the status", lambda: [
        r["name"] for r in read(cp)["status"]["replicas"]] == [PODS[1]], timeout=60, every=0.5)
    # On the same port: the proxy (the Service) sends it its share again.
    restarted = start(served.workdir, served.cert_dir, cp.kubeconfig, PODS[0], first.port)
    served.replicas[0] = restarted
    wait_ready(restarted, served.ca_file)
    assert "serving the last accepted generation of the GPUPolicy" in restarted.log()
    assert not sees_free_gpus(served, ns, 4)
    wait_until("the restarted replica to report the last accepted generation", lambda: {
        r["name"]: r["servedGeneration"] for r in read(cp)["status"]["replicas"]}
        == dict.fromkeys(PODS, good), timeout=60, every=0.5)

    fixed = edit(cp, policy_text(max_ops=8))
    wait_until("both replicas to serve the fixed policy", lambda: served_by_both(cp, fixed),
               timeout=60, every=0.5)
    assert condition(read(cp), "Accepted")["status"] == "True"
    assert sees_free_gpus(served, ns, 4)


def test_a_replica_with_nothing_to_serve_does_not_start(control_plane: ControlPlane, crd: None,
                                                        tmp_path: Path) -> None:
    def serve(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [console_script(), "serve", "--host", "127.0.0.1", "--port", str(free_port()),
             "--cert-dir", str(tmp_path / "certs"), "--policy-object", name,
             "--kubeconfig", str(control_plane.kubeconfig), "--namespace", LEDGER_NAMESPACE],
            capture_output=True, text=True, timeout=120, check=False)

    missing = serve("e2e-missing")
    assert missing.returncode == 2
    assert missing.stdout.startswith(
        "gpu-webhook: cannot start, GPUPolicy e2e-missing does not exist (--policy-object)")

    # Refused from its first generation (no GPUPolicy webhook here): nothing to fall back on.
    never = policy_text(extra_product=True).replace(f"name: {NAME}\n", "name: e2e-never\n", 1)
    control_plane.kubectl("apply", "-f", "-", input=never)
    try:
        refused = serve("e2e-never")
    finally:
        control_plane.kubectl("delete", "gpupolicy", "e2e-never")
    assert refused.returncode == 2
    assert "Traceback" not in refused.stdout + refused.stderr
    lines = refused.stdout.splitlines()
    assert lines[0] == ("gpu-webhook: cannot start, GPUPolicy e2e-never is refused, and no "
                        "accepted generation of it is recorded in its status:")
    assert ("GPUPolicy e2e-never: spec.tenants[0].allowedProducts[2]: tenant research: "
            "product 'b200' is not defined") in lines[1]
