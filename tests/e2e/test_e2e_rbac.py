"""The shipped RBAC against the real API server's authorizer: what the webhook's
ServiceAccount may do, and, as much, what it may not.

The manifests of deploy/base (and of the self-managed overlay) are applied as they
ship; ``kubectl auth can-i --as=system:serviceaccount:gpu-webhook:gpu-webhook`` asks the
API server, which evaluates the Roles exactly as it would for the running webhook.
Every grant the code uses is a "yes"; its own policy ConfigMap, other ConfigMaps,
Leases other than its leader Lease, and Secrets are a "no". Read access to GPUQuota
objects is aggregated into `view`: that is checked where the aggregation controller
runs (tests/e2e/test_e2e_seeing.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import LEDGER_NAMESPACE, ROOT, delete_crds

pytestmark = pytest.mark.e2e

DEPLOY = ROOT / "deploy"
ACCOUNT = f"system:serviceaccount:{LEDGER_NAMESPACE}:gpu-webhook"
RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def _apply_rbac(cp: ControlPlane, path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] in RBAC_KINDS]
    assert docs, path
    cp.kubectl("apply", "-n", LEDGER_NAMESPACE, "-f", "-", input=yaml.safe_dump_all(docs))


def can(cp: ControlPlane, verb: str, resource: str, namespace: str | None = None) -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={ACCOUNT}"]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    out = cp.kubectl(*args, check=False)
    answer = out.stdout.strip()
    assert answer in ("yes", "no"), (args, out.stdout, out.stderr)
    return answer == "yes"


def may(cp: ControlPlane, verb: str, group: str, resource: str, namespace: str) -> bool:
    """A SubjectAccessReview asked of the API server as is: unlike ``kubectl auth can-i``
    it needs no discovery, so it answers for a kind whose CRD is not installed."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": ACCOUNT, "resourceAttributes": {
                  "verb": verb, "group": group, "resource": resource,
                  "namespace": namespace}}}
    out = cp.kubectl("create", "-f", "-", "-o", "jsonpath={.status.allowed}",
                     input=json.dumps(review))
    return out.stdout.strip() == "true"


# The custom resources the webhook writes: kubectl resolves a resource through the API's
# discovery before it asks, so they are installed for this module (and removed after,
# so the other modules' replicas find none to write).
CRDS = [DEPLOY / "base" / "crd-gpuquota.yaml",
        Path(__file__).parent / "crds" / "wgpolicyk8s.io_policyreports.yaml"]


@pytest.fixture(scope="module")
def base(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    _apply_rbac(control_plane, DEPLOY / "base" / "rbac.yaml")
    files = [a for p in CRDS for a in ("-f", str(p))]
    control_plane.kubectl("apply", *files)
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                          "crd/gpuquotas.gpu-webhook.dev", "crd/policyreports.wgpolicyk8s.io")
    try:
        yield control_plane
    finally:
        delete_crds(control_plane, "gpuquotas.gpu-webhook.dev", "policyreports.wgpolicyk8s.io")


NS = LEDGER_NAMESPACE
LEDGERS = ["gpu-webhook-ledger-research", "gpu-webhook-ledger-inference",
           "gpu-webhook-ledger-notebooks"]


@pytest.mark.parametrize(("verb", "resource", "namespace"), [
    # the watch caches
    ("list", "pods", None), ("watch", "pods", None), ("get", "pods", None),
    ("list", "namespaces", None), ("watch", "namespaces", None),
    # which nodes carry GPUs, and the PriorityClasses' values (the GPU routes)
    ("list", "nodes", None), ("watch", "nodes", None),
    ("list", "priorityclasses.scheduling.k8s.io", None),
    ("watch", "priorityclasses.scheduling.k8s.io", None),
    # a scale-up's workload
    ("get", "deployments.apps", "team-a"), ("get", "statefulsets.apps", "team-a"),
    ("get", "replicasets.apps", "team-a"),
    # the quota ledgers, by name, and creating one the first time
    *[(v, f"configmaps/{name}", NS) for name in LEDGERS for v in ("get", "update")],
    ("create", "configmaps", NS),
    # the leader Lease, by name, and creating it the first time
    ("get", "leases.coordination.k8s.io/gpu-webhook-leader", NS),
    ("update", "leases.coordination.k8s.io/gpu-webhook-leader", NS),
    ("create", "leases.coordination.k8s.io", NS),
    # a waiting Job's size (the training kinds' below: their CRDs are not installed here)
    ("get", "jobs.batch", "team-a"),
    # the leader's periodic audit: one list of each
    ("list", "deployments.apps", None), ("list", "statefulsets.apps", None),
    ("list", "jobs.batch", None),
    # the GPUQuota status objects and the audit's PolicyReports
    *[(v, "gpuquotas.gpu-webhook.dev", "team-a") for v in ("list", "create", "patch",
                                                           "delete")],
    ("patch", "gpuquotas.gpu-webhook.dev/status", "team-a"),
    *[(v, "policyreports.wgpolicyk8s.io", "team-a") for v in ("list", "create", "patch",
                                                              "delete")],
])
def test_what_the_webhook_uses_is_granted(base: ControlPlane, verb: str, resource: str,
                                          namespace: str | None) -> None:
    assert can(base, verb, resource, namespace)


