"""Deployments and Jobs: their pod templates are mutated and checked when they are
applied, so a developer hears about a problem from ``kubectl apply``, not from a
ReplicaSet event. And a tenant in warn mode: kubectl prints our warnings, nothing is
blocked.
"""

from __future__ import annotations

from typing import Any

import pytest
from controlplane.cluster import ControlPlane
from e2ekit import (
    GPU_TOLERATION,
    MUTATED_ANNOTATION,
    Deployment,
    NamespaceFactory,
    absent,
    apply,
    assert_gpu_template_patched,
    assert_refused_at_create,
    assert_succeeded,
    get,
    gpu_deployment,
    gpu_job,
    gpu_pod,
)

pytestmark = pytest.mark.e2e


def template_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def test_deployment_template_is_mutated_at_apply(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("research")
    out = apply(control_plane, ns, gpu_deployment("trainer", limits="2"))
    assert_succeeded(out, "deployment.apps/trainer created")

    stored = get(control_plane, ns, "deployment", "trainer")
    assert_gpu_template_patched(template_spec(stored), "2")
    assert MUTATED_ANNOTATION in stored["spec"]["template"]["metadata"]["annotations"]


def test_job_template_requests_are_completed_at_apply(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("research")
    # Templates are not defaulted like pods: a request without a limit would be
    # refused by the API server's own validation if the webhook did not complete it.
    out = apply(control_plane, ns, gpu_job("finetune", requests="1"))
    assert_succeeded(out, "job.batch/finetune created")

    spec = template_spec(get(control_plane, ns, "job", "finetune"))
    assert spec["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    assert GPU_TOLERATION in spec["tolerations"]


def test_a_bad_template_is_refused_at_apply(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("research")
    out = apply(control_plane, ns, gpu_deployment("half", limits="500m"))

    assert_refused_at_create(
        out, webhook.mutating,
        f"deployment {ns}/half, pod template, container \"train\": nvidia.com/gpu limit "
        "0.5 is not a whole number. GPUs are whole devices: ask for a whole number of 1 "
        'or more, e.g. "1" (or remove it, or write 0, for no GPU). '
        "[rule gpu-whole-number, tenant research]")
    assert absent(control_plane, ns, "deployment", "half")


def test_warn_mode_tenant_sees_warnings_and_the_pod_is_created(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("trial")
    out = apply(control_plane, ns, gpu_pod("big", limits="2"))

    assert_succeeded(out, "pod/big created")
    assert (f"Warning: pod {ns}/big: asks for 2 GPUs in all (counted as Kubernetes does: app "
            "containers and sidecars together, or the largest init container); tenant trial "
            "allows at most 1 GPU per pod. Ask for 1 or fewer, or split the work across pods. "
            "[rule max-gpus-per-pod, tenant trial]") in out.stderr.splitlines()
    assert out.stderr.count("Warning:") == 1
    stored = get(control_plane, ns, "pod", "big")
    assert GPU_TOLERATION in stored["spec"]["tolerations"]


def test_warn_mode_deployment_warns_at_apply(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("trial")
    out = apply(control_plane, ns, gpu_deployment("serve", limits="4"))

    assert_succeeded(out, "deployment.apps/serve created")
    assert (f"Warning: deployment {ns}/serve, pod template: asks for 4 GPUs in all") in out.stderr
