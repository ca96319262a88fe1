"""deploy/: each overlay builds, every object is valid for Kubernetes, and the objects
hold the properties an operator relies on (replicas, probes, security, least privilege,
certificates wired as each overlay says). The committed webhook configurations
must be what ``gpu-webhook manifests`` renders now.

Building needs ``kubectl kustomize``: the kubectl built for the e2e tests (or one on PATH,
or $KUBECTL); without one, the build checks are skipped and the base files are still
validated one by one.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from webhook.server.leading.upkeep import LEADER_LABEL

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
GPU_WEBHOOK = str(Path(sys.executable).with_name("gpu-webhook"))
VERSION = kubernetes_validate.latest_version()
SERVICE_NAMES = ["gpu-webhook", "gpu-webhook.gpu-webhook", "gpu-webhook.gpu-webhook.svc",
                 "gpu-webhook.gpu-webhook.svc.cluster.local"]


def find_kubectl() -> str | None:
    if os.environ.get("KUBECTL"):
        return os.environ["KUBECTL"]
    built = sorted(glob.glob(os.path.expanduser("~/.cache/gpu-webhook/controlplane/*/bin/kubectl")))
    return built[-1] if built else shutil.which("kubectl")


def kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip("no kubectl for `kubectl kustomize` (run tests/e2e/controlplane/build.sh)")
    done = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def validate_all(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["apiVersion"].startswith("cert-manager.io/"):
            continue  # a CRD: no schema here; test_cert_manager_overlay checks its shape
        kubernetes_validate.validate(obj, VERSION, strict=True)


@pytest.fixture(scope="module")
def self_managed() -> list[dict[str, Any]]:
    return kustomize(DEPLOY / "overlays" / "self-managed")


@pytest.fixture(scope="module")
def cert_manager() -> list[dict[str, Any]]:
    return kustomize(DEPLOY / "overlays" / "cert-manager")


# --- in step with the code and the policy -----------------------------------------------

def test_committed_webhook_configurations_are_what_manifests_renders_now():
    done = subprocess.run([GPU_WEBHOOK, "manifests", "--policy", "policies/multi-tenant.yaml",
                           "--namespace", "gpu-webhook"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert (DEPLOY / "base" / "webhooks.yaml").read_text() == done.stdout, (
        "deploy/base/webhooks.yaml is stale: run `gpu-webhook manifests --policy "
        "policies/multi-tenant.yaml --namespace gpu-webhook > deploy/base/webhooks.yaml`")


def test_base_policy_is_the_example_policy():
    # kustomize reads no file outside deploy/base, so the ConfigMap's source is a copy.
    assert yaml.safe_load((DEPLOY / "base" / "policy.yaml").read_text()) == yaml.safe_load(
        (ROOT / "policies" / "multi-tenant.yaml").read_text())


def test_base_files_validate_one_by_one():
    for path in sorted((DEPLOY / "base").glob("*.yaml")):
        if path.name in ("kustomization.yaml", "policy.yaml"):
            continue
        objects = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("namespace", "gpu-webhook")
            if obj["kind"] in ("Namespace", "ClusterRole", "ClusterRoleBinding",
                               "MutatingWebhookConfiguration",
                               "ValidatingWebhookConfiguration"):
                del obj["metadata"]["namespace"]
        validate_all(objects)


# --- the built overlays ------------------------------------------------------------------

def test_self_managed_overlay_is_valid_and_lets_the_webhook_manage_its_certificate(
        self_managed):
    objects = self_managed
    validate_all(objects)
    assert not by_kind(objects, "Secret")  # the webhook creates it on first start
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = dict(a.partition("=")[::2] for a in container["args"])
    assert "--self-managed-certs" in args
    assert args["--service"] == one(objects, "Service")["metadata"]["name"]
    secret = args["--cert-secret"]
    targets = dict(t.split("=") for t in args["--webhook-configurations"].split(","))
    configurations = {kind: one(objects, f"{kind.capitalize()}WebhookConfiguration")
                      for kind in ("mutating", "validating")}
    assert targets == {k: c["metadata"]["name"] for k, c in configurations.items()}
    for config in configurations.values():  # patched in by the webhook, not applied
        assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])
    volumes = {v["name"]: v for v in
               one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["certs"] == {"name": "certs",
                                "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}

    # RBAC: get/update on that one Secret, create (not limitable by name) in its own
    # namespace only, get/patch on the two named configurations.
    roles = [r for o in by_kind(objects, "Role") for r in o["rules"]
             if "secrets" in r["resources"]]
    assert sorted((r["verbs"], r.get("resourceNames")) for r in roles) == [
        (["create"], None), (["get", "update"], [secret])]
    hooks = [r for o in by_kind(objects, "ClusterRole") for r in o["rules"]
             if r["apiGroups"] == ["admissionregistration.k8s.io"]]
    assert hooks == [{"apiGroups": ["admissionregistration.k8s.io"],
                      "resources": ["mutatingwebhookconfigurations",
                                    "validatingwebhookconfigurations"],
                      "resourceNames": sorted(set(targets.values())),
                      "verbs": ["get", "patch"]}]
    check_common(objects)


def test_cert_manager_overlay_is_valid_and_wired_to_cert_manager(cert_manager):
    objects = cert_manager
    validate_all(objects)
    assert not by_kind(objects, "Secret")  # cert-manager writes it
    issuers = {o["metadata"]["name"]: o for o in by_kind(objects, "Issuer")}
    certificates = {o["metadata"]["name"]: o for o in by_kind(objects, "Certificate")}
    for obj in [*issuers.values(), *certificates.values()]:
        assert obj["apiVersion"] == "cert-manager.io/v1"
        assert obj["metadata"]["namespace"] == "gpu-webhook"
    for cert in certificates.values():
        assert cert["spec"]["issuerRef"]["name"] in issuers
    serving = certificates["gpu-webhook-serving"]["spec"]
    assert serving["secretName"] == "gpu-webhook-tls"
    assert serving["dnsNames"] == SERVICE_NAMES
    assert "server auth" in serving["usages"]
    assert certificates["gpu-webhook-ca"]["spec"]["isCA"] is True
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(objects, kind)
        annotations = config["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == "gpu-webhook/gpu-webhook-serving"
        assert set(annotations) == {"cert-manager.io/inject-ca-from", "gpu-webhook.dev/install"}
        assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])
    volumes = {v["name"]: v for v in
               one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["certs"]["secret"]["secretName"] == "gpu-webhook-tls"
    # The webhook does not manage certificates here: no Secret access at all; its own two
    # webhook configurations only by name (the leader keeps their webhooks as the policy
    # needs them; cert-manager's injector writes their caBundle).
    for rule in [r for o in by_kind(objects, "ClusterRole") + by_kind(objects, "Role")
                 for r in o["rules"]]:
        assert "secrets" not in rule["resources"]
        if rule["apiGroups"] == ["admissionregistration.k8s.io"]:
            assert rule["resourceNames"] == ["gpu-webhook"]
            assert rule["verbs"] == ["get", "patch"]
    check_common(objects)


def check_common(objects: list[dict[str, Any]]) -> None:
    """What both overlays must get right about the workload itself."""
    ns = one(objects, "Namespace")["metadata"]["name"]
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert deployment["metadata"]["namespace"] == ns
    assert spec["replicas"] == 3
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["terminationGracePeriodSeconds"] == 30
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert isinstance(sc["runAsUser"], int) and sc["runAsUser"] > 0
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert all("subPath" not in m for m in mounts.values())  # subPath mounts never update
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["tmp"] and mounts["tmp"]["mountPath"] == "/tmp"
    args = container["args"]
    assert f"--cert-dir={mounts['certs']['mountPath']}" in args
    policy_cm = volumes["policy"]["configMap"]["name"]
    assert f"--policy={mounts['policy']['mountPath']}/policy.yaml" in args
    configmaps = {c["metadata"]["name"]: c for c in by_kind(objects, "ConfigMap")}
    assert yaml.safe_load(configmaps[policy_cm]["data"]["policy.yaml"]) == yaml.safe_load(
        (ROOT / "policies" / "multi-tenant.yaml").read_text())

    pdb = one(objects, "PodDisruptionBudget")
    labels = spec["template"]["metadata"]["labels"]
    assert pdb["spec"]["minAvailable"] == 2
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https",
                                         "protocol": "TCP"}]

    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in one(objects, kind)["webhooks"]:
            ref = hook["clientConfig"]["service"]
            assert (ref["name"], ref["namespace"], ref["port"]) == (
                service["metadata"]["name"], ns, 443)
            if all(r["scope"] == "Cluster" for r in hook["rules"]):
                continue  # GPUPolicy objects: a namespaceSelector never skips those
            (first, *_) = hook["namespaceSelector"]["matchExpressions"]
            if hook["name"] == "policy-file.gpu-webhook.dev":
                # The policy ConfigMap, in the webhook's own namespace only; never failing
                # closed (the install makes it before any replica answers).
                assert first["operator"] == "In" and first["values"] == [ns]
                assert configmaps[policy_cm]["metadata"]["name"] in \
                    hook["matchConditions"][0]["expression"]
                assert hook["failurePolicy"] == "Ignore"
                continue
            excluded = first["values"]
            assert ns in excluded and "kube-system" in excluded

    check_rbac(objects, ns, pod["serviceAccountName"])


def check_rbac(objects: list[dict[str, Any]], ns: str, account: str) -> None:
    rules = [(o["kind"], r) for o in by_kind(objects, "ClusterRole") + by_kind(objects, "Role")
             for r in o["rules"]]
    for _, rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        if "secrets" in rule["resources"]:  # its certificate Secret only (self-managed)
            assert rule["resources"] == ["secrets"], rule
            assert (rule["verbs"] == ["create"] and "resourceNames" not in rule) or (
                set(rule["verbs"]) <= {"get", "update"} and len(rule["resourceNames"]) == 1)
        if rule.get("apiGroups") == ["admissionregistration.k8s.io"]:
            assert rule["resourceNames"] == ["gpu-webhook"]  # only its own configurations
    # Workloads: get (the pod template of the one a scale request is for) and list (the
    # leader's periodic audit); never a write.
    assert [r for _, r in rules if "apps" in r["apiGroups"]] == [
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "replicasets"],
         "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"],
         "verbs": ["list"]}]
    # Cluster-wide, the webhook writes only its own kinds of object (the GPUQuota status
    # objects, the audit's PolicyReports) and the status of GPUPolicy objects (never
    # their spec), and, for the quota line, a pod patch (the gate's removal, kept to our
    # gate by the validating webhook gates.gpu-webhook.dev) and Events on waiting pods.
    cluster_writes = {(res, v) for kind, r in rules if kind == "ClusterRole"
                      for res in r["resources"] for v in r["verbs"]
                      if v in ("create", "update", "patch", "delete", "deletecollection")
                      and r["apiGroups"] != ["admissionregistration.k8s.io"]}
    assert cluster_writes == {
        *(("gpuquotas", v) for v in ("create", "patch", "delete")),
        ("gpuquotas/status", "patch"),
        *(("policyreports", v) for v in ("create", "patch", "delete")),
        ("gpupolicies/status", "update"),
        *(("gpuusages", v) for v in ("create", "update", "delete")),
        ("pods", "patch"), ("events", "create")}
    # Read access for everyone who may view a namespace, through aggregation.
    [view] = [o for o in by_kind(objects, "ClusterRole")
              if o["metadata"].get("labels", {}).get(
                  "rbac.authorization.k8s.io/aggregate-to-view") == "true"]
    assert view["rules"] == [{"apiGroups": ["gpu-webhook.dev"], "resources": ["gpuquotas"],
                              "verbs": ["get", "list", "watch"]}]
    for binding in by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                        "namespace": ns}]


def test_the_ledger_role_names_exactly_the_ledgers_of_the_shipped_policy() -> None:
    # By name: the webhook may read and update its tenants' ledgers, never its own
    # policy ConfigMap or any other. A tenant with a quota added without its ledger
    # here would fail closed; this keeps the two files in step.
    import yaml as _yaml

    from webhook.policy.load import load_file
    from webhook.quota.entries import BORROWED_PREFIX, LEDGER_PREFIX

    base = Path(__file__).resolve().parents[2] / "deploy" / "base"
    policy = load_file(base / "policy.yaml")
    wanted = sorted(
        [LEDGER_PREFIX + t.name for t in policy.spec.tenants if t.quota is not None]
        # and the ledger of each cohort's borrowed reservations (docs/quota.md)
        + list({BORROWED_PREFIX + t.cohort.name for t in policy.spec.tenants if t.cohort}))
    [role] = [d for d in _yaml.safe_load_all((base / "rbac.yaml").read_text())
              if d and d["kind"] == "Role" and d["metadata"]["name"] == "gpu-webhook-quota-ledger"]
    by_verbs = {tuple(r["verbs"]): r for r in role["rules"]}
    assert set(by_verbs) == {("get", "update"), ("create",)}
    assert sorted(by_verbs[("get", "update")]["resourceNames"]) == wanted
    assert all(r["resources"] == ["configmaps"] and r["apiGroups"] == [""]
               for r in role["rules"])  # no Leases: nothing uses them


def test_the_webhook_may_read_every_workload_a_waiting_gang_is_sized_from() -> None:
    # The leader reads a waiting gang's workload for its size (webhook.quota.line.gang_of
    # names it): a kind added to the built-in gangs without its get here would keep its
    # pods waiting for ever, told "workload of a waiting pod not read".
    import yaml as _yaml

    from webhook.k8s.workloads import CRD_KINDS

    base = Path(__file__).resolve().parents[2] / "deploy" / "base"
    [role] = [d for d in _yaml.safe_load_all((base / "rbac.yaml").read_text())
              if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpu-webhook"]
    granted = {(g, r) for rule in role["rules"] if "get" in rule["verbs"]
               for g in rule["apiGroups"] for r in rule["resources"]}
    wanted = {(b.group, b.resource) for b in CRD_KINDS
              if b.reserves and b.pod_label and b.kind != "TrainJob"} | {("batch", "jobs")}
    assert wanted - granted == set()


@pytest.mark.parametrize("mode", ["cert-manager", "self-managed"])
def test_the_leader_decides_component_flags_every_replica_and_serves_only_the_leader(
        tmp_path: Path, mode: str) -> None:
    # As deploy/README.md says to use it: its snippet added to an overlay of the tree.
    # The self-managed overlay sets the container's args whole: the setting must
    # survive that (a flag appended to the args did not, and no replica then led the
    # Service's only endpoint).
    readme = (DEPLOY / "README.md").read_text()
    snippet = next(b for b in re.findall(r"```yaml\n(.*?)\n```", readme, flags=re.S)
                   if "leader-decides" in b)
    tree = tmp_path / "deploy"
    shutil.copytree(DEPLOY, tree)
    overlay = tree / "overlays" / mode / "kustomization.yaml"
    overlay.write_text(yaml.safe_dump({**yaml.safe_load(overlay.read_text()),
                                       **yaml.safe_load(snippet)}))
    objects = kustomize(overlay.parent)
    validate_all(objects)
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "GPU_WEBHOOK_QUOTA_COMMIT", "value": "leader"} in container["env"]
    # The leader knows its pod by name; the others reach it at its IP.
    for env in ("POD_NAME", "POD_IP"):
        assert env in {e["name"] for e in container["env"]}
    selector = one(objects, "Service")["spec"]["selector"]
    # The label the Service selects is the one the leader writes on its own pod.
    assert selector == {"app.kubernetes.io/name": "gpu-webhook", LEADER_LABEL: "true"}


def test_the_native_policies_component_records_the_mode_and_grants_the_leader(
        tmp_path: Path) -> None:
    # As deploy/README.md says to use it: its snippet added to the self-managed overlay.
    from webhook.policy.apiserver.webhooks import options_of

    readme = (DEPLOY / "README.md").read_text()
    snippet = next(b for b in re.findall(r"```yaml\n(.*?)\n```", readme, flags=re.S)
                   if "native-policies" in b)
    tree = tmp_path / "deploy"
    shutil.copytree(DEPLOY, tree)
    overlay = tree / "overlays" / "self-managed" / "kustomization.yaml"
    overlay.write_text(yaml.safe_dump({**yaml.safe_load(overlay.read_text()),
                                       **yaml.safe_load(snippet)}))
    objects = kustomize(overlay.parent)
    validate_all(objects)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert options_of(one(objects, kind)).admission_mode == "fallback"
    [role] = [o for o in by_kind(objects, "ClusterRole")
              if o["metadata"]["name"] == "gpu-webhook-admission-policies"]
    granted = {r for rule in role["rules"] for r in rule["resources"]
               if {"list", "patch", "delete"} <= set(rule["verbs"])}
    assert granted == {"mutatingadmissionpolicies", "mutatingadmissionpolicybindings",
                       "validatingadmissionpolicies", "validatingadmissionpolicybindings"}
    [binding] = [o for o in by_kind(objects, "ClusterRoleBinding")
                 if o["metadata"]["name"] == "gpu-webhook-admission-policies"]
    assert binding["subjects"][0]["namespace"] == "gpu-webhook"
