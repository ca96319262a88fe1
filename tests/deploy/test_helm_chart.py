"""deploy/helm/gpu-webhook: ``helm lint`` is clean, ``helm template`` renders objects valid
for Kubernetes that hold what the kustomize overlays hold (the same checks), the chart
and kustomize render the same objects for the same choices (the chart reads
deploy/base and the overlays through files/, so they cannot drift), and each value
changes what it says and nothing else.

helm is built from the Go module proxy by tests/deploy/helm/build.sh (cached; ``make
test`` builds it first). The chart on the real API server: tests/e2e/test_e2e_helm.py.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import readmekit
import yaml
from kit import helm, kube_version
from test_deploy_kustomize import (
    DEPLOY,
    ROOT,
    SERVICE_NAMES,
    by_kind,
    check_common,
    kustomize,
    one,
    validate_all,
)

from webhook.policy.apiserver import webhooks as manifests

CHART = DEPLOY / "helm" / "gpu-webhook"
HELM_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart")


@pytest.fixture(scope="module")
def helm_bin() -> str:
    return helm()


def template(helm_bin: str, *values: str, namespace: str = "gpu-webhook",
             ok: bool = True) -> list[dict[str, Any]]:
    args = [helm_bin, "template", "gpu-webhook", str(CHART), "-n", namespace,
            "--kube-version", kube_version()]
    for v in values:
        args += ["--set", v]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    if not ok:
        assert done.returncode != 0
        raise ChartRefused(done.stderr)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


class ChartRefused(Exception):
    pass


def without_helm_labels(objects: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    out = {}
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        for key in HELM_LABELS:
            labels.pop(key, None)
        out[(obj["kind"], obj["metadata"]["name"])] = obj
    return out


def test_the_packaged_chart_renders_the_same(helm_bin: str, tmp_path: Path) -> None:
    # files/ links into deploy/: `helm package` must carry what they point to.
    done = subprocess.run([helm_bin, "package", str(CHART), "-d", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (archive,) = tmp_path.glob("gpu-webhook-*.tgz")
    packaged = subprocess.run([helm_bin, "template", "gpu-webhook", str(archive), "-n",
                               "gpu-webhook", "--kube-version", kube_version()],
                              capture_output=True, text=True, timeout=120, check=False)
    assert packaged.returncode == 0, packaged.stderr
    assert [d for d in yaml.safe_load_all(packaged.stdout) if d] == template(helm_bin)


def test_helm_lint_is_clean(helm_bin: str) -> None:
    done = subprocess.run([helm_bin, "lint", "--strict", str(CHART),
                           "--kube-version", kube_version()], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


@pytest.mark.parametrize("mode", ["self-managed", "cert-manager"])
def test_the_chart_renders_what_kustomize_builds(helm_bin: str, mode: str) -> None:
    chart = without_helm_labels(template(helm_bin, f"certificates.mode={mode}"))
    built = without_helm_labels(kustomize(DEPLOY / "overlays" / mode))
    # The namespace is helm's (`helm install -n NS --create-namespace`), not the chart's.
    del built[("Namespace", "gpu-webhook")]
    assert sorted(chart) == sorted(built)
    for key, obj in built.items():
        assert chart[key] == obj, key


@pytest.mark.parametrize("mode", ["self-managed", "cert-manager"])
def test_the_rendered_objects_are_valid_and_hold_what_the_overlays_hold(
        helm_bin: str, mode: str) -> None:
    objects = template(helm_bin, f"certificates.mode={mode}")
    validate_all(objects)
    # check_common reads the namespace from the Namespace object kustomize ships.
    check_common([{"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "gpu-webhook"}}, *objects])
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == "gpu-webhook"


def test_the_chart_follows_its_release_namespace(helm_bin: str) -> None:
    objects = template(helm_bin, "certificates.mode=cert-manager", namespace="gpu-admission")
    validate_all(objects)
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                               "PriorityClass",
                               "MutatingWebhookConfiguration",
                               "ValidatingWebhookConfiguration"):
            assert obj["metadata"]["namespace"] == "gpu-admission", obj["kind"]
        for subject in obj.get("subjects") or ():
            assert subject["namespace"] == "gpu-admission"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(objects, kind)
        annotations = config["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == \
            "gpu-admission/gpu-webhook-serving"
        # The leader renders the webhooks again for this namespace, excluded as here.
        assert json.loads(annotations["gpu-webhook.dev/install"])["namespace"] == \
            "gpu-admission"
        for hook in config["webhooks"]:
            assert hook["clientConfig"]["service"]["namespace"] == "gpu-admission"
            if "namespaceSelector" in hook:
                excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
                assert "gpu-admission" in excluded and "gpu-webhook" not in excluded
    serving = {o["metadata"]["name"]: o for o in by_kind(objects, "Certificate")}
    assert serving["gpu-webhook-serving"]["spec"]["dnsNames"] == [
        n.replace("gpu-webhook.gpu-webhook", "gpu-webhook.gpu-admission") for n in SERVICE_NAMES]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(c)


def test_image_replicas_resources_and_priority(helm_bin: str) -> None:
    objects = template(helm_bin, "image.repository=registry.example.com/gpu-webhook",
                       "image.tag=0.2.0", "image.pullPolicy=Always", "replicas=5",
                       "resources.requests.cpu=250m", "resources.limits.memory=512Mi",
                       "priorityClassName=")
    validate_all(objects)
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 5
    c = container(objects)
    assert c["image"] == "registry.example.com/gpu-webhook:0.2.0"
    assert c["imagePullPolicy"] == "Always"
    assert c["resources"] == {"requests": {"cpu": "250m"}, "limits": {"memory": "512Mi"}}
    assert "priorityClassName" not in deployment["spec"]["template"]["spec"]
    assert not by_kind(objects, "ResourceQuota")  # only for system-cluster-critical


def test_failure_policy_pdb_and_exempt_namespaces(helm_bin: str) -> None:
    objects = template(helm_bin, "failurePolicy=Ignore", "podDisruptionBudget.enabled=false",
                       "exemptNamespaces={monitoring,ci}")
    assert not by_kind(objects, "PodDisruptionBudget")
    defaults = template(helm_bin)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        before = {h["name"]: h for h in one(defaults, kind)["webhooks"]}
        for hook in one(objects, kind)["webhooks"]:
            # The scale webhook ignores failures whatever the value; the others follow it.
            want = "Ignore" if before[hook["name"]]["failurePolicy"] == "Fail" else \
                before[hook["name"]]["failurePolicy"]
            assert hook["failurePolicy"] == want
            if hook["name"] == "policy-file.gpu-webhook.dev":  # the webhook's own ConfigMap
                assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [
                    "gpu-webhook"]
            elif "namespaceSelector" in hook:
                excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
                # A routes webhook of tenants chosen by label also leaves out the
                # namespaces tenants name (those are routes.gpu-webhook.dev's).
                named = ({"notebooks", "research", "research-dev"}
                         if hook["name"].startswith("routes-") else set())
                assert excluded == sorted({"ci", "monitoring", "gpu-operator", "gpu-webhook",
                                           "kube-system", *named})
    pdb = one(template(helm_bin, "podDisruptionBudget.minAvailable=1"), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1


def ledger_names(objects: list[dict[str, Any]]) -> list[str] | None:
    role = next(o for o in by_kind(objects, "Role")
                if o["metadata"]["name"] == "gpu-webhook-quota-ledger")
    named = [r for r in role["rules"] if "resourceNames" in r]
    return named[0]["resourceNames"] if named else None


def test_an_existing_gpupolicy_object_is_served_instead_of_a_configmap(helm_bin: str) -> None:
    objects = template(helm_bin, "policy.existingObject=shared-gpu-cluster",
                       "policy.quotaTenants={research,notebooks}")
    validate_all(objects)
    assert not [c for c in by_kind(objects, "ConfigMap")
                if c["metadata"]["name"] == "gpu-webhook-policy"]
    c = container(objects)
    assert "--policy-object=shared-gpu-cluster" in c["args"]
    assert not [a for a in c["args"] if a.startswith("--policy=")]
    assert "policy" not in {m["name"] for m in c["volumeMounts"]}
    assert "policy" not in {v["name"] for v in
                            one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} \
        in c["env"]  # the replica's name in the GPUPolicy's status
    assert ledger_names(objects) == ["gpu-webhook-ledger-research",
                                     "gpu-webhook-ledger-notebooks"]
    # No tenant with a quota: no get/update rule at all (an empty resourceNames is every name).
    assert ledger_names(template(helm_bin, "policy.existingObject=p")) is None


def test_an_inline_policy_is_the_configmap_and_names_its_ledgers(helm_bin: str,
                                                                tmp_path: Path) -> None:
    policy = yaml.safe_load((ROOT / "policies" / "multi-tenant.yaml").read_text())
    policy["spec"]["tenants"] = [t for t in policy["spec"]["tenants"] if t["name"] != "research"]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"policy": {"inline": policy}}))
    done = subprocess.run([helm_bin, "template", "gpu-webhook", str(CHART), "-n", "gpu-webhook",
                           "-f", str(values), "--kube-version", kube_version()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    (cm,) = [c for c in by_kind(objects, "ConfigMap")
             if c["metadata"]["name"] == "gpu-webhook-policy"]
    assert yaml.safe_load(cm["data"]["policy.yaml"]) == policy
    assert ledger_names(objects) == ["gpu-webhook-ledger-inference",
                                     "gpu-webhook-ledger-notebooks"]


TEAMS_POLICY = """# The platform team's policy, as a file: comments and line numbers kept.
apiVersion: gpu-webhook.dev/v1alpha1
kind: GPUPolicy
metadata: {name: teams}
spec:
  tenants:
    - name: vision
      namespaceSelector: {matchLabels: {platform.acme.io/team: vision}}
      quota: {gpus: 8}
