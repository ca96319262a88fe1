"""The Helm chart on the real API server: the README's ``helm install`` creates every object
of the chart (the API server validating each one), its webhooks are then called for GPU
pods, and ``helm uninstall`` leaves none of them behind. Then the chart's GPUPolicy route
end to end: installed with ``policy.existingObject``, a replica run with the chart's own
args and the chart's ServiceAccount token (so with its RBAC, nothing more) issues its
certificate into the Secret, patches the caBundle of the chart's webhook configurations,
and serves the GPUPolicy applied with kubectl, which shows it Active.

No image can be built or run here: the chart's Deployment never gets pods (there is no
kubelet); the replica runs as a process, as the other e2e tests run theirs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import (
    LEDGER_NAMESPACE,
    ROOT,
    Replica,
    apply,
    crd_gone,
    crd_state,
    create_namespace,
    gpu_pod,
    short_id,
    wait_ready,
    wait_until,
)
from kit import console_script, free_port

pytestmark = pytest.mark.e2e

CHART = ROOT / "deploy" / "helm" / "gpu-webhook"
CRD = "gpupolicies.gpu-webhook.dev"
NS = LEDGER_NAMESPACE  # the README's namespace, which the session has created already


def readme_command(tool: str, verb: str) -> list[str]:
    """The README's one-line ``helm install`` / ``helm uninstall``, as a user copies it."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Installing on a cluster", 1)[1].split("\n## ", 1)[0]
    (line,) = [ln.split("#", 1)[0].strip() for ln in section.splitlines()
               if ln.startswith(f"{tool} {verb} ")]
    return line.split()


def manifest_objects(helm_run: Any) -> list[dict[str, Any]]:
    out = helm_run(["helm", "get", "manifest", "gpu-webhook", "-n", NS])
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def ref(obj: dict[str, Any]) -> list[str]:
    kind = obj["kind"].lower()
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    resource = f"{kind}.{group}" if group else kind
    args = [resource, obj["metadata"]["name"]]
    if obj["metadata"].get("namespace"):
        args += ["-n", obj["metadata"]["namespace"]]
    return args


def exists(cp: ControlPlane, obj: dict[str, Any]) -> bool:
    return cp.kubectl("get", *ref(obj), check=False).returncode == 0


def uninstall_leaves_nothing(cp: ControlPlane, helm_run: Any,
                             objects: list[dict[str, Any]]) -> None:
    out = helm_run(readme_command("helm", "uninstall"))
    assert out.returncode == 0, out.stderr
    assert "uninstalled" in out.stdout
    left: list[str] = []

    def there(obj: dict[str, Any]) -> bool:
        # A CRD is waited out through crd_gone, which requeues the API server's finalizer.
        if obj["kind"] == "CustomResourceDefinition":
            return not crd_gone(cp, obj["metadata"]["name"])
        return exists(cp, obj)

    def gone() -> bool:
        left[:] = [" ".join(ref(o)) for o in objects if there(o)]
        return not left

    try:
        wait_until("every object of the chart to be gone", gone, timeout=120, every=0.5)
    except AssertionError as exc:
        held = [crd_state(cp, o["metadata"]["name"]) for o in objects
                if o["kind"] == "CustomResourceDefinition"]
        raise AssertionError(f"{exc}; still there: {', '.join(left)}; "
                             f"{'; '.join(held)}") from None
    listed = cp.kubectl("get", "all,configmaps,secrets,roles,rolebindings,poddisruptionbudgets,"
                        "resourcequotas,serviceaccounts", "-n", NS, "-l",
                        "app.kubernetes.io/instance=gpu-webhook", "-o", "name").stdout
    assert listed.strip() == ""
    cluster = cp.kubectl("get", "clusterroles,clusterrolebindings,crds,"
                         "mutatingwebhookconfigurations,validatingwebhookconfigurations",
                         "-l", "app.kubernetes.io/instance=gpu-webhook", "-o", "name").stdout
    assert cluster.strip() == ""
    assert helm_run(["helm", "status", "gpu-webhook", "-n", NS]).returncode != 0


