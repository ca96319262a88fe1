"""The three admission modes with every replica stopped (``gpu-webhook manifests
--admission-mode``, docs/security.md's table): what a tenant's developer gets from the
API server alone.

- ``webhook``: no pod of a tenant's namespace is created (the routes webhooks fail
  closed), GPU pods neither.
- ``fallback`` and ``native``: a pod without GPUs is still created, every container given
  ``NVIDIA_VISIBLE_DEVICES=void`` by the API server's MutatingAdmissionPolicy; a
  privileged pod tolerating every taint is refused in the webhook's words; a GPU pod is
  refused (its GPU webhooks fail closed: quota needs the webhook) unless the install chose
  failurePolicy Ignore, when it is created with its request completed, the GPU
  tolerations added and its tenant's product and racks pinned, and charged to no quota.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import (
    Deployment,
    apply,
    deployed,
    get,
    gpu_webhook,
    short_id,
    wait_uninstalled,
    wait_until,
)

pytestmark = pytest.mark.e2e

POLICY = Path(__file__).parent / "policies" / "native.yaml"
TENANT_NS = "modes-beta"  # the policy's tenant beta, chosen by label
LABELS = {"gpu.example.com/tenant": "beta"}
PINNED_NS = "modes-pinned"  # the policy's tenant pinned (by name): a100, racks a and b


def plain(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "initContainers": [{"name": "fetch", "image": "cuda"}],
        "containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.4.1-base"},
                       {"name": "log", "image": "busybox",
                        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]}]}}


def privileged(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        # Key-less: tolerates every taint (one naming the GPU taint is stripped first).
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "tool", "image": "cuda",
                        "securityContext": {"privileged": True}}]}}


def gpu(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "containers": [{"name": "train", "image": "cuda",
                        "resources": {"requests": {"nvidia.com/gpu": "2"}}}]}}


class Installed:
    def __init__(self, cp: ControlPlane, d: Deployment) -> None:
        self.cp, self.d = cp, d
        self.docs: list[dict[str, Any]] = []

    def install(self, mode: str, failure: str = "Fail") -> None:
        self.remove()
        out = gpu_webhook("manifests", "--policy", str(POLICY), "--url", self.d.url,
                          "--ca-file", str(self.d.ca_file), "--admission-mode", mode,
                          "--mutating-failure-policy", failure,
                          "--validating-failure-policy", failure).stdout
        self.docs = [doc for doc in yaml.safe_load_all(out) if doc]
        self.cp.kubectl("apply", "-f", "-", input=out)

    def remove(self) -> None:
        for doc in self.docs:
            self.cp.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"],
                            "--ignore-not-found", "--wait=false")
        self.docs = []


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Installed]:
    """The webhook's certificates and address, every replica stopped: the API server
    finds no one at the URL its configurations name."""
    for ns, labels in ((TENANT_NS, LABELS), (PINNED_NS, {})):
        control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": labels}}))
    with deployed(control_plane, tmp_path_factory.mktemp("modes"), policy=POLICY) as d:
        d.stop()
        inst = Installed(control_plane, d)
        try:
            yield inst
        finally:
            inst.remove()
            # Gone from the API server's caches too: the next module's probe pod would
            # otherwise be mutated by a policy still in effect.
            wait_uninstalled(control_plane)


def create(cp: ControlPlane, pod: dict[str, Any]) -> tuple[bool, str]:
    out = apply(cp, TENANT_NS, pod)
    return out.returncode == 0, out.stderr


def settled(cp: ControlPlane, mode: str) -> None:
    """Wait for the API server to act on what was just installed (its caches follow
    configurations and policies by watch): a plain pod's dry run tells."""
    def now() -> bool:
        out = apply(cp, TENANT_NS, plain(f"probe-{short_id()}"), dry_run=True)
        if mode == "webhook":
            return out.returncode != 0 and "failed calling webhook" in out.stderr
        if out.returncode != 0:
            return False
        pod = yaml.safe_load(out.stdout)
        if pod["spec"]["containers"][0].get("env") != [
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]:
            return False
        # The validating policies are loaded apart from the mutating ones.
        out = apply(cp, TENANT_NS, privileged(f"probe-{short_id()}"), dry_run=True)
        return out.returncode != 0 and "ValidatingAdmissionPolicy" in out.stderr

    wait_until(f"admission mode {mode} to be in effect", now, timeout=60, every=0.5)


