"""The audit of running pods against how GPUs are held (policies/examples/holding.yaml):
a GPU pod created before the policy gave it a deadline, a queue, or a fair share of CPU
is listed with what the webhook would do now, through the same pipeline as admission."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from webhook.admission.audit import audit
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text

PATH = Path(__file__).parents[2] / "policies" / "examples" / "holding.yaml"
POLICY = compile_policy(load_text(PATH.read_text(), str(PATH)))
H200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}


def running(name: str, namespace: str, cpu: str, **meta: Any) -> dict[str, Any]:
    gpu = {"nvidia.com/gpu": 1, "cpu": cpu, "memory": "64Gi"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "creationTimestamp": "2026-01-01T00:00:00Z", **meta},
            "spec": {"nodeName": "gpu-1", "nodeSelector": H200, "containers": [
                {"name": "main", "image": "train:1",
                 "resources": {"limits": gpu, "requests": gpu}}]},
            "status": {"phase": "Running"}}


def test_running_pods_are_told_what_holding_the_gpus_asks_now() -> None:
    notebook = running("lab", "research", "8",
                       labels={"app.kubernetes.io/component": "notebook"})
    greedy = running("greedy", "research", "64")
    ended = dict(running("old", "research", "64"), status={"phase": "Failed"})
    found = {f.subject: f for f in audit(POLICY, [notebook, greedy, ended], [],
                                         lambda ns: None)}
    lab = found["pod research/lab"]
    assert lab.verdict == "changed"
    assert "max-runtime" in lab.detail and "queue-routing" in lab.detail
    bad = found["pod research/greedy"]
    assert bad.verdict == "refused"
    assert "1 GPU with 64 CPUs: at most 24 CPUs per h200 GPU in tenant research" in bad.detail
    assert "pod research/old" not in found  # ended: holds no GPU