def test_the_readme_helm_install_creates_the_chart_and_uninstall_removes_it(
        control_plane: ControlPlane, helm_run: Any, no_crd: None) -> None:
    cp = control_plane
    install = readme_command("helm", "install")
    assert install[:3] == ["helm", "install", "gpu-webhook"]
    out = helm_run(install)
    assert out.returncode == 0, out.stderr
    assert "STATUS: deployed" in out.stdout
    objects = manifest_objects(helm_run)
    kinds = {o["kind"] for o in objects}
    assert {"CustomResourceDefinition", "Deployment", "Service", "ConfigMap",
            "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
            "PodDisruptionBudget", "ClusterRole", "Role"} <= kinds
    try:
        missing = [o["metadata"]["name"] for o in objects if not exists(cp, o)]
        assert missing == []
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}")
        # The API server calls the chart's webhooks: with no replica behind the Service
        # and failurePolicy Fail, a GPU pod is refused, naming the webhook.
        ns = f"e2e-helm-{short_id()}"
        create_namespace(cp, ns, "research")

        def refused() -> bool:
            done = apply(cp, ns, gpu_pod("p"), dry_run=True)
            return done.returncode != 0 and \
                'failed calling webhook "mutate.gpu-webhook.dev"' in done.stderr

        wait_until("the API server to call the chart's webhook", refused, timeout=60,
                   every=0.5)
    finally:
        uninstall_leaves_nothing(cp, helm_run, objects)
    # Gone, the webhook no longer blocks anything.
    wait_until("GPU pods to be admitted again", lambda: apply(
        cp, ns, gpu_pod("p"), dry_run=True).returncode == 0, timeout=60, every=0.5)


def sa_kubeconfig(cp: ControlPlane, path: Path) -> Path:
    token = cp.kubectl("create", "token", "gpu-webhook", "-n", NS, "--duration=1h").stdout.strip()
    config = yaml.safe_load(cp.kubeconfig.read_text())
    config["users"] = [{"name": "gpu-webhook", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "gpu-webhook"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def test_a_replica_with_the_charts_args_and_account_serves_an_existing_gpupolicy(
        control_plane: ControlPlane, helm_run: Any, no_crd: None, tmp_path: Path) -> None:
    cp = control_plane
    # failurePolicy Ignore: the GPUPolicy webhook has no replica behind its Service here.
    out = helm_run([*readme_command("helm", "install"), "--set",
                    "policy.existingObject=shared-gpu-cluster,failurePolicy=Ignore,"
                    "policy.quotaTenants={research,inference,notebooks}"])
    assert out.returncode == 0, out.stderr
    assert "The replicas serve GPUPolicy shared-gpu-cluster" in out.stdout
    objects = manifest_objects(helm_run)
    secret = ["secret", "gpu-webhook-tls", "-n", NS]
    replica: Replica | None = None
    try:
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}")
        cp.kubectl("apply", "-f", str(ROOT / "policies" / "multi-tenant.yaml"))
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        cert_dir = tmp_path / "certs"
        cert_dir.mkdir()
        port = free_port()
        args = [re.sub(r"^--cert-dir=.*", f"--cert-dir={cert_dir}",
                       re.sub(r"^--port=.*", f"--port={port}", a)) for a in container["args"]]
        assert "--policy-object=shared-gpu-cluster" in args and "--self-managed-certs" in args
        log = tmp_path / "replica.log"
        with open(log, "ab") as sink:
            process = subprocess.Popen(
                [console_script(), "serve", *args, "--host", "127.0.0.1", "--kubeconfig",
                 str(sa_kubeconfig(cp, tmp_path / "sa.kubeconfig")), "--namespace", NS,
                 "--cert-hosts=localhost"],
                env={**os.environ, "POD_NAME": "gpu-webhook-helm-0"},
                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True)
        replica = Replica(process, port, log)
        wait_until("the replica to issue its certificate into the Secret", lambda: cp.kubectl(
            "get", *secret, check=False).returncode == 0 or process.poll() is not None,
            timeout=60, every=0.5)
        assert process.poll() is None, replica.log()[-3000:]
        data = json.loads(cp.kubectl("get", *secret, "-o", "json").stdout)["data"]
        ca_file = tmp_path / "ca.crt"
        ca_file.write_bytes(base64.b64decode(data["ca.crt"]))
        wait_ready(replica, ca_file)

        def served() -> bool:
            obj = json.loads(cp.kubectl("get", "gpupolicy", "shared-gpu-cluster", "-o",
                                        "json").stdout)
            status = obj.get("status") or {}
            active = {c["type"]: c for c in status.get("conditions") or ()}.get("Active", {})
            return (active.get("status") == "True" and status.get("tenants") == 3
                    and [r["name"] for r in status.get("replicas") or ()]
                    == ["gpu-webhook-helm-0"])

        wait_until("the GPUPolicy to be Active on the replica", served, timeout=60, every=0.5)
        bundles = cp.kubectl("get", "mutatingwebhookconfiguration", "gpu-webhook", "-o",
                             "jsonpath={.webhooks[*].clientConfig.caBundle}").stdout.split()
        assert bundles and all(base64.b64decode(b) == ca_file.read_bytes() for b in bundles)
    finally:
        if replica is not None:
            replica.stop()
            assert "Traceback" not in replica.log(), replica.log()[-3000:]
        # The replicas' own objects are not the chart's: the certificate Secret (like the
        # quota ledgers) goes with the namespace, or by hand.
        cp.kubectl("delete", *secret, "--ignore-not-found")
        uninstall_leaves_nothing(cp, helm_run, objects)