"""


def set_file(helm_bin: str, tmp_path: Path, text: str, *extra: str
             ) -> subprocess.CompletedProcess[str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    return subprocess.run([helm_bin, "template", "gpu-webhook", str(CHART), "-n", "gpu-webhook",
                           "--set-file", f"policy.inline={policy}", *extra,
                           "--kube-version", kube_version()],
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_policy_file_is_given_with_set_file_and_served_as_written(helm_bin: str,
                                                                    tmp_path: Path) -> None:
    done = set_file(helm_bin, tmp_path, TEAMS_POLICY)
    assert done.returncode == 0, done.stderr
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    validate_all(objects)
    (cm,) = [c for c in by_kind(objects, "ConfigMap")
             if c["metadata"]["name"] == "gpu-webhook-policy"]
    assert cm["data"]["policy.yaml"] == TEAMS_POLICY
    assert ledger_names(objects) == ["gpu-webhook-ledger-vision"]
    # The leader writes the webhooks this policy needs (deploy/README.md): it is told to.
    assert "--webhook-configurations-sync=fix" in container(objects)["args"]


@pytest.mark.parametrize(("text", "says"), [
    ("kind: GPUPolicy\nspec: [unclosed\n", "policy.inline: not a YAML document"),
    ("apiVersion: v1\nkind: ConfigMap\n", 'a policy has kind: GPUPolicy'),
])
def test_a_policy_file_that_is_no_policy_fails_the_render_saying_so(
        helm_bin: str, tmp_path: Path, text: str, says: str) -> None:
    done = set_file(helm_bin, tmp_path, text)
    assert done.returncode != 0
    assert says in done.stderr


def test_deploy_readmes_own_policy_lines_render_with_a_stock_helm(helm_bin: str,
                                                                  tmp_path: Path) -> None:
    # As a user runs them: from a directory holding the tree's deploy/ and policy.yaml.
    (tmp_path / "deploy").symlink_to(DEPLOY)
    (tmp_path / "policy.yaml").write_text(TEAMS_POLICY)
    lines = [ln for ln in readmekit.own_policy_section().split("```sh\n", 1)[1]
             .split("\n```", 1)[0].splitlines() if ln.startswith("helm ")]
    assert [ln.split()[1] for ln in lines] == ["install", "template"]
    for line in lines:
        words = shlex.split(line)
        if words[1] == "install":  # as rendered by it, against the version the tests run
            words = ["helm", "template", *[w for w in words[2:] if w != "--create-namespace"],
                     "--kube-version", kube_version()]
        done = subprocess.run([helm_bin, *words[1:]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{line}: {done.stderr}"
        objects = [d for d in yaml.safe_load_all(done.stdout) if d]
        (cm,) = [c for c in by_kind(objects, "ConfigMap")
                 if c["metadata"]["name"] == "gpu-webhook-policy"]
        assert cm["data"]["policy.yaml"] == TEAMS_POLICY
    # Without --kube-version a stock helm assumes a version below the chart's floor.
    bare = [w for w in shlex.split(lines[1]) if w not in ("--kube-version", "1.37.0")]
    done = subprocess.run([helm_bin, *bare[1:]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode != 0 and "incompatible with Kubernetes" in done.stderr


def test_deploy_readmes_kustomize_overlay_serves_its_own_policy(tmp_path: Path) -> None:
    objects = kustomize(readmekit.own_policy_overlay(tmp_path, TEAMS_POLICY))
    validate_all(objects)
    (cm,) = [c for c in by_kind(objects, "ConfigMap")
             if c["metadata"]["name"] == "gpu-webhook-policy"]
    assert cm["data"]["policy.yaml"] == TEAMS_POLICY
    (c,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--webhook-configurations-sync=fix" in c["args"]


def test_the_install_record_follows_the_values(helm_bin: str) -> None:
    objects = template(helm_bin, "failurePolicy=Ignore", "exemptNamespaces={monitoring,ci}",
                       namespace="gpu-admission")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        record = json.loads(one(objects, kind)["metadata"]["annotations"][
            "gpu-webhook.dev/install"])
        assert record == {"namespace": "gpu-admission", "exemptNamespaces": ["ci", "monitoring"],
                          "mutatingFailurePolicy": "Ignore",
                          "validatingFailurePolicy": "Ignore", "timeoutSeconds": 5,
                          "service": {"name": "gpu-webhook", "port": 443}}


def test_a_webhook_url_is_called_instead_of_the_service_and_recorded(helm_bin: str) -> None:
    objects = template(helm_bin, "webhookURL=https://10.0.0.5:8443")
    validate_all(objects)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(objects, kind)
        for hook in config["webhooks"]:
            assert set(hook["clientConfig"]) == {"url"}
            assert hook["clientConfig"]["url"].startswith("https://10.0.0.5:8443/")
        record = json.loads(config["metadata"]["annotations"]["gpu-webhook.dev/install"])
        assert record["url"] == "https://10.0.0.5:8443" and "service" not in record
    with pytest.raises(ChartRefused) as refused:
        template(helm_bin, "webhookURL=http://10.0.0.5:8443", ok=False)
    assert "webhookURL" in str(refused.value)


def test_service_monitor_and_kept_crds(helm_bin: str) -> None:
    assert not by_kind(template(helm_bin), "ServiceMonitor")
    objects = template(helm_bin, "serviceMonitor.enabled=true", "serviceMonitor.interval=15s",
                       "serviceMonitor.labels.release=prometheus", "crds.keep=true")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service = one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"], endpoint["interval"]) == (
        "https", "https", "/metrics", "15s")
    assert endpoint["tlsConfig"]["serverName"] in SERVICE_NAMES
    for crd in by_kind(objects, "CustomResourceDefinition"):
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


@pytest.mark.parametrize(("values", "says"), [
    # values.schema.json: the value's path and what it may be
    (["certificates.mode=vault"],
     "at '/certificates/mode': value must be one of 'self-managed', 'cert-manager'"),
    (["failurePolicy=Never"], "at '/failurePolicy': value must be one of 'Fail', 'Ignore'"),
    (["replica=3"], "additional properties 'replica' not allowed"),
    (["replicas=0"], "at '/replicas'"),
    (["policy.existingObject=p", "policy.inline.kind=GPUPolicy"],
     "policy.inline and policy.existingObject are two sources"),
])
def test_a_bad_value_is_refused_with_its_name(helm_bin: str, values: list[str],
                                              says: str) -> None:
    with pytest.raises(ChartRefused) as refused:
        template(helm_bin, *values, ok=False)
    assert says in str(refused.value)


def chart_as_component(helm_bin: str, tmp_path: Path, mode: str, value: str,
                       component: str) -> dict[tuple[str, str], Any]:
    """The chart rendered with ``value`` (and certificates ``mode``), asserted equal, object
    by object, to ``mode``'s overlay built with ``deploy/components/<component>``."""
    chart = without_helm_labels(template(helm_bin, f"certificates.mode={mode}", value))
    tree = tmp_path / "deploy"
    shutil.copytree(DEPLOY, tree)
    overlay = tree / "overlays" / mode / "kustomization.yaml"
    overlay.write_text(yaml.safe_dump({**yaml.safe_load(overlay.read_text()),
                                       "components": [f"../../components/{component}"]}))
    built = without_helm_labels(kustomize(overlay.parent))
    del built[("Namespace", "gpu-webhook")]
    assert sorted(chart) == sorted(built)
    for key, obj in built.items():
        assert chart[key] == obj, key
    return chart


