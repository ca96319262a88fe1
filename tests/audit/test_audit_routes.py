"""The audit of routes to a GPU held by running pods (``webhook.engine.routes.held``):
a tenant's pod on a GPU node that may see GPUs it was not given is listed as holding a
route, with a PolicyReport result per route; on a node known to carry no GPU, or
neutralized, it holds none; where the scheduler bound a pod is not a ``nodeName``
route."""

from __future__ import annotations

from typing import Any

from kit import policy_yaml

from webhook.admission.audit import audit, policy_reports
from webhook.engine.routes.sights import node_lookup
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text

POLICY = compile_policy(load_text(policy_yaml("audit-routes", """\
  tenants:
    - name: team
      namespaces: [team]
"""), "audit-routes.yaml"))
NODES = node_lookup(POLICY, [
    {"metadata": {"name": "gpu-1"}, "status": {"capacity": {"nvidia.com/gpu": "8"}}},
    {"metadata": {"name": "cpu-1"}, "status": {"capacity": {"cpu": "64"}}}])
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def running(name: str, node: str, *containers: dict[str, Any], **spec: Any
            ) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            # As admitted: the GPU toleration the webhook adds.
            "spec": {"nodeName": node, "containers": list(containers), "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                **spec},
            "status": {"phase": "Running"}}


def c(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", **extra}


GPU = {"limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 1}}


def found(*pods: dict[str, Any]) -> dict[str, Any]:
    return {f.subject: f for f in audit(POLICY, pods, [], lambda ns: None, NODES)}


def test_routes_held_on_a_gpu_node_are_listed() -> None:
    out = found(
        running("cuda", "gpu-1", c("prep")),  # the image's NVIDIA_VISIBLE_DEVICES=all
        running("widened", "gpu-1", c("train", resources=GPU, env=[
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])),
        running("root", "gpu-1", c("agent", env=[VOID], securityContext={"privileged": True}),
                volumes=[{"name": "dev", "hostPath": {"path": "/dev"}}]),
        running("debugged", "gpu-1", c("train", resources=GPU),
                ephemeralContainers=[c("debugger-abc")]))
    assert {s: f.verdict for s, f in out.items()} == {
        "pod team/cuda": "holds", "pod team/widened": "holds", "pod team/root": "refused",
        "pod team/debugged": "holds"}
    assert [r.rule for r in out["pod team/cuda"].rules] == ["gpu-visible-devices"]
    assert "its image's value" in out["pod team/cuda"].detail
    assert 'ephemeral container "debugger-abc"' in out["pod team/debugged"].detail
    held = [r.rule for r in out["pod team/root"].rules]
    assert "privileged-on-gpu-nodes" in held
    assert "device-host-paths" in held
    reports = policy_reports(out.values(), POLICY.name, 1.5e9)
    assert {r["rule"] for r in reports["team"]["results"]} >= {
        "gpu-visible-devices", "privileged-on-gpu-nodes", "device-host-paths"}


def test_no_route_on_a_cpu_node_nor_once_neutralized() -> None:
    out = found(running("cpu", "cpu-1", c("prep")),
                running("fixed", "gpu-1", c("prep", env=[VOID]),
                        c("train", resources=GPU)))
    assert "pod team/cpu" not in out or out["pod team/cpu"].verdict == "changed"
    assert "pod team/fixed" not in out


def test_where_the_scheduler_bound_a_pod_is_not_a_node_name_route() -> None:
    out = found(running("bound", "gpu-1", c("train", resources=GPU)))
    assert all(r.rule != "node-name" for f in out.values() for r in f.rules)


def test_a_dra_container_is_taken_to_be_given_its_devices() -> None:
    p = running("dra", "gpu-1", c("train", resources={"claims": [{"name": "gpu"}]}),
                resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one"}])
    out = found(p)
    assert all(r.rule != "gpu-visible-devices" for f in out.values() for r in f.rules)
