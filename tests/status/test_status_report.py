"""``gpu-webhook status``'s report over plain objects: pods charged as the webhook
charges them, live ledger reservations for pods not yet seen, and clear errors for a
tenant or namespace the policy does not know."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text
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
