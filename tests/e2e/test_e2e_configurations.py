"""The webhook configurations kept as the served policy needs them, on the real API
server: the leader compares what the API server holds (its defaults filled in) with what
the policy needs, reports a hand edit that drops a tenant's namespaces from the routes
(metric, /readyz, an Event, ``gpu-webhook status``) within one status interval, and with
``--webhook-configurations-sync fix`` writes it back; a policy edit that adds a tenant
chosen by another label gets that tenant's namespaces routed, so a pod there that asks
for no GPU gets ``NVIDIA_VISIBLE_DEVICES=void``. ``gpu-webhook status`` says when no
replica leads.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import (
    LEDGER_NAMESPACE,
    POLICY,
    TENANT_LABEL,
    Deployment,
    apply,
    create_namespace,
    deployed,
    gpu_webhook,
    plain_pod,
    short_id,
    wait_until,
)
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

MUTATING = "MutatingWebhookConfiguration gpu-webhook"
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
INTERVAL = 2  # --quota-status-seconds: how often the leader compares


@contextlib.contextmanager
def keeping(cp: ControlPlane, tmp_path: Path, sync: str) -> Iterator[tuple[Deployment, Path]]:
    """One replica serving a copy of the e2e policy (to edit), comparing the
    configurations every INTERVAL seconds with ``sync``, and the configurations
    installed as ``gpu-webhook manifests`` renders them."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text())
    with deployed(cp, tmp_path, policy=policy, args=[
            "--webhook-configurations-sync", sync, "--quota-status-seconds", str(INTERVAL),
            "--policy-poll-seconds", "0.5"]) as d, d.installed():
        yield d, policy


def get(d: Deployment, path: str) -> httpx.Response:
    return httpx.get(f"https://localhost:{d.replicas[0].port}{path}", verify=str(d.ca_file),
                     timeout=10)


def said(d: Deployment) -> str:
    return str(get(d, "/readyz").json().get("webhookConfigurations"))


def drift_metric(d: Deployment) -> float | None:
    for family in text_string_to_metric_families(get(d, "/metrics").text):
        for sample in family.samples:
            if (sample.name == "gpu_webhook_configuration_drift"
                    and sample.labels.get("configuration") == MUTATING):
                return float(sample.value)
    return None


def mutating(cp: ControlPlane) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(cp.kubectl(
        "get", "mutatingwebhookconfiguration", "gpu-webhook", "-o", "json").stdout)
    return obj


def drop_tenant_from_routes(cp: ControlPlane, tenant: str) -> str:
    """Edit the routes by hand as someone might: ``tenant``'s namespaces are no longer
    sent. Returns the name of the routes webhook edited."""
    obj = mutating(cp)
    for hook in obj["webhooks"]:
        for e in (hook.get("namespaceSelector") or {}).get("matchExpressions") or ():
            if e["key"] == TENANT_LABEL and tenant in e["values"]:
                e["values"].remove(tenant)
                cp.kubectl("replace", "-f", "-", input=json.dumps(obj))
                return str(hook["name"])
    raise AssertionError(f"no routes webhook sends tenant {tenant}'s namespaces")


def labelled_namespace(cp: ControlPlane, labels: dict[str, str]) -> str:
    """A new namespace with ``labels``."""
    ns = f"e2e-cfg-{short_id()}"
    meta = {"name": ns, "labels": labels}
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}))
    return ns


def voided(cp: ControlPlane, ns: str) -> bool:
    """Whether a plain pod created (as a dry run) in ``ns`` gets NVIDIA_VISIBLE_DEVICES=void:
    the API server sent it to the routes webhook."""
    out = apply(cp, ns, plain_pod(f"web-{short_id()}"), dry_run=True)
    assert out.returncode == 0, out.stderr
    env = yaml.safe_load(out.stdout)["spec"]["containers"][0].get("env") or []
    return VOID in env


def events(cp: ControlPlane, reason: str) -> dict[str, str]:
    """The Events of ``reason`` (where cluster-scoped objects' are): name -> message."""
    out = cp.kubectl("get", "events", "-n", "default", "--field-selector",
                     f"reason={reason}", "-o", "json")
    return {e["metadata"]["name"]: str(e.get("message"))
            for e in json.loads(out.stdout)["items"]}


