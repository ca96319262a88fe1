"""``gpu-webhook status``'s report over plain objects: pods charged as the webhook
charges them, live ledger reservations for pods not yet seen, and clear errors for a
tenant or namespace the policy does not know."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kit import policy_yaml

from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text
from webhook.quota.status import gpuquota_status
from webhook.tools.status import Cluster, report, table

POLICY = Path(__file__).parents[2] / "policies" / "multi-tenant.yaml"
A100 = "NVIDIA-A100-SXM4-80GB"


def policy() -> Any:
    return compile_policy(load_text(POLICY.read_text(), str(POLICY)))


def pod(name: str, namespace: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    term = {"matchExpressions": [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": [A100]},
        {"key": "topology.example.com/gpu-rack", "operator": "In", "values": ["rack-a"]}]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                              {"nodeSelectorTerms": [term]}}}},
            "status": {"phase": phase}}


def ledger(*entries: tuple[str, str, float, float]) -> dict[str, str]:
    return {"reservations": orjson.dumps({
        key: {"ns": ns, "owner": f"pod/{key}", "product": "a100",
              "resources": {"nvidia.com/gpu": gpus}, "gpus": gpus, "expires": expires}
        for key, ns, gpus, expires in entries}).decode()}


def test_used_reserved_and_free_per_cap() -> None:
    now = time.time()
    cluster = Cluster(
        pods=[pod("a", "research", 4), pod("b", "research-dev", 2),
              pod("done", "research", 8, phase="Succeeded")],  # ended: holds nothing
        ledgers={"research": ledger(
            ("pending", "research", 3, now + 30),
            ("uid-a", "research", 4, now + 30),  # its pod is seen: not counted twice
            ("old", "research", 5, now - 1))})  # expired
    r = report(policy(), cluster, tenant="research", now=now)
    got = {(x.scope, x.cap): (x.used, x.reserved, x.limit, x.free) for x in r.rows}
    assert got[("tenant", "gpus")] == (6, 3, 32, 23)
    assert got[("tenant", "product:a100")] == (6, 3, 24, 15)
    assert got[("tenant", "pods")] == (2, 1, 40, 37)
    assert got[("namespace research-dev", "gpus")] == (2, 0, 4, 2)
    assert r.top["research"] == [("pod/a", 4), ("pod/b", 2)]
    text = table(r)
    assert text.splitlines()[0].split() == ["TENANT", "SCOPE", "CAP", "USED", "RESERVED",
                                            "LIMIT", "FREE"]
    assert "research: 2 GPU pods running; top consumers: pod/a 4, pod/b 2" in text


def test_a_namespace_shows_its_tenant_and_its_own_caps_only() -> None:
    r = report(policy(), Cluster(pods=[pod("b", "research-dev", 2)]),
               namespace="research")
    assert {x.tenant for x in r.rows} == {"research"}
    assert not any(x.scope == "namespace research-dev" for x in r.rows)


@pytest.mark.parametrize(("kw", "error"), [
    ({"tenant": "nope"}, 'no tenant "nope" in policy shared-gpu-cluster; its tenants: '
                         "research, inference, notebooks"),
    ({"namespace": "default"}, 'namespace "default" belongs to no GPU tenant of policy '
                               "shared-gpu-cluster"),
])
def test_unknown_tenant_or_namespace_is_a_clear_error(kw: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError) as exc:
        report(policy(), Cluster(), **kw)
    assert str(exc.value) == error


def test_the_report_says_how_each_tenants_gpus_are_held() -> None:
    """Maximum runtime, CPU and memory per GPU, and where the pods are sent
    (policies/examples/holding.yaml), one line per tenant; none for a tenant without."""
    path = Path(__file__).parents[2] / "policies" / "examples" / "holding.yaml"
    held = compile_policy(load_text(path.read_text(), str(path)))
    text = table(report(held, Cluster()))
    assert ("research: max runtime notebooks 8h, interactive 4h, other GPU pods 7d (longer "
            "shortened); at most 16 cpu and 128Gi memory per GPU; h200: 24 cpu and 256Gi "
            "memory per GPU; sent to kueue.x-k8s.io/queue-name=research") in text
    assert "batch: max runtime other GPU pods 1d (longer refused); sent to scheduler " \
        "volcano, scheduling.volcano.sh/queue-name=batch" in text
    assert "inference: sent to scheduler kai-scheduler, kai.scheduler/queue=inference" in text
    assert report(policy(), Cluster(), tenant="research").holding == []


EITHER = policy_yaml("either", """\
  products:
    nodeLabel: nvidia.com/gpu.product
    aliases: {a100: NVIDIA-A100-SXM4-80GB, h100: NVIDIA-H100-80GB-HBM3}
  tenants:
    - name: lab
      namespaces: [lab]
      allowedProducts: [a100, h100]
      quota: {gpus: 8}
""")


def either_pod(name: str, gpus: int, node: str | None) -> dict[str, Any]:
    """A pod of tenant lab that names no product (allowed either), bound to ``node``."""
    p = pod(name, "lab", gpus)
    del p["spec"]["affinity"]
    if node is not None:
        p["spec"]["nodeName"] = node
    return p


def test_a_pod_allowed_two_products_counts_on_the_product_of_its_node() -> None:
    either = compile_policy(load_text(EITHER, "either.yaml"))
    pods = [either_pod("a", 1, "node-a"), either_pod("h", 2, "node-h"),
            either_pod("pending", 4, None)]
    nodes = {"node-a": A100, "node-h": "NVIDIA-H100-80GB-HBM3"}
    r = report(either, Cluster(pods=pods, nodes=dict(nodes)), tenant="lab")
    # No product caps: the tenant's GPUs (all 7) in the rows, what runs where in a line.
    assert [(x.cap, x.used) for x in r.rows] == [("gpus", 7)]
    assert r.products["lab"] == [("a100", 1), ("h100", 2)]
    line = "lab: GPUs in use by product: a100 1, h100 2"
    assert line in table(r)
    # docs/quota.md shows this very line.
    assert f"`{line}`" in " ".join((POLICY.parents[1] / "docs" / "quota.md").read_text().split())
    assert gpuquota_status(r, "lab", "either")["byProduct"] == [
        {"product": "a100", "gpus": 1}, {"product": "h100", "gpus": 2}]
    # The same pod moved (a node relabelled): it follows.
    r = report(either, Cluster(pods=pods, nodes={**nodes, "node-a": "NVIDIA-H100-80GB-HBM3"}),
               tenant="lab")
    assert r.products["lab"] == [("h100", 3)]
    # Nodes not read: the pods count in the tenant's GPUs, on no product.
    r = report(either, Cluster(pods=pods), tenant="lab")
    assert r.products["lab"] == [] and "by product" not in table(r)


def test_a_tenant_with_product_caps_shows_them_as_rows_not_again_as_a_line() -> None:
    r = report(policy(), Cluster(pods=[pod("a", "research", 4)]), tenant="research")
    assert r.products["research"] == [("a100", 4)]
    assert "by product" not in table(r)
