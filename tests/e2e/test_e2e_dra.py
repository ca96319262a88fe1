"""GPUs asked through Dynamic Resource Allocation, against the real API server with two
webhook replicas: claims and templates are pinned to the tenant's product at creation,
a pod using a template is charged its devices, a shared claim is charged once however
many pods use it, and DRA and device-plugin GPUs racing for one cap admit exactly the cap.

No scheduler or resourceclaim controller runs here (the simulated GPU cluster's suite
has them): what is checked is what the API server admits.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest
from controlplane.cluster import ControlPlane
from e2ekit import (
    Deployment,
    NamespaceFactory,
    apply,
    assert_denied,
    core_client,
    denial_prefix,
    get,
    gpu_pod,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.e2e

E2E_REPLICAS = 2  # two replicas behind a round-robin proxy (the `webhook` fixture)
A100 = "NVIDIA-A100-SXM4-80GB"


@pytest.fixture(scope="module")
def core(control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    with core_client(control_plane) as api:
        yield api


def spec(count: int) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": count}}]}}


def template(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name}, "spec": {"spec": spec(count)}}


def claim(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name}, "spec": spec(count)}


def dra_pod(name: str, *, template_name: str | None = None, claim_name: str | None = None,
            ) -> dict[str, Any]:
    """A pod asking for GPUs through a claim, carrying the GPU toleration as NVIDIA's
    own DRA examples do."""
    entry: dict[str, Any] = {"name": "gpu"}
    if template_name:
        entry["resourceClaimTemplateName"] = template_name
    if claim_name:
        entry["resourceClaimName"] = claim_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "containers": [{"name": "train", "image": "registry.local/train:1",
                        "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [entry],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                         "effect": "NoSchedule"}]}}


def create(core: client.CoreV1Api, ns: str, obj: dict[str, Any]) -> str | None:
    """Create a pod; None when admitted, else the refusal's message."""
    try:
        core.create_namespaced_pod(ns, obj)
    except ApiException as exc:
        body = orjson.loads(exc.body) if exc.body else {}
        return f"{exc.status}: {body.get('message', exc.reason)}"
    return None


def test_a_template_is_pinned_and_its_pod_charged_and_kept_on_gpu_nodes(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
    core: client.CoreV1Api,
) -> None:
    ns = namespace("dra")  # 6 GPUs, a100 only
    apply(control_plane, ns, template("two", 2), check=True)
    stored = get(control_plane, ns, "resourceclaimtemplate", "two")
    exactly = stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["selectors"] == [{"cel": {"expression": (
        "device.attributes['gpu.nvidia.com'].productName.replace(' ', '-') "
        f"in ['{A100}']")}}]

    assert create(core, ns, dra_pod("a", template_name="two")) is None
    pod = core.read_namespaced_pod("a", ns).to_dict()
    # A DRA GPU pod keeps its GPU toleration: it must reach the tainted GPU nodes.
    assert [t["key"] for t in pod["spec"]["tolerations"] or []
            if t["key"] == "nvidia.com/gpu"] == ["nvidia.com/gpu"]

    # 2 + 2 + 2 = the cap of 6; the fourth pod is refused, with the numbers.
    for name in ("b", "c"):
        assert create(core, ns, dra_pod(name, template_name="two")) is None
    refused = create(core, ns, dra_pod("d", template_name="two"))
    assert refused is not None
    assert refused.startswith(f"403: {denial_prefix(webhook.validating)}")
    assert "tenant dra would use 8 of its 6 GPUs" in refused


def test_a_shared_claim_is_charged_once_and_its_pods_add_nothing(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
    core: client.CoreV1Api,
) -> None:
    ns = namespace("dra-shared")
    apply(control_plane, ns, claim("shared", 4), check=True)  # 4 of the tenant's 6
    for i in range(3):
        assert create(core, ns, dra_pod(f"user-{i}", claim_name="shared")) is None
    # 2 left: a 3-GPU device-plugin pod does not fit, a 2-GPU one does.
    refused = create(core, ns, gpu_pod("big", limits="3"))
    assert refused is not None and "tenant dra-shared would use 7 of its 6 GPUs" in refused
    assert create(core, ns, gpu_pod("fits", limits="2")) is None
    out = apply(control_plane, ns, claim("another", 1))
    assert_denied(out, "tenant dra-shared would use 7 of its 6 GPUs")


def test_dra_and_device_plugin_pods_racing_across_replicas_admit_exactly_the_cap(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
    core: client.CoreV1Api,
) -> None:
    ns = namespace("dra-race")  # 10 GPUs
    apply(control_plane, ns, template("one", 1), check=True)
    pods = [dra_pod(f"dra-{i:02d}", template_name="one") if i % 2 else
            gpu_pod(f"dp-{i:02d}", limits="1") for i in range(40)]
    with ThreadPoolExecutor(40) as pool:
        results = list(pool.map(lambda p: create(core, ns, p), pods))
    admitted = [p["metadata"]["name"] for p, r in zip(pods, results, strict=True) if r is None]
    assert len(admitted) == 10, results
    assert all("would use 11 of its 10 GPUs" in r for r in results if r is not None)
    assert {p.metadata.name for p in core.list_namespaced_pod(ns).items} == set(admitted)


def test_a_template_and_its_pod_in_one_file_are_admitted_at_once(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    # How NVIDIA's DRA driver demos are written: one file, the template then the pod.
    # kubectl creates them milliseconds apart; a replica whose watch has not delivered
    # the template yet reads it from the API server instead of refusing the pod.
    ns = namespace("dra-pairs")  # 12 GPUs
    for i in range(10):
        out = apply(control_plane, ns, template(f"t-{i}", 1),
                    dra_pod(f"p-{i}", template_name=f"t-{i}"))
        assert out.returncode == 0, out.stderr
        assert f"pod/p-{i} created" in out.stdout, out.stdout
    # Each pod was charged its template's device: 10 of 12 in use.
    over = apply(control_plane, ns, gpu_pod("three", limits="3"), dry_run=True)
    assert_denied(over, "tenant dra-pairs would use 13 of its 12 GPUs")


def test_a_template_that_does_not_exist_is_said_not_to_exist(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("dra-pairs")
    out = apply(control_plane, ns, dra_pod("lost", template_name="no-such-template"))
    assert_denied(out, f"pod {ns}/lost: uses ResourceClaimTemplate no-such-template, which "
                  "does not exist in its namespace (the webhook asked the API server), so "
                  "the GPUs it asks for cannot be counted. Create the template first, or fix "
                  "its name in spec.resourceClaims. [rule unknown-claim, tenant dra-pairs]")
