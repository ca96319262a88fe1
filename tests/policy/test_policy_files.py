"""The policy files shipped in ``policies/``: each loads, the embedded default is the
example policy, and each example does what ``policies/README.md`` says it does.

The behaviour checks run the pure engine (what ``gpu-webhook review`` and the server
run) on small manifests, so a README claim that drifts from the code fails here.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest
from kit import validating

from webhook.admission.webhooks import mutating as mutate
from webhook.engine.decision import Decision
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_file

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
# Policy files only: policies/tests/ holds policy test suites (kind GPUPolicyTest).
ALL = sorted(p for p in POLICIES.rglob("*.yaml")
             if re.search(r"^kind: GPUPolicy\s*$", p.read_text(), re.M))
EXAMPLES = POLICIES / "examples"
README = (POLICIES / "README.md").read_text()


@pytest.mark.parametrize("path", ALL, ids=[str(p.relative_to(POLICIES)) for p in ALL])
def test_every_shipped_policy_loads(path: Path) -> None:
    policy = load_file(path)
    compile_policy(policy)
    assert policy.spec.tenants, "an example without a tenant shows little"


def test_embedded_default_is_the_example_policy_byte_for_byte() -> None:
    shipped = (ROOT / "webhook" / "defaults" / "policy.yaml").read_bytes()
    assert shipped == (POLICIES / "multi-tenant.yaml").read_bytes(), (
        "webhook/defaults/policy.yaml must be a copy of policies/multi-tenant.yaml: "
        "cp policies/multi-tenant.yaml webhook/defaults/policy.yaml")


@pytest.mark.parametrize("path", ALL, ids=[str(p.relative_to(POLICIES)) for p in ALL])
def test_readme_points_at_every_example(path: Path) -> None:
    assert str(path.relative_to(POLICIES)) in README


# ---------------------------------------------------------------- what each example does

def _policy(name: str) -> CompiledPolicy:
    return compile_policy(load_file(EXAMPLES / name))


def _pod(namespace: str, resources: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "pytorch:2"}
    if resources is not None:
        container["resources"] = resources
    meta = {"name": "p", "namespace": namespace, **extra.pop("metadata", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [container], **extra}}


def _gpu(n: int | str = 1, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    return {"limits": {resource: n}}


def _run(policy: CompiledPolicy, obj: dict[str, Any], labels: Mapping[str, str] | None = None,
         **who: Any) -> tuple[Decision, dict[str, Any], Decision | None]:
    """Mutate, apply the patch, validate the result: (mutating decision, final object,
    validating decision or None when the mutating webhook denied)."""
    def ns_labels(_: str) -> Mapping[str, str] | None:
        return labels

    body = orjson.dumps(request_review(obj, **who))
    m = mutate(parse_review(body), policy, ns_labels)
    if not m.allowed:
        return m, obj, None
    final = jsonpatch.apply_patch(copy.deepcopy(obj), m.patch) if m.patch else obj
    v = validating(parse_review(orjson.dumps(request_review(final, **who))), policy, ns_labels)
    return m, final, v


def _affinity(obj: dict[str, Any]) -> dict[str, list[str]]:
    terms = obj["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return {e["key"]: e["values"] for t in terms for e in t["matchExpressions"]}


def test_requests_and_tolerations() -> None:
    policy = _policy("requests-and-tolerations.yaml")
    m, final, v = _run(policy, _pod("ml-train", _gpu(2)))
    assert v is not None and v.allowed
    assert final["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": 2}, "requests": {"nvidia.com/gpu": 2}}
    assert final["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    m, _, _ = _run(policy, _pod("web", _gpu(1)))
    assert not m.allowed and "[rule tenant-required" in m.message


@pytest.mark.parametrize(("namespace", "metadata", "node_selector", "expect"), [
    ("research", {}, None, ["NVIDIA-A100-SXM4-80GB"]),  # the default product
    ("research", {"labels": {"gpu.example.com/product": "h100"}}, None,
     ["NVIDIA-H100-80GB-HBM3"]),
    ("research", {"annotations": {"gpu.example.com/product": "NVIDIA-H100-80GB-HBM3"}}, None,
     ["NVIDIA-H100-80GB-HBM3"]),
    ("research", {}, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, None),
    ("inference", {}, None, ["NVIDIA-L4"]),  # the only allowed product
    ("research", {"labels": {"gpu.example.com/product": "l4"}}, None, "may not use"),
    ("research", {"labels": {"gpu.example.com/product": "v100"}}, None,
     "not a product this cluster defines"),
], ids=["default", "label", "annotation-full-value", "node-selector", "single-product",
        "not-allowed", "unknown"])
def test_products(namespace: str, metadata: dict[str, Any],
                  node_selector: dict[str, str] | None, expect: list[str] | str | None) -> None:
    extra: dict[str, Any] = {"metadata": metadata}
    if node_selector:
        extra["nodeSelector"] = node_selector
    m, final, v = _run(_policy("products.yaml"), _pod(namespace, _gpu(), **extra))
    if isinstance(expect, str):
        assert not m.allowed and expect in m.message and "[rule allowed-products" in m.message
        return
    assert v is not None and v.allowed, v
    if expect is None:  # the pod's own nodeSelector already pins an allowed product
        assert "affinity" not in final["spec"]
    else:
        assert _affinity(final)["nvidia.com/gpu.product"] == expect


def test_topology_is_anded_into_every_term() -> None:
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}
    _, final, v = _run(_policy("topology.yaml"), _pod("llm", _gpu(8), affinity=own))
    assert v is not None and v.allowed
    terms = final["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 2
    for term in terms:
        assert {"key": "topology.example.com/nvlink-domain", "operator": "In",
                "values": ["nvl-1", "nvl-2"]} in term["matchExpressions"]


def test_warn_rollout() -> None:
    policy = _policy("warn-rollout.yaml")
    _, _, v = _run(policy, _pod("vision", _gpu(6)))
    assert v is not None and v.allowed
    assert any("allows at most 4 GPUs per pod" in w and "[rule max-gpus-per-pod" in w
               for w in v.warnings)
    # audit: admitted silently, but the finding is recorded (logged and counted).
    m, _, v = _run(policy, _pod("legacy-batch", _gpu(3)))
    assert v is not None and v.allowed and not v.warnings and not m.warnings
    assert [f.rule.value for f in v.findings] == ["max-gpus-per-container"]
    m, _, _ = _run(policy, _pod("legacy-batch", _gpu(1, "nvidia.com/mig-1g.10gb")))
    assert m.allowed  # audit mode also covers the mutating webhook's rules


@pytest.mark.parametrize(("namespace", "who"), [
    ("kube-system", {}),
    ("gpu-operator", {}),
    ("anywhere", {"username": "system:serviceaccount:gpu-operator:nvidia-device-plugin"}),
    ("anywhere", {"username": "admin@example.com"}),
    ("anywhere", {"groups": ["system:authenticated", "platform-oncall"]}),
], ids=["namespace", "operator-namespace", "service-account", "user", "group"])
def test_exemptions(namespace: str, who: dict[str, Any]) -> None:
    m, _, v = _run(_policy("exemptions.yaml"), _pod(namespace, _gpu()), **who)
    assert m.allowed and m.skipped == "exempt" and not m.patch
    assert v is not None and v.allowed


@pytest.mark.parametrize(("labels", "tenant"), [
    ({"gpu.example.com/tenant": "inference", "environment": "production"}, "inference"),
    ({"gpu.example.com/tenant": "inference", "environment": "dev"}, None),
    ({"gpu.example.com/tenant": "inference"}, None),
    ({}, None),
], ids=["match", "expression-fails", "label-missing", "no-labels"])
def test_namespace_selector(labels: dict[str, str], tenant: str | None) -> None:
    m, _, _ = _run(_policy("namespace-selector.yaml"), _pod("serving-7", _gpu()), labels)
    assert m.tenant == tenant
    assert m.allowed == (tenant is not None)


@pytest.mark.parametrize(("resource", "count", "allowed"), [
    ("nvidia.com/mig-3g.40gb", 2, True),  # 2 x 0.5 = 1 GPU: at the cap
    ("nvidia.com/mig-3g.40gb", 3, False),  # 1.5 GPUs
    ("nvidia.com/mig-1g.10gb", 8, True),  # 8 x 0.125 = 1
    ("nvidia.com/gpu", 1, False),  # not an allowed resource for notebooks
], ids=["two-3g", "three-3g", "eight-1g", "whole-gpu"])
def test_mig_weights(resource: str, count: int, allowed: bool) -> None:
    m, _, v = _run(_policy("mig-weights.yaml"), _pod("notebooks", _gpu(count, resource)))
    assert (m.allowed and v is not None and v.allowed) == allowed


def test_mig_pattern_makes_any_profile_a_gpu() -> None:
    policy = _policy("mig-weights.yaml")
    assert policy.is_gpu("nvidia.com/mig-7g.80gb") and not policy.is_gpu("example.com/fpga")


@pytest.mark.parametrize(("namespace", "stripped"), [("ml", True), ("gpu-operator", False)])
def test_strip_tolerations(namespace: str, stripped: bool) -> None:
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                   {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                    "effect": "NoExecute", "tolerationSeconds": 300}]
    m, final, _ = _run(_policy("strip-tolerations.yaml"),
                       _pod(namespace, {"limits": {"cpu": "2"}}, tolerations=tolerations))
    assert m.allowed
    keys = [t["key"] for t in final["spec"]["tolerations"]]
    assert keys == (["node.kubernetes.io/not-ready"] if stripped else
                    ["nvidia.com/gpu", "node.kubernetes.io/not-ready"])


def test_quotas_example_pins_every_pod_to_one_product() -> None:
    policy = _policy("quotas.yaml")
    _, final, v = _run(policy, _pod("research-dev", _gpu(2)))
    assert v is not None and v.allowed
    assert _affinity(final)["nvidia.com/gpu.product"] == ["NVIDIA-A100-SXM4-80GB"]
    [research] = policy.tenants
    assert research.quota is not None and research.quota.products == {"a100": 24, "h100": 8}
    assert research.namespace_quota["research-dev"].gpus == 4
