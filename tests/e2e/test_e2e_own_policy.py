"""A platform team's own policy installed with the Helm chart and with kustomize, on the
real API server: tenants chosen by the team's own namespace label (not the example's),
a replica run with the install's own args and service account (its RBAC, nothing more),
and a pod of a tenant's namespace that asks for no GPU gets ``NVIDIA_VISIBLE_DEVICES=void``:
the leader wrote the routes this policy needs into the configurations the install made
from deploy/base. A chart value that changes the policy changes the routes on
``helm upgrade``.

No image runs here (no kubelet): the replica is a process, its policy file the
ConfigMap's text written where the kubelet would mount it (and written again after an
upgrade, as the kubelet refreshes the mount). The API server here cannot reach a
Service (no pod, no cluster DNS), so the install record on the configurations is pointed
at the replica's URL, as ``gpu-webhook manifests --url`` records it for a webhook outside
the cluster; the leader renders every webhook's clientConfig from it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import readmekit
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import (
    LEDGER_NAMESPACE,
    Replica,
    apply,
    delete_crds,
    plain_pod,
    short_id,
    wait_ready,
    wait_until,
)
from kit import console_script, free_port
from test_e2e_helm import (
    manifest_objects,
    sa_kubeconfig,
    uninstall_leaves_nothing,
)

pytestmark = pytest.mark.e2e

NS = LEDGER_NAMESPACE
TEAM_LABEL = "platform.acme.io/team"
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
INSTALL = "gpu-webhook.dev/install"


def team_policy(*teams: str) -> str:
    tenants = "".join(f"""
    - name: {t}
      namespaceSelector: {{matchLabels: {{{TEAM_LABEL}: {t}}}}}
      quota: {{gpus: 8}}""" for t in teams)
    return f"""# The platform team's policy: teams chosen by their own namespace label.
apiVersion: gpu-webhook.dev/v1alpha1
kind: GPUPolicy
metadata: {{name: acme}}
spec:
  gpuResources: {{names: [nvidia.com/gpu]}}
  tenants:{tenants}