def new_events(cp: ControlPlane, reason: str, before: dict[str, str]) -> list[str]:
    return [m for name, m in events(cp, reason).items() if name not in before]


def status(cp: ControlPlane, policy: Path) -> str:
    return gpu_webhook("status", "--policy", str(policy), "--kubeconfig", str(cp.kubeconfig),
                       "--webhook-namespace", LEDGER_NAMESPACE).stdout


def test_a_hand_edit_that_drops_a_tenants_routes_is_reported_within_an_interval(
        control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    ns = f"e2e-research-{short_id()}"
    create_namespace(cp, ns, "research")
    with keeping(cp, tmp_path, "report") as (d, policy):
        # What the API server stores (its defaults filled in) is what the policy needs.
        wait_until("the leader to compare the configurations", lambda: said(d) ==
                   "in step with the policy", timeout=30, every=0.5)
        assert drift_metric(d) == 0
        assert voided(cp, ns)
        before = events(cp, "WebhookConfigurationDrift")
        hook = drop_tenant_from_routes(cp, "research")
        wait_until("the drift in the metric", lambda: (drift_metric(d) or 0) >= 1,
                   timeout=3 * INTERVAL + 5, every=0.5)
        assert f"{hook} differs in namespaceSelector" in said(d)
        drifted = new_events(cp, "WebhookConfigurationDrift", before)
        assert any(hook in m and "--webhook-configurations-sync report" in m
                   for m in drifted), drifted
        out = status(cp, policy)
        assert f"webhook configurations: {MUTATING}: {hook} differs in namespaceSelector" in out
        assert "leader: " in out and "leader: none" not in out
        # Reported, not written: research's pods without GPUs are no longer sent.
        wait_until("the API server to stop sending research's pods", lambda: not voided(cp, ns),
                   timeout=30, every=0.5)
        assert hook in said(d)
    # No replica now: status says so, and what goes undone.
    out = status(cp, policy)
    assert "leader: none (the last leader released Lease gpu-webhook-leader)" in out
    assert "waiting pods would not be released" in out


def test_the_leader_writes_back_what_a_hand_edit_dropped(control_plane: ControlPlane,
                                                         tmp_path: Path) -> None:
    cp = control_plane
    ns = f"e2e-research-{short_id()}"
    create_namespace(cp, ns, "research")
    with keeping(cp, tmp_path, "fix") as (d, _policy):
        wait_until("the leader to compare the configurations", lambda: said(d) ==
                   "in step with the policy", timeout=30, every=0.5)
        held = mutating(cp)["webhooks"]
        before = events(cp, "WebhookConfigurationUpdated")
        hook = drop_tenant_from_routes(cp, "research")
        wait_until("the leader to write the configuration back", lambda: mutating(cp)[
            "webhooks"] == held, timeout=3 * INTERVAL + 5, every=0.5)
        assert any(hook in m for m in new_events(cp, "WebhookConfigurationUpdated", before))
        wait_until("research's pods to be sent again", lambda: voided(cp, ns), timeout=30,
                   every=0.5)
        assert d.logged("webhook configuration written as the policy needs")


def test_a_policy_edit_adding_a_tenant_by_another_label_routes_its_namespaces(
        control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    ns = labelled_namespace(cp, {"platform.acme.io/team": "vision"})
    with keeping(cp, tmp_path, "fix") as (d, policy):
        wait_until("the leader to compare the configurations", lambda: said(d) ==
                   "in step with the policy", timeout=30, every=0.5)
        assert not voided(cp, ns)  # not a tenant's namespace: never sent
        policy.write_text(policy.read_text() + """
    - name: vision
      namespaceSelector:
        matchLabels: {platform.acme.io/team: vision}
      quota:
        gpus: 4
""")
        # The leader compares at once when it serves a new policy.
        wait_until("the vision team's pods to be sent", lambda: voided(cp, ns), timeout=30,
                   every=0.5)
        assert "platform.acme.io/team" in json.dumps(mutating(cp)["webhooks"])
        assert said(d) == "in step with the policy"
