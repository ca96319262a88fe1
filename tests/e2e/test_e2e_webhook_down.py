"""The webhook down, with the configurations `gpu-webhook manifests` renders
(failurePolicy Fail): GPU pods are refused by the API server, and so are a tenant's
pods without GPUs (the routes webhooks neutralize NVIDIA_VISIBLE_DEVICES in them:
docs/security.md); everything the configuration keeps away from the webhook still goes
through: pods without GPUs of namespaces of no tenant (matchConditions and
namespaceSelector), and the exempt namespaces, so that kube-system and the webhook's own
namespace can recover the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from controlplane.cluster import ControlPlane
from e2ekit import (
    Deployment,
    NamespaceFactory,
    absent,
    apply,
    assert_denied,
    assert_succeeded,
    create_namespace,
    deployed,
    gpu_pod,
    plain_pod,
    short_id,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def down(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Deployment]:
    """The webhook installed and answering, then every replica stopped."""
    with deployed(control_plane, tmp_path_factory.mktemp("webhook-down")) as d, d.installed():
        d.stop()
        yield d


def test_gpu_pods_are_refused_while_the_webhook_is_down(
    control_plane: ControlPlane, down: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("ops")
    out = apply(control_plane, ns, gpu_pod("train", limits="1"))

    assert out.returncode != 0
    assert out.stderr.startswith(
        'Error from server (InternalError): error when creating "STDIN": Internal error '
        f'occurred: failed calling webhook "{down.mutating}": failed to call webhook: '
        f'Post "{down.url}/mutate?timeout=5s"'), out.stderr
    assert "connection refused" in out.stderr
    assert absent(control_plane, ns, "pod", "train")


def test_pods_without_gpus_outside_tenants_are_not_sent_to_the_webhook(
    control_plane: ControlPlane, down: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("no-such-tenant")
    out = apply(control_plane, ns, plain_pod("web"))
    assert_succeeded(out, "pod/web created")


def test_a_tenants_pods_without_gpus_wait_for_the_webhook(
    control_plane: ControlPlane, down: Deployment, namespace: NamespaceFactory,
) -> None:
    # Admitted unchanged, a CUDA image's NVIDIA_VISIBLE_DEVICES=all would reach the
    # runtime: with failurePolicy Fail they are refused until a replica answers.
    ns = namespace("ops")
    out = apply(control_plane, ns, plain_pod("web"))
    assert_denied(out, 'failed calling webhook "routes-1.gpu-webhook.dev"')


@pytest.mark.parametrize("exempt", ["kube-system", "e2e-exempt"],
                         ids=["kube-system", "policy-exemption"])
def test_gpu_pods_in_exempt_namespaces_are_created(
    control_plane: ControlPlane, down: Deployment, exempt: str,
) -> None:
    if control_plane.kubectl("get", "namespace", exempt, check=False).returncode != 0:
        create_namespace(control_plane, exempt, None)
    name = f"device-plugin-{short_id()}"
    out = apply(control_plane, exempt, gpu_pod(name, limits="1"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"pod/{name} created"