def test_webhook_mode_refuses_every_tenant_pod_while_no_replica_answers(
        control_plane: ControlPlane, installed: Installed) -> None:
    installed.install("webhook")
    settled(control_plane, "webhook")
    for pod in (plain(f"plain-{short_id()}"), privileged(f"priv-{short_id()}"),
                gpu(f"gpu-{short_id()}")):
        ok, said = create(control_plane, pod)
        assert not ok and "failed calling webhook" in said, said


@pytest.mark.parametrize("mode", ["fallback", "native"])
def test_the_api_server_alone_keeps_the_stateless_rules(
        control_plane: ControlPlane, installed: Installed, mode: str) -> None:
    installed.install(mode)
    settled(control_plane, mode)

    name = f"plain-{short_id()}"
    ok, said = create(control_plane, plain(name))
    assert ok, said
    spec = get(control_plane, TENANT_NS, "pod", name)["spec"]
    void = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert spec["initContainers"][0]["env"] == void
    assert spec["containers"][0]["env"] == void  # the CUDA image's default is overridden
    assert spec["containers"][1]["env"] == void  # "none" made void, as the webhook does
    annotations = get(control_plane, TENANT_NS, "pod", name)["metadata"]["annotations"]
    assert annotations["gpu-webhook.dev/mutated"] == "gpu-visible-devices"

    ok, said = create(control_plane, privileged(f"priv-{short_id()}"))
    assert not ok
    assert "ValidatingAdmissionPolicy 'gpu-webhook.beta'" in said, said
    assert ('container "tool": is privileged (securityContext.privileged: true) in a pod '
            "that can run on a GPU node (it tolerates every taint)") in said
    assert "[rule privileged-on-gpu-nodes, tenant beta]" in said

    # A GPU pod needs the webhook for its quota: refused while none answers.
    ok, said = create(control_plane, gpu(f"gpu-{short_id()}"))
    assert not ok and "failed calling webhook" in said, said


def test_fallback_with_failure_policy_ignore_completes_gpu_pods_uncharged(
        control_plane: ControlPlane, installed: Installed) -> None:
    installed.install("fallback", failure="Ignore")
    settled(control_plane, "fallback")
    name = f"gpu-{short_id()}"
    ok, said = create(control_plane, gpu(name))
    assert ok, said
    pod = get(control_plane, TENANT_NS, "pod", name)
    res = pod["spec"]["containers"][0]["resources"]
    assert res == {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}
    tolerations = pod["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert {"key": "gpu.example.com/dedicated", "operator": "Equal", "value": "ml"} in tolerations
    assert pod["metadata"]["annotations"]["gpu-webhook.dev/mutated"] == (
        "gpu-requests,gpu-tolerations")
    # A tenant with products and racks: the GPU pod is also pinned by the API server,
    # as the webhook pins it (its default product, its racks).
    name = f"gpu-{short_id()}"
    out = apply(control_plane, PINNED_NS, gpu(name))
    assert out.returncode == 0, out.stderr
    pod = get(control_plane, PINNED_NS, "pod", name)
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]},
        {"key": "topology.example.com/gpu-rack", "operator": "In",
         "values": ["rack-a", "rack-b"]}]}]
    assert pod["metadata"]["annotations"]["gpu-webhook.dev/mutated"] == (
        "gpu-requests,gpu-tolerations,gpu-node-affinity")
