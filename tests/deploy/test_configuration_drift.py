"""What the leader compares: the webhook configurations the API server holds against those
the served policy needs (webhook.policy.apiserver.drift), rendered with the options the
install recorded on them. The same comparison through a real API server, and the leader
writing what differs, is tests/e2e/test_e2e_configurations.py.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from webhook.policy.apiserver import drift
from webhook.policy.apiserver import webhooks as manifests
from webhook.policy.load import load_file, load_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = load_file(str(ROOT / "policies" / "multi-tenant.yaml"))
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
                      ).decode()

# A platform team's own policy: two teams chosen by their own namespace label.
TEAMS = load_text("""apiVersion: gpu-webhook.dev/v1alpha1
kind: GPUPolicy
metadata: {name: teams}
spec:
  tenants:
    - name: vision
      namespaceSelector: {matchLabels: {platform.acme.io/team: vision}}
      quota: {gpus: 8}
    - name: speech
      namespaceSelector: {matchLabels: {platform.acme.io/team: speech}}
      quota: {gpus: 4}
""", "<teams>")


def installed(policy: Any = EXAMPLE, **options: Any) -> dict[str, dict[str, Any]]:
    """The two configurations as an install leaves them: rendered, with a caBundle."""
    out = {}
    for obj in manifests.render(policy, manifests.Options(**options)):
        for hook in obj["webhooks"]:
            hook["clientConfig"]["caBundle"] = CA
        out["mutating" if obj["kind"].startswith("Mutating") else "validating"] = obj
    return out


def as_stored(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server gives back: its defaults filled in, a resourceVersion."""
    stored = copy.deepcopy(obj)
    stored["metadata"]["resourceVersion"] = "42"
    for hook in stored["webhooks"]:
        hook.setdefault("objectSelector", {})
        hook.setdefault("namespaceSelector", {})
        if obj["kind"].startswith("Mutating"):
            hook.setdefault("reinvocationPolicy", "Never")
        for rule in hook["rules"]:
            rule.setdefault("scope", "*")
    return stored


@pytest.mark.parametrize("kind", ["mutating", "validating"])
@pytest.mark.parametrize("policy", [EXAMPLE, TEAMS], ids=["example", "teams"])
def test_a_configuration_rendered_from_the_served_policy_is_in_step(kind: str, policy: Any
                                                                    ) -> None:
    live = as_stored(installed(policy)[kind])
    found = drift.compare(policy, kind, "gpu-webhook", live)
    assert not found, found.describe()
    assert found.describe().endswith("as the policy needs")


def test_the_examples_routes_under_a_teams_policy_are_drift_naming_the_webhooks() -> None:
    # The chart's hole: deploy/base's webhooks (the example's tenants) with the team's
    # policy served. The example's routes are not what the team's namespaces need.
    live = as_stored(installed(EXAMPLE)["mutating"])
    found = drift.compare(TEAMS, "mutating", "gpu-webhook", live)
    assert found
    wanted = [h["name"] for h in installed(TEAMS)["mutating"]["webhooks"]]
    held = [h["name"] for h in live["webhooks"]]
    assert set(found.missing) == set(wanted) - set(held)
    assert set(found.extra) == set(held) - set(wanted)
    route = next(h for h in wanted if h.startswith("routes"))
    text = found.describe()
    assert text.startswith("MutatingWebhookConfiguration gpu-webhook: ")
    assert route in text
    # What would be written carries the team's label, and the caBundle the cluster holds.
    written = drift.wanted(TEAMS, "mutating", live)["webhooks"]
    assert "platform.acme.io/team" in json.dumps(written)
    assert all(h["clientConfig"]["caBundle"] == CA for h in written)


def test_a_tenants_namespaces_edited_out_of_a_route_is_drift_in_that_field() -> None:
    live = as_stored(installed(TEAMS)["mutating"])
    route = next(h for h in live["webhooks"] if h["name"].startswith("routes"))
    for e in route["namespaceSelector"]["matchExpressions"]:
        if e["key"] == "platform.acme.io/team":
            e["values"] = ["vision"]  # speech's namespaces no longer sent
    found = drift.compare(TEAMS, "mutating", "gpu-webhook", live)
    assert found.changed == ((route["name"], ("namespaceSelector",)),)
    assert not found.missing and not found.extra


def test_a_rotated_ca_bundle_is_not_drift() -> None:
    live = as_stored(installed()["validating"])
    for hook in live["webhooks"]:
        hook["clientConfig"]["caBundle"] = base64.b64encode(b"another CA").decode()
    assert not drift.compare(EXAMPLE, "validating", "gpu-webhook", live)


def test_the_installs_choices_are_kept_when_rendering_again() -> None:
    live = as_stored(installed(namespace="gpu-system", exempt_namespaces=("ci",),
                               mutating_failure_policy="Ignore",
                               url="https://10.0.0.5:8443")["mutating"])
    assert not drift.compare(TEAMS, "mutating", "gpu-webhook", as_stored(
        installed(TEAMS, namespace="gpu-system", exempt_namespaces=("ci",),
                  mutating_failure_policy="Ignore", url="https://10.0.0.5:8443")["mutating"]))
    written = drift.wanted(TEAMS, "mutating", live)["webhooks"]
    mutate = next(h for h in written if h["name"] == "mutate.gpu-webhook.dev")
    assert mutate["failurePolicy"] == "Ignore"
    assert mutate["clientConfig"]["url"] == "https://10.0.0.5:8443/mutate"
    (excluded,) = [e for e in mutate["namespaceSelector"]["matchExpressions"]
                   if e["key"] == "kubernetes.io/metadata.name"]
    assert excluded["values"] == ["ci", "gpu-system", "kube-system"]


def test_a_changed_failure_policy_is_drift_in_that_field() -> None:
    live = as_stored(installed()["validating"])
    hook = next(h for h in live["webhooks"] if h["name"] == "validate.gpu-webhook.dev")
    hook["failurePolicy"] = "Ignore"
    found = drift.compare(EXAMPLE, "validating", "gpu-webhook", live)
    assert found.changed == (("validate.gpu-webhook.dev", ("failurePolicy",)),)


@pytest.mark.parametrize(("annotation", "said"), [
    (None, "has no annotation gpu-webhook.dev/install"),
    ("{not json", "is not a record of the install"),
    ('{"namespace": "x", "mutatingFailurePolicy": "Sometimes"}',
     "'Sometimes' is neither Fail nor Ignore"),
])
def test_a_configuration_without_a_readable_install_record_is_reported_with_the_fix(
        annotation: str | None, said: str) -> None:
    live = as_stored(installed()["mutating"])
    if annotation is None:
        del live["metadata"]["annotations"]
    else:
        live["metadata"]["annotations"][manifests.INSTALL_ANNOTATION] = annotation
    found = drift.compare(EXAMPLE, "mutating", "gpu-webhook", live)
    assert found.unusable and said in found.unusable
    assert "gpu-webhook manifests" in found.describe()


def test_an_absent_configuration_is_reported() -> None:
    found = drift.compare(EXAMPLE, "validating", "gpu-webhook", None)
    assert found and "not found" in found.describe()
