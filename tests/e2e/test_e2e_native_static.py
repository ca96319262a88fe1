"""The native admission policies and the webhook configurations as files the API server
loads at start (``gpu-webhook manifests --static-dir``; manifest-based admission
control, KEP-5793): a kube-apiserver of its own started with
``--admission-control-config-file`` and the feature gate enforces them from its first
request, with no webhook answering: a tenant's pod without GPUs is voided, a privileged
one refused in the webhook's words. The API lists none of them, and nobody can delete
them, or create an object that passes for one of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.cluster import ControlPlane, build_binaries
from e2ekit import apply, gpu_webhook

pytestmark = pytest.mark.e2e

POLICY = Path(__file__).parent / "policies" / "native.yaml"
GATE = "--feature-gates=ManifestBasedAdmissionControlConfig=true"


@pytest.fixture(scope="module")
def static_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    files = tmp_path_factory.mktemp("static-admission")
    # No replica anywhere: the URL refuses connections.
    done = gpu_webhook("manifests", "--policy", str(POLICY), "--url", "https://127.0.0.1:9",
                       "--admission-mode", "native", "--static-dir", str(files))
    assert "wrote" in done.stderr and GATE in done.stderr, done.stderr
    config = files / "admission-configuration.yaml"
    cp = ControlPlane(build_binaries(), tmp_path_factory.mktemp("static-cp"),
                      extra_apiserver_args=[f"--admission-control-config-file={config}", GATE])
    cp.start()
    try:
        cp.kubectl("create", "namespace", "eq-alpha-native")
        yield cp
    finally:
        cp.stop()


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "cuda"}], **spec}}


def test_the_files_are_enforced_from_the_first_request(static_cp: ControlPlane) -> None:
    out = apply(static_cp, "eq-alpha-native", pod("web"), dry_run=True)
    assert out.returncode == 0, out.stderr
    env = yaml.safe_load(out.stdout)["spec"]["containers"][0]["env"]
    assert env == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]

    out = apply(static_cp, "eq-alpha-native", pod("debug", tolerations=[{"operator": "Exists"}],
                                                  containers=[{"name": "c", "image": "cuda",
                                                               "securityContext": {
                                                                   "privileged": True}}]))
    assert out.returncode != 0
    assert "ValidatingAdmissionPolicy 'gpu-webhook.alpha.static.k8s.io'" in out.stderr
    assert "[rule privileged-on-gpu-nodes, tenant alpha]" in out.stderr

    # A GPU pod needs the webhook (its quota): refused while none answers.
    out = apply(static_cp, "eq-alpha-native", pod("train", containers=[{
        "name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]))
    assert out.returncode != 0 and "failed calling webhook" in out.stderr, out.stderr


def test_the_api_can_neither_see_nor_remove_them(static_cp: ControlPlane) -> None:
    for kind in ("mutatingadmissionpolicies", "validatingadmissionpolicies",
                 "mutatingwebhookconfigurations"):
        listed = static_cp.kubectl("get", kind, "-o", "name").stdout
        assert "gpu-webhook" not in listed, listed
    gone = static_cp.kubectl("delete", "mutatingadmissionpolicy",
                             "gpu-webhook.alpha.static.k8s.io", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stderr
    # Nor can an object through the API take a static one's name.
    fake = {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "gpu-webhook.alpha.static.k8s.io"},
            "spec": {"policyName": "gpu-webhook.alpha.static.k8s.io",
                     "validationActions": ["Audit"]}}
    made = static_cp.kubectl("create", "-f", "-", input=yaml.safe_dump(fake), check=False)
    assert made.returncode != 0 and "static.k8s.io" in made.stderr, made.stderr