@pytest.mark.parametrize("mode", ["self-managed", "cert-manager"])
def test_quota_commit_leader_renders_what_the_leader_decides_component_builds(
        helm_bin: str, mode: str, tmp_path: Path) -> None:
    chart = chart_as_component(helm_bin, tmp_path, mode, "quotaCommit=leader",
                               "leader-decides")
    env = container(list(chart.values()))["env"]
    assert [e for e in env if e["name"] == "GPU_WEBHOOK_QUOTA_COMMIT"] == [
        {"name": "GPU_WEBHOOK_QUOTA_COMMIT", "value": "leader"}]


def test_with_quota_commit_leader_every_replica_is_scraped(helm_bin: str) -> None:
    # The Service selects the leader's pod alone: a ServiceMonitor would scrape only it.
    objects = template(helm_bin, "serviceMonitor.enabled=true", "quotaCommit=leader")
    assert not by_kind(objects, "ServiceMonitor")
    monitor = one(objects, "PodMonitor")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert "gpu-webhook.dev/quota-leader" not in monitor["spec"]["selector"]["matchLabels"]
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["https"]


@pytest.mark.parametrize("mode", ["self-managed", "cert-manager"])
def test_admission_mode_fallback_renders_what_the_native_policies_component_builds(
        helm_bin: str, mode: str, tmp_path: Path) -> None:
    chart = chart_as_component(helm_bin, tmp_path, mode, "admissionMode=fallback",
                               "native-policies")
    # The leader reads the mode where the install recorded it.
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert manifests.options_of(chart[(kind, "gpu-webhook")]).admission_mode == "fallback"
    assert ("ClusterRole", "gpu-webhook-admission-policies") in chart


def test_admission_mode_webhook_grants_no_admission_policies(helm_bin: str) -> None:
    objects = template(helm_bin)
    assert not [o for o in objects if o["metadata"]["name"] == "gpu-webhook-admission-policies"]
    native = template(helm_bin, "admissionMode=native")
    configuration = one(native, "MutatingWebhookConfiguration")
    assert manifests.options_of(configuration).admission_mode == "native"
