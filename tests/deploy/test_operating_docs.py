"""docs/operating.md, checked as an operator uses it: the minimum Kubernetes version is
the chart's (helm refuses an older cluster), every `kubectl apply -k`/`helm` line renders
with the same arguments, every other `kubectl` line parses (its flags and verbs are
kubectl's), the kustomize patch for a new tenant's ledger lands in the Role, the Argo CD
ignore rules cover every field the webhook sets in the workloads it mutates, and
uninstalling with `kubectl delete -k` takes the namespace (so the certificate Secret and
the ledgers) with it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from kit import console_script, helm, kube_version
from test_deploy_kustomize import find_kubectl, kustomize

from webhook.admission.offline import through_both
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import compile_policy
from webhook.policy.load import default_policy_text, load_text

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operating.md"
CHART = ROOT / "deploy" / "helm" / "gpu-webhook"
TEXT = DOC.read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)\n```", TEXT, flags=re.S)


def commands() -> list[str]:
    """Each command line of the ```sh blocks, continuation lines joined."""
    out = []
    for block in blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.startswith("#"):
                out.append(line.split("  #", 1)[0].strip())
    return out


def helm_args(line: str) -> list[str]:
    """A `helm upgrade|install NAME CHART ...` line as `helm template` arguments."""
    words = shlex.split(line)
    assert words[:2] in (["helm", "upgrade"], ["helm", "install"]), line
    return ["template", *[w for w in words[2:] if w != "--reuse-values"],
            "--kube-version", kube_version()]


# --------------------------------------------------------------------------- version


def test_the_minimum_kubernetes_version_is_the_charts() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.30.0-0"
    assert "**Kubernetes 1.30 or newer.**" in TEXT
    assert f'`kubeVersion: "{chart["kubeVersion"]}"`' in TEXT
    # What the floor rests on is in the manifests: matchConditions and the sleep action.
    assert "matchConditions:" in (ROOT / "deploy" / "base" / "webhooks.yaml").read_text()
    assert "sleep:" in (ROOT / "deploy" / "base" / "deployment.yaml").read_text()


@pytest.mark.parametrize(("version", "installs"), [("v1.29.9", False), ("v1.30.0", True),
                                                   ("v1.30.4-eks-a737599", True)])
def test_helm_refuses_a_cluster_older_than_the_minimum(version: str, installs: bool) -> None:
    done = subprocess.run([helm(), "template", "gpu-webhook", str(CHART), "-n", "gpu-webhook",
                           "--kube-version", version], capture_output=True, text=True,
                          timeout=120, check=False)
    assert (done.returncode == 0) == installs, done.stderr
    if not installs:
        assert "is incompatible with Kubernetes v1.29.9" in done.stderr


# --------------------------------------------------------------------------- commands


def test_every_install_and_upgrade_line_renders() -> None:
    lines = [c for c in commands()
             if re.match(r"(kubectl (apply|delete) -k|helm (upgrade|install)) ", c)]
    assert len(lines) >= 3
    for line in lines:
        if line.startswith("kubectl"):
            assert kustomize(ROOT / shlex.split(line)[3])
            continue
        done = subprocess.run([helm(), *helm_args(line)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{line}: {done.stderr}"
        if "failurePolicy=Ignore" in line:  # the emergency switch does switch
            hooks = [h for d in yaml.safe_load_all(done.stdout) if d and d["kind"] in (
                "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
                for h in d["webhooks"]]
            assert {h["failurePolicy"] for h in hooks} == {"Ignore"}


def test_every_other_kubectl_line_parses() -> None:
    """Run against an address nobody listens on: a flag, verb or resource kubectl does not
    know fails before it connects, with kubectl's own usage error."""
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip("no kubectl (run tests/e2e/controlplane/build.sh)")
    lines = [c for c in commands() if c.startswith("kubectl ") and " -k " not in c]
    assert len(lines) >= 8
    env = {**os.environ, "KUBECONFIG": os.devnull}
    for line in lines:
        words = shlex.split(line.split(" | ", 1)[0])
        done = subprocess.run([kubectl, "--server=https://127.0.0.1:9", "--token=x",
                               "--request-timeout=2s",
                               *words[1:]], capture_output=True, text=True, timeout=60,
                              env=env, check=False)
        assert "connect: connection refused" in done.stderr or "couldn't get" in done.stderr, (
            f"{line}: {done.stderr}")


def test_every_gpu_webhook_line_is_a_command() -> None:
    lines = [c for c in commands() if c.startswith("gpu-webhook ")]
    assert lines
    for line in lines:
        words = shlex.split(line)
        path = [w for w in words[1:] if not w.startswith("-")][:2]
        done = subprocess.run([console_script(), *path[:1], "--help"], capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, line
        for flag in (w.split("=")[0] for w in words if w.startswith("-")):
            assert flag in done.stdout, f"{line}: {flag} is not a flag of {path[0]}"


# --------------------------------------------------------------------------- RBAC


def test_the_new_tenant_patch_names_its_ledger_in_the_role(tmp_path: Path) -> None:
    [patch] = [yaml.safe_load(b) for b in blocks("yaml") if "gpu-webhook-quota-ledger" in b]
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(ROOT / "deploy" / "overlays" / "self-managed", overlay)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
         "resources": [base], **patch}))
    [role] = [o for o in kustomize(overlay)
              if o["kind"] == "Role" and o["metadata"]["name"] == "gpu-webhook-quota-ledger"]
    [named] = [r for r in role["rules"] if "resourceNames" in r]
    assert "gpu-webhook-ledger-vision" in named["resourceNames"]
    assert "gpu-webhook-ledger-research" in named["resourceNames"]  # the others kept


# --------------------------------------------------------------------------- GitOps


def _workload(kind: str) -> dict[str, Any]:
    api = "batch/v1" if kind == "Job" else "apps/v1"
    spec: dict[str, Any] = {"template": {"metadata": {"labels": {"app": "llm"}}, "spec": {
        "containers": [{"name": "serve", "image": "vllm/vllm-openai",
                        "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "4"}}},
                       {"name": "sidecar", "image": "envoy"}],
        "tolerations": [{"key": "team", "operator": "Exists"}]}}}
    if kind != "Job":
        spec |= {"replicas": 2, "selector": {"matchLabels": {"app": "llm"}}}
    if kind == "Job":
        spec["template"]["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": api, "kind": kind,
            "metadata": {"name": "llm", "namespace": "research"}, "spec": spec}


_MISSING = object()


def _changed(a: Any, b: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths where ``b`` differs from ``a``: leaves of maps, whole lists that differ
    in length."""
    if isinstance(b, dict) and (a is _MISSING or isinstance(a, dict)):
        old = a if isinstance(a, dict) else {}
        return [p for k in old.keys() | b.keys()
                for p in _changed(old.get(k, _MISSING), b.get(k, _MISSING), (*path, k))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b, strict=True))
                for p in _changed(x, y, (*path, i))]
    return [] if a == b else [path]


def _jq_path(expr: str) -> list[Any]:
    """``.a.b[]."c/d"`` as ["a", "b", [], "c/d"] ([] matches any index)."""
    out: list[Any] = []
    for quoted, name, each in re.findall(r'\."([^"]+)"|\.([A-Za-z0-9_]+)|(\[\]\??)', expr):
        out.append([] if each else (quoted or name))
    return out


def _covered(path: tuple[Any, ...], expr: str) -> bool:
    want = _jq_path(expr)
    return len(path) >= len(want) and all(
        (isinstance(p, int) if w == [] else p == w) for p, w in zip(path, want, strict=False))


def test_argo_cd_server_side_diff_includes_the_webhooks_mutations() -> None:
    apps = [yaml.safe_load(b) for b in blocks("yaml") if "kind: Application" in b]
    options = apps[0]["metadata"]["annotations"]["argocd.argoproj.io/compare-options"]
    assert set(options.split(",")) == {"ServerSideDiff=true", "IncludeMutationWebhook=true"}


def test_argo_cd_ignore_rules_cover_every_field_the_webhook_sets() -> None:
    apps = [yaml.safe_load(b) for b in blocks("yaml") if "kind: Application" in b]
    rules = apps[1]["spec"]["ignoreDifferences"]
    policy = compile_policy(load_text(default_policy_text(), "<embedded default>"))
    for rule in rules:
        obj = _workload(rule["kind"])
        assert obj["apiVersion"].split("/")[0] == rule["group"]
        out = through_both(parse_review(orjson.dumps(request_review(obj))), policy)
        assert out.allowed and out.patched is not None, out.message
        changed = _changed(obj, out.patched)
        assert changed, f"the webhook changed nothing in a {rule['kind']}"
        uncovered = [p for p in changed
                     if not any(_covered(p, e) for e in rule["jqPathExpressions"])]
        assert not uncovered, f"{rule['kind']}: Argo CD would see drift at {uncovered}"
        # ... and nothing a developer changes by hand is hidden: a CPU limit is not.
        cpu = ("spec", "template", "spec", "containers", 0, "resources", "limits", "cpu")
        assert not any(_covered(cpu, e) for e in rule["jqPathExpressions"])


# --------------------------------------------------------------------------- uninstall


@pytest.mark.parametrize("overlay", ["self-managed", "cert-manager"])
def test_delete_k_takes_the_namespace_and_so_the_secret(overlay: str) -> None:
    objects = kustomize(ROOT / "deploy" / "overlays" / overlay)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Namespace", "gpu-webhook") in kinds  # `kubectl delete -k` deletes it ...
    # ... and the Secret the self-managed replicas make is not in the manifests, but in it.
    assert ("Secret", "gpu-webhook-tls") not in kinds
    comment = (ROOT / "deploy" / "overlays" / overlay / "kustomization.yaml").read_text()
    assert "leaves it" not in comment
    said = ("`kubectl delete -k deploy/overlays/self-managed` (or `.../cert-manager`) deletes "
            "the\nnamespace")
    assert said in TEXT
