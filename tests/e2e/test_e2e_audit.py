"""``gpu-webhook audit`` against a real API server: the running pods and workloads
decided by the admission pipeline as their creation would be now. With the current
policy nothing is refused (exit 0); with a candidate that lowers the tenant's cap under
what runs, the newest pods beyond it are listed as refused and it exits 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2ekit import POLICY, apply, gpu_pod, gpu_webhook

pytestmark = pytest.mark.e2e


def test_audit_lists_the_pods_over_a_lowered_cap(control_plane, namespace,
                                                  tmp_path: Path) -> None:
    ns = namespace("audit")  # tenant audit: 8 GPUs
    for name in ("a-0", "a-1", "a-2"):  # 6 GPUs, oldest first
        out = apply(control_plane, ns, gpu_pod(name, limits="2", requests="2"))
        assert out.returncode == 0, out.stderr
    kube = ["--kubeconfig", str(control_plane.kubeconfig), "-n", ns]

    out = gpu_webhook("audit", *kube, "--policy", str(POLICY), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "REFUSED" not in out.stdout
    assert "3 pods, 0 workloads: 0 would be refused" in out.stderr

    text = POLICY.read_text()
    current = ("    - name: audit\n      namespaceSelector:\n        matchLabels: "
               "{gpu.example.com/tenant: audit}\n      maxGpusPerPod: 8\n      quota:\n"
               "        gpus: 8\n")
    assert text.count(current) == 1
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(text.replace(current, current.replace("gpus: 8", "gpus: 4")))
    out = gpu_webhook("audit", *kube, "--policy", str(candidate), check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 1, out.stdout
    assert refused[0].startswith(f"REFUSED pod {ns}/a-2: pod {ns}/a-2: exceeded quota: "
                                 "tenant audit would use 6 of its 4 GPUs: 4 in use")
    assert "1 would be refused" in out.stderr
