"""The native admission policies kept in step with the served policy, by the leader, on
the real API server: an install in admission mode ``fallback`` records the mode on its
webhook configurations; the leader (``--webhook-configurations-sync fix``) renders the
policy's MutatingAdmissionPolicies, ValidatingAdmissionPolicies and bindings and applies
them, writes back one deleted by hand, adds a new tenant's after a policy edit, and
``gpu-webhook status`` reports them in step (or what differs, with ``report``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import LEDGER_NAMESPACE, Deployment, apply, deployed, gpu_webhook, wait_until

pytestmark = pytest.mark.e2e

POLICY = Path(__file__).parent / "policies" / "native.yaml"
INTERVAL = 2  # --quota-status-seconds: how often the leader compares
PLURALS = {"MutatingAdmissionPolicy": "mutatingadmissionpolicies",
           "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
           "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
           "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}
KINDS = tuple(PLURALS.values())
SELECTOR = "app.kubernetes.io/component=admission-policy"


def held(cp: ControlPlane) -> set[str]:
    """The native objects the API server holds: ``kind/name``."""
    out = set()
    for kind in KINDS:
        items = json.loads(cp.kubectl("get", kind, "-l", SELECTOR, "-o", "json").stdout)
        out |= {f"{kind}/{o['metadata']['name']}" for o in items["items"]}
    return out


def rendered(policy: Path, d: Deployment) -> set[str]:
    """The native objects ``gpu-webhook manifests`` renders for the policy: ``kind/name``."""
    out = gpu_webhook("manifests", "--policy", str(policy), "--url", d.url, "--ca-file",
                      str(d.ca_file), "--admission-mode", "fallback").stdout
    return {f"{PLURALS[doc['kind']]}/{doc['metadata']['name']}"
            for doc in yaml.safe_load_all(out) if doc and doc["kind"] in PLURALS}


def status(cp: ControlPlane, policy: Path) -> str:
    return gpu_webhook("status", "--policy", str(policy), "--kubeconfig", str(cp.kubeconfig),
                       "--webhook-namespace", LEDGER_NAMESPACE).stdout


@contextlib.contextmanager
def keeping(cp: ControlPlane, tmp_path: Path, sync: str) -> Iterator[tuple[Deployment, Path]]:
    """One replica serving a copy of the policy (to edit), the configurations of admission
    mode fallback installed without the native objects: the leader's to write."""
    policy = tmp_path / "policy.yaml"
    # The suite's probe namespace (how it sees the webhook installed) is no tenant's.
    policy.write_text(POLICY.read_text().replace("unassignedNamespaces: deny",
                                                 "unassignedNamespaces: allow"))
    with deployed(cp, tmp_path, policy=policy, args=[
            "--webhook-configurations-sync", sync, "--quota-status-seconds", str(INTERVAL),
            "--policy-poll-seconds", "0.5"]) as d:
        out = gpu_webhook("manifests", "--policy", str(policy), "--url", d.url,
                          "--ca-file", str(d.ca_file), "--admission-mode", "fallback").stdout
        docs: list[dict[str, Any]] = [doc for doc in yaml.safe_load_all(out)
                                      if doc and "WebhookConfiguration" in doc["kind"]]
        with d.installed(docs):
            try:
                yield d, policy
            finally:
                # Gone before the configurations are: the API server's policies would
                # go on changing the probe pod that shows the webhook uninstalled.
                d.stop()  # no leader writes them again
                for kind in KINDS:
                    cp.kubectl("delete", kind, "-l", SELECTOR, "--ignore-not-found")
                wait_until("the native policies to go", lambda: not held(cp), timeout=30)


def test_the_leader_writes_the_native_policies_the_policy_needs(
        control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    with keeping(cp, tmp_path, "fix") as (d, policy):
        want = rendered(policy, d)
        wait_until("the leader to write the native policies", lambda: held(cp) == want,
                   timeout=30, every=0.5)
        wait_until("status to say they are in step", lambda: (
            "native admission policies: admission policies gpu-webhook.* as the policy needs"
            in status(cp, policy)), timeout=3 * INTERVAL + 10, every=1)

        # One deleted by hand is written back within an interval.
        cp.kubectl("delete", "validatingadmissionpolicybinding", "gpu-webhook.alpha")
        wait_until("the leader to write it back", lambda: held(cp) == want,
                   timeout=3 * INTERVAL + 10, every=0.5)
        assert d.logged("native admission policies written as the policy needs")

        # A new tenant: its policies come with the policy edit.
        cp.kubectl("create", "namespace", "keeper-delta")
        policy.write_text(policy.read_text() + """
    - name: delta
      namespaces: [keeper-delta]
""")
        wait_until("the new tenant's policies", lambda: (
            "mutatingadmissionpolicies/gpu-webhook.delta" in held(cp)), timeout=30, every=0.5)
        assert held(cp) == rendered(policy, d)

        def voided() -> bool:
            out = apply(cp, "keeper-delta", {"apiVersion": "v1", "kind": "Pod",
                                              "metadata": {"name": "web"},
                                              "spec": {"containers": [{"name": "c",
                                                                       "image": "x"}]}},
                        dry_run=True)
            env = yaml.safe_load(out.stdout)["spec"]["containers"][0].get("env") \
                if out.returncode == 0 else None
            return env == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]

        # Sent to the webhook's routes as well; the API server's policy voids it too.
        wait_until("a pod of the new tenant voided", voided, timeout=30, every=0.5)


def test_with_report_the_leader_only_says_what_is_missing(
        control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    with keeping(cp, tmp_path, "report") as (_d, policy):
        wait_until("status to report the native policies missing", lambda: (
            "native admission policies: admission policies gpu-webhook.*: missing "
            "MutatingAdmissionPolicy/gpu-webhook.alpha" in status(cp, policy)),
            timeout=3 * INTERVAL + 10, every=1)
        assert not held(cp)
