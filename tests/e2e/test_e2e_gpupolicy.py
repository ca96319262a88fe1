"""GPUPolicy objects on the real API server: the CRD ``gpu-webhook policy crd`` renders is
accepted (a structural schema), ``kubectl apply -f`` of a policy file creates a GPUPolicy,
every shipped policy passes the CRD's schema, and an edit the loader refuses is refused
at ``kubectl apply`` by the webhook with the located message ``policy check`` gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import ROOT, Deployment, assert_denied, delete_crds, gpu_webhook, wait_until

pytestmark = pytest.mark.e2e

CRD = ROOT / "deploy" / "base" / "crd-gpupolicy.yaml"
EXAMPLE = ROOT / "policies" / "multi-tenant.yaml"
SHIPPED = sorted((ROOT / "policies").glob("*.yaml")) + sorted(
    (ROOT / "policies" / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def crd(control_plane: ControlPlane) -> Iterator[None]:
    out = control_plane.kubectl("apply", "-f", str(CRD), check=False)
    assert out.returncode == 0, out.stderr  # the API server's verdict on the schema
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                          "crd/gpupolicies.gpu-webhook.dev")
    yield
    control_plane.kubectl("delete", "gpupolicies", "--all", "--wait=false", check=False)
    delete_crds(control_plane, "gpupolicies.gpu-webhook.dev")


def test_the_crd_is_structural_and_established(control_plane: ControlPlane, crd: None
                                               ) -> None:
    got = yaml.safe_load(control_plane.kubectl(
        "get", "crd", "gpupolicies.gpu-webhook.dev", "-o", "yaml").stdout)
    conditions = {c["type"]: c["status"] for c in got["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions.get("NonStructuralSchema", "False") == "False"
    # The field docs are what `kubectl explain` shows, once the API server has published
    # the CRD's OpenAPI (a moment after Established, later on a busy machine).
    explained: list[str] = []

    def published() -> bool:
        # kubectl keeps the API's discovery in a cache that earlier calls of the session
        # filled before the CRD existed: api-resources reads it afresh.
        control_plane.kubectl("api-resources", "--api-group=gpu-webhook.dev", check=False)
        out = control_plane.kubectl("explain", "gpupolicy.spec.unassignedNamespaces",
                                    check=False)
        explained[:] = [out.stdout]
        return out.returncode == 0

    wait_until("kubectl explain to know gpupolicies", published, timeout=60, every=0.5)
    assert "GPU pods in a namespace that belongs to no tenant" in explained[0]


def test_kubectl_apply_of_the_policy_file_creates_a_gpupolicy(
        control_plane: ControlPlane, crd: None, webhook: Deployment) -> None:
    out = control_plane.kubectl("apply", "-f", str(EXAMPLE))
    assert out.stdout.strip() == "gpupolicy.gpu-webhook.dev/shared-gpu-cluster created"
    table = control_plane.kubectl("get", "gpupolicies").stdout.splitlines()
    assert table[0].split() == ["NAME", "TENANTS", "MODE", "ACTIVE", "AGE"]
    name, mode = table[1].split()[:2]  # tenants and active come from status: not yet set
    assert (name, mode) == ("shared-gpu-cluster", "enforce")
    # The status subresource takes what a replica reports, and the columns show it.
    status = ('{"status": {"tenants": 3, "conditions": [{"type": "Active", "status": "True", '
              '"reason": "Served", "message": "", "lastTransitionTime": "2026-12-01T10:00:00Z"'
              '}]}}')
    control_plane.kubectl("patch", "gpupolicy", "shared-gpu-cluster", "--subresource=status",
                          "--type=merge", "-p", status)
    row = control_plane.kubectl("get", "gpupolicies").stdout.splitlines()[1].split()
    assert row[:4] == ["shared-gpu-cluster", "3", "enforce", "True"]


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_policy_passes_the_crd_schema_and_the_webhook(
        control_plane: ControlPlane, crd: None, webhook: Deployment, path: Path) -> None:
    out = control_plane.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
    assert out.returncode == 0, out.stderr


def test_a_policy_the_loader_refuses_is_refused_at_apply_with_the_located_message(
        control_plane: ControlPlane, crd: None, webhook: Deployment, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace(
        "      allowedProducts: [a100, h100]", "      allowedProducts: [a100, h100, b200]", 1))
    assert bad.read_text() != EXAMPLE.read_text()
    out = control_plane.kubectl("apply", "-f", str(bad), check=False)
    assert_denied(out, "GPUPolicy shared-gpu-cluster: spec.tenants[0].allowedProducts[2]: "
                  "tenant research: product 'b200' is not defined",
                  webhook="policies.gpu-webhook.dev")
    # The same words `gpu-webhook policy check` prints for the file, after its file:line.
    check = webhook_check(bad)
    assert check.split(": ", 1)[1] in out.stderr


def webhook_check(path: Path) -> str:
    done = gpu_webhook("policy", "check", str(path), check=False)
    assert done.returncode == 1
    return done.stderr.splitlines()[0]


def test_a_misspelt_field_is_refused_by_the_api_server_at_its_path(
        control_plane: ControlPlane, crd: None, tmp_path: Path) -> None:
    bad = tmp_path / "typo.yaml"
    bad.write_text(EXAMPLE.read_text().replace("unassignedNamespaces:", "unassignedNamespace:"))
    out = control_plane.kubectl("apply", "-f", str(bad), check=False)
    assert_denied(out, 'unknown field "spec.unassignedNamespace"')