"""


def team_namespace(cp: ControlPlane, team: str) -> str:
    ns = f"e2e-{team}-{short_id()}"
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {TEAM_LABEL: team}}}))
    return ns


def voided(cp: ControlPlane, ns: str) -> bool:
    """A pod that asks for no GPU, created as a dry run in ``ns``: whether its container
    got NVIDIA_VISIBLE_DEVICES=void (the API server sent it to the routes webhook)."""
    out = apply(cp, ns, plain_pod(f"web-{short_id()}"), dry_run=True)
    assert out.returncode == 0, out.stderr
    return VOID in (yaml.safe_load(out.stdout)["spec"]["containers"][0].get("env") or [])


def point_at(cp: ControlPlane, url: str) -> None:
    """Record the replica's URL in both configurations' install record."""
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        obj = json.loads(cp.kubectl("get", kind, "gpu-webhook", "-o", "json").stdout)
        record = json.loads(obj["metadata"]["annotations"][INSTALL])
        record.pop("service", None)
        record["url"] = url
        cp.kubectl("annotate", "--overwrite", kind, "gpu-webhook",
                   f"{INSTALL}={json.dumps(record, sort_keys=True)}")


def deployment_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def policy_text(cp: ControlPlane) -> str:
    return str(json.loads(cp.kubectl("get", "configmap", "gpu-webhook-policy", "-n", NS, "-o",
                                     "json").stdout)["data"]["policy.yaml"])


@contextlib.contextmanager
def replica_as_deployed(cp: ControlPlane, container: dict[str, Any], tmp_path: Path,
                        port: int | None = None) -> Iterator[tuple[Replica, Path]]:
    """``gpu-webhook serve`` with the Deployment's args (paths and port made local),
    the installed ConfigMap's policy, and the install's service account; on ``port``
    (where the install calls it, chart value ``webhookURL``), else on a free one, where
    the install record is pointed."""
    cert_dir, policy = tmp_path / "certs", tmp_path / "served" / "policy.yaml"
    cert_dir.mkdir()
    policy.parent.mkdir()
    policy.write_text(policy_text(cp))
    called = port is not None
    port = port or free_port()
    local = {"--cert-dir": str(cert_dir), "--port": str(port), "--policy": str(policy)}
    args = [re.sub(r"^(--[a-z-]+)=.*", lambda m: f"{m[1]}={local[m[1]]}", a)
            if a.split("=", 1)[0] in local else a for a in container["args"]]
    assert "--webhook-configurations-sync=fix" in args, args
    log = tmp_path / "replica.log"
    with open(log, "ab") as sink:
        process = subprocess.Popen(
            [console_script(), "serve", *args, "--host", "127.0.0.1", "--kubeconfig",
             str(sa_kubeconfig(cp, tmp_path / "sa.kubeconfig")), "--namespace", NS,
             "--cert-hosts=localhost", "--quota-status-seconds=2", "--policy-poll-seconds=0.5"],
            env={**os.environ, "POD_NAME": "gpu-webhook-own-0"},
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True)
    replica = Replica(process, port, log)
    secret = ["get", "secret", "gpu-webhook-tls", "-n", NS]
    try:
        wait_until("the replica to issue its certificate into the Secret", lambda: cp.kubectl(
            *secret, check=False).returncode == 0 or process.poll() is not None,
            timeout=60, every=0.5)
        assert process.poll() is None, replica.log()[-3000:]
        ca = tmp_path / "ca.crt"
        ca.write_bytes(base64.b64decode(json.loads(cp.kubectl(*secret, "-o", "json").stdout)[
            "data"]["ca.crt"]))
        wait_ready(replica, ca)
        if not called:
            point_at(cp, f"https://localhost:{port}")
        yield replica, policy
    finally:
        replica.stop()
        assert "Traceback" not in replica.log(), replica.log()[-3000:]


def test_the_chart_with_a_teams_policy_routes_the_teams_namespaces_and_follows_upgrades(
        control_plane: ControlPlane, helm_run: Any, no_crd: None, tmp_path: Path) -> None:
    cp = control_plane
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(team_policy("vision"))
    port = free_port()
    here = ["--set", f"webhookURL=https://localhost:{port}"]  # where the replica runs
    # deploy/README.md's install with a policy file, the file here.
    (install,) = [ln for ln in readmekit.own_policy_section().splitlines()
                  if ln.startswith("helm install ")]
    out = helm_run([*(w.replace("=policy.yaml", f"={policy_file}") for w in install.split()),
                    *here])
    assert out.returncode == 0, out.stderr
    objects = manifest_objects(helm_run)
    secret = ["secret", "gpu-webhook-tls", "-n", NS]
    try:
        assert policy_text(cp) == team_policy("vision")
        vision, speech = team_namespace(cp, "vision"), team_namespace(cp, "speech")
        with replica_as_deployed(cp, deployment_container(objects), tmp_path,
                                 port) as (_replica, served):
            wait_until("the vision team's pods to be sent and neutralised",
                       lambda: voided(cp, vision), timeout=60, every=0.5)
            assert not voided(cp, speech)  # not a tenant yet
            # The example's routes are gone: the chart's objects hold the team's selector.
            routes = json.dumps(json.loads(cp.kubectl(
                "get", "mutatingwebhookconfiguration", "gpu-webhook", "-o",
                "json").stdout)["webhooks"])
            assert TEAM_LABEL in routes and "gpu.example.com/tenant" not in routes

            policy_file.write_text(team_policy("vision", "speech"))
            out = helm_run(["helm", "upgrade", "gpu-webhook", "deploy/helm/gpu-webhook",
                            "-n", NS, "--set-file", f"policy.inline={policy_file}", *here])
            assert out.returncode == 0, out.stderr
            # The leader's webhooks were kept by the upgrade (not the example's again),
            # those that never fail closed still ignoring failures.
            kept = json.dumps(json.loads(cp.kubectl(
                "get", "mutatingwebhookconfiguration", "gpu-webhook", "-o",
                "json").stdout)["webhooks"])
            assert TEAM_LABEL in kept and "gpu.example.com/tenant" not in kept
            validating = {h["name"]: h["failurePolicy"] for h in json.loads(cp.kubectl(
                "get", "validatingwebhookconfiguration", "gpu-webhook", "-o",
                "json").stdout)["webhooks"]}
            assert validating["policy-file.gpu-webhook.dev"] == "Ignore"
            assert validating["scale.gpu-webhook.dev"] == "Ignore"
            assert validating["validate.gpu-webhook.dev"] == "Fail"
            served.write_text(policy_text(cp))  # the kubelet refreshes the mounted file
            wait_until("the speech team's pods to be sent after the upgrade",
                       lambda: voided(cp, speech), timeout=60, every=0.5)
            assert voided(cp, vision)

            # A policy that does not load fails the upgrade, located by line.
            policy_file.write_text(team_policy("vision").replace("gpus: 8", "gpus: lots"))
            out = helm_run(["helm", "upgrade", "gpu-webhook", "deploy/helm/gpu-webhook",
                            "-n", NS, "--set-file", f"policy.inline={policy_file}", *here])
            assert out.returncode != 0
            assert 'admission webhook "policy-file.gpu-webhook.dev" denied' in out.stderr
            assert re.search(r"configmap gpu-webhook/gpu-webhook-policy:\d+: "
                             r"spec\.tenants\[0\]\.quota\.gpus: must be a number",
                             out.stderr), out.stderr
            assert policy_text(cp) == team_policy("vision", "speech")  # as it was
    finally:
        cp.kubectl("delete", *secret, "--ignore-not-found")
        uninstall_leaves_nothing(cp, helm_run, objects)


def test_kustomize_with_a_teams_policy_routes_the_teams_namespaces(
        control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    # deploy/README.md's overlay, beside the team's policy file.
    overlay = readmekit.own_policy_overlay(tmp_path / "tree", team_policy("vision"))
    built = cp.kubectl("kustomize", str(overlay)).stdout
    objects = [d for d in yaml.safe_load_all(built) if d]
    cp.kubectl("apply", "--server-side", "-f", "-", input=built)
    try:
        vision = team_namespace(cp, "vision")
        with replica_as_deployed(cp, deployment_container(objects), tmp_path):
            wait_until("the vision team's pods to be sent and neutralised",
                       lambda: voided(cp, vision), timeout=60, every=0.5)
    finally:
        for obj in objects:
            if obj["kind"] in ("Namespace", "CustomResourceDefinition"):
                continue  # the session's namespace; the CRDs below, waited out
            ref = [obj["kind"].lower(), obj["metadata"]["name"]]
            if obj["metadata"].get("namespace"):
                ref += ["-n", obj["metadata"]["namespace"]]
            cp.kubectl("delete", *ref, "--ignore-not-found", "--wait=false")
        cp.kubectl("delete", "secret", "gpu-webhook-tls", "-n", NS, "--ignore-not-found")
        # The chart's tests install these CRDs as the release's own.
        delete_crds(cp, *[o["metadata"]["name"] for o in objects
                          if o["kind"] == "CustomResourceDefinition"])