@pytest.mark.parametrize(("verb", "resource", "namespace"), [
    # its own policy, other ConfigMaps, and ConfigMaps beyond read-modify-write
    ("get", "configmaps/gpu-webhook-policy", NS),
    ("update", "configmaps/gpu-webhook-policy", NS),
    ("patch", "configmaps/gpu-webhook-ledger-research", NS),
    ("delete", "configmaps/gpu-webhook-ledger-research", NS),
    ("get", "configmaps/kube-root-ca.crt", NS),
    ("list", "configmaps", NS), ("watch", "configmaps", NS),
    ("create", "configmaps", "team-a"),
    ("get", "configmaps/gpu-webhook-ledger-research", "team-a"),
    # Leases: its leader Lease only, and only in its namespace
    ("get", "leases.coordination.k8s.io/other", NS),
    ("update", "leases.coordination.k8s.io/other", NS),
    ("delete", "leases.coordination.k8s.io/gpu-webhook-leader", NS),
    ("list", "leases.coordination.k8s.io", NS),
    ("create", "leases.coordination.k8s.io", "team-a"),
    # its status objects: no update, no watch, nothing of other policy engines' reports
    ("update", "gpuquotas.gpu-webhook.dev", "team-a"),
    ("update", "policyreports.wgpolicyk8s.io", "team-a"),
    ("create", "clusterpolicyreports.wgpolicyk8s.io", None),
    # the base install has no certificate duties (cert-manager's overlay); of webhook
    # configurations only its own two (test below)
    ("get", "secrets/gpu-webhook-tls", NS), ("create", "secrets", NS),
    ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io/other", None),
    ("list", "validatingwebhookconfigurations.admissionregistration.k8s.io", None),
    ("update", "pods", None), ("delete", "pods", None), ("create", "pods", None),
    ("update", "nodes", None), ("create", "priorityclasses.scheduling.k8s.io", None),
    ("watch", "deployments.apps", "team-a"), ("update", "deployments.apps", "team-a"),
    ("get", "daemonsets.apps", "team-a"),
])
def test_nothing_else_is_granted(base: ControlPlane, verb: str, resource: str,
                                 namespace: str | None) -> None:
    assert not can(base, verb, resource, namespace)


def allowed(cp: ControlPlane, verb: str, group: str, resource: str,
            subresource: str = "") -> bool:
    """A SubjectAccessReview with the group spelt out: ``kubectl auth can-i`` cannot name
    the group of a resource the API server does not serve (no GPUPolicy CRD here)."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": ACCOUNT,
                       "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NS}",
                                  "system:authenticated"],
                       "resourceAttributes": {"verb": verb, "group": group,
                                              "resource": resource,
                                              "subresource": subresource}}}
    out = cp.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))
    return bool(json.loads(out.stdout)["status"].get("allowed"))


@pytest.mark.parametrize(("verb", "subresource", "granted"), [
    # the GPUPolicy served (--policy-object), watched, and its status written
    ("get", "", True), ("list", "", True), ("watch", "", True), ("update", "status", True),
    # its spec is the platform team's
    ("update", "", False), ("patch", "", False), ("create", "", False), ("delete", "", False),
    ("patch", "status", False),
])
def test_gpupolicies_are_read_and_only_their_status_written(
        base: ControlPlane, verb: str, subresource: str, granted: bool) -> None:
    assert allowed(base, verb, "gpu-webhook.dev", "gpupolicies", subresource) is granted


def test_the_leader_may_write_its_own_two_webhook_configurations_only(base: ControlPlane
                                                                    ) -> None:
    # The webhooks the served policy needs (and the self-managed caBundle): by name.
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        resource = f"{kind}.admissionregistration.k8s.io/gpu-webhook"
        assert can(base, "get", resource) and can(base, "patch", resource)
        assert not can(base, "patch", f"{kind}.admissionregistration.k8s.io/other")
        assert not can(base, "delete", resource) and not can(base, "update", resource)
        assert not can(base, "create", f"{kind}.admissionregistration.k8s.io")


def test_the_self_managed_overlay_adds_its_secret_only(base: ControlPlane) -> None:
    _apply_rbac(base, DEPLOY / "overlays" / "self-managed" / "rbac.yaml")
    try:
        for verb in ("get", "update"):
            assert can(base, verb, "secrets/gpu-webhook-tls", NS)
        assert can(base, "create", "secrets", NS)
        assert not can(base, "get", "secrets/other", NS)
        assert not can(base, "list", "secrets", NS)
        assert not can(base, "get", "secrets/gpu-webhook-tls", "team-a")
    finally:
        for kind, name in (("role", "gpu-webhook-certs"), ("rolebinding", "gpu-webhook-certs")):
            base.kubectl("delete", kind, name, "-n", NS, "--ignore-not-found")


@pytest.mark.parametrize(("group", "resource"), [
    ("batch.volcano.sh", "jobs"), ("jobset.x-k8s.io", "jobsets"),
    ("kubeflow.org", "pytorchjobs"), ("kubeflow.org", "mpijobs"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets")])
def test_the_leader_may_read_a_waiting_training_gangs_workload(
        base: ControlPlane, group: str, resource: str) -> None:
    # Its size: the leader releases a gang's pods together once all of them fit.
    assert may(base, "get", group, resource, "team-a")
    assert not may(base, "list", group, resource, "team-a")
    assert not may(base, "update", group, resource, "team-a")


@pytest.mark.parametrize("resource", ["podgroups", "compositepodgroups"])
def test_podgroups_are_watched_and_read_never_written(base: ControlPlane,
                                                      resource: str) -> None:
    # The core gang API (served only where its gates are on): kept by watches, one get
    # for a group the watch has not delivered; its objects are their controllers'.
    for verb in ("get", "list", "watch"):
        assert may(base, verb, "scheduling.k8s.io", resource, "team-a"), verb
    for verb in ("create", "update", "patch", "delete"):
        assert not may(base, verb, "scheduling.k8s.io", resource, "team-a"), verb
