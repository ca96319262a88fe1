"""``kubectl scale`` through the real API server: the scale subresource of a GPU
Deployment or StatefulSet is checked against quota, with the pod template the webhook
reads from the API server (a Scale object holds only replica counts).

There is no controller-manager: a Deployment's pods are never created, so the usage the
webhook sees is exactly the pods created here. What is checked is the admission of the
scale itself: refused when the workload could never run in full, a warning when it
does not fit what is free now, and scaling down always allowed.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from controlplane.cluster import ControlPlane
from e2ekit import (
    LEDGER_NAMESPACE,
    ROOT,
    Deployment,
    NamespaceFactory,
    apply,
    apply_until_counted,
    assert_denied,
    assert_succeeded,
    denial_prefix,
    get,
    gpu_pod,
    plain_pod,
)

pytestmark = pytest.mark.e2e


def workload(kind: str, name: str, pod: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}}
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def scale(cp: ControlPlane, ns: str, what: str, replicas: int
          ) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("scale", what, "-n", ns, f"--replicas={replicas}", check=False)


def replicas(cp: ControlPlane, ns: str, kind: str, name: str) -> int:
    return int(get(cp, ns, kind, name)["spec"]["replicas"])


def test_kubectl_scale_of_a_gpu_deployment_is_checked_against_quota(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    cp = control_plane
    ns = namespace("scale")  # tenant scale: 8 GPUs
    out = apply(cp, ns, workload("Deployment", "trainer", gpu_pod("trainer", limits="2")))
    assert_succeeded(out, "deployment.apps/trainer created")

    # 5 x 2 = 10 GPUs can never fit a quota of 8: refused, with the numbers.
    out = scale(cp, ns, "deployment/trainer", 5)
    assert out.returncode != 0
    assert out.stderr.strip() == (
        "Error from server (Forbidden): " + denial_prefix(webhook.scaling)
        + f"deployment {ns}/trainer, scaled from 1 to 5 replicas: asks for 5 pods x 2 = 10 "
        "GPUs at once, but tenant scale's quota is 8 GPUs: it can never run in full. Run at "
        "most 4 pods of this size, or fewer GPUs per pod. [rule quota, tenant scale]")
    assert replicas(cp, ns, "deployment", "trainer") == 1

    # A pod of 4 GPUs runs in the tenant: 4 are free. 1 -> 3 adds 2 pods x 2 = 4: fits.
    apply_until_counted(cp, webhook, ns, gpu_pod("holder", limits="4"),
                        "the webhook to count the running pod", refused=5)
    out = scale(cp, ns, "deployment/trainer", 3)
    assert_succeeded(out, "deployment.apps/trainer scaled")
    assert "Warning" not in out.stderr
    assert replicas(cp, ns, "deployment", "trainer") == 3

    # 3 -> 4 fits the quota (4 x 2 = 8) but not what is free now (no pod of the
    # deployment exists here; the holder's 4 GPUs do): allowed, with a warning.
    apply_until_counted(cp, webhook, ns, gpu_pod("holder-2", limits="4"),
                        "the webhook to count the second pod", refused=1)
    out = scale(cp, ns, "deployment/trainer", 4)
    assert_succeeded(out, "deployment.apps/trainer scaled")
    assert (f"Warning: deployment {ns}/trainer, scaled from 3 to 4 replicas: asks for 1 pod "
            "x 2 GPUs, but only 0 of tenant scale's 8 GPUs are free now: 0 of its pods can "
            "start now and the rest will be refused until quota frees up. A refused pod is "
            "not shown at kubectl apply: it shows up as an event on its ReplicaSet "
            "(kubectl get events). [rule quota, tenant scale]") in out.stderr
    assert replicas(cp, ns, "deployment", "trainer") == 4

    # Scaling down is always allowed, quota full or not.
    out = scale(cp, ns, "deployment/trainer", 1)
    assert_succeeded(out, "deployment.apps/trainer scaled")
    assert out.stderr == ""
    assert replicas(cp, ns, "deployment", "trainer") == 1


def test_kubectl_scale_of_a_statefulset_is_checked_and_a_cpu_workload_is_not(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    cp = control_plane
    ns = namespace("scale")
    out = apply(cp, ns, workload("StatefulSet", "shards", gpu_pod("shards", limits="8")),
                workload("Deployment", "web", plain_pod("web"), replicas=2))
    assert out.returncode == 0, out.stderr

    out = scale(cp, ns, "statefulset/shards", 2)
    assert_denied(out, denial_prefix(webhook.scaling) + f"statefulset {ns}/shards, scaled "
                  "from 1 to 2 replicas: asks for 2 pods x 8 = 16 GPUs at once")
    assert replicas(cp, ns, "statefulset", "shards") == 1

    # A workload without GPUs is sent too (a Scale cannot tell), read, and let through.
    out = scale(cp, ns, "deployment/web", 200)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert replicas(cp, ns, "deployment", "web") == 200


def test_the_shipped_rbac_lets_the_webhook_get_workloads_and_nothing_more(
    control_plane: ControlPlane, namespace: NamespaceFactory,
) -> None:
    # The replicas here run with admin credentials; the ServiceAccount of deploy/base must
    # be allowed the one read a scale-up needs (a GET), in any namespace.
    cp = control_plane
    rbac = ROOT / "deploy" / "base" / "rbac.yaml"
    cp.kubectl("apply", "-n", LEDGER_NAMESPACE, "-f", str(rbac))
    ns = namespace("scale")
    account = f"system:serviceaccount:{LEDGER_NAMESPACE}:gpu-webhook"

    def can(verb: str, resource: str) -> bool:
        out = cp.kubectl("auth", "can-i", verb, resource, "-n", ns, f"--as={account}",
                         check=False)
        return out.stdout.strip() == "yes"

    for resource in ("deployments.apps", "statefulsets.apps", "replicasets.apps"):
        assert can("get", resource), resource
        assert not can("update", resource), resource
    # A list only of what the leader's periodic audit reads (webhook.admission.audit).
    assert can("list", "deployments.apps") and can("list", "statefulsets.apps")
    assert not can("list", "replicasets.apps")
    assert not can("get", "daemonsets.apps")
