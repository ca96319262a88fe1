"""GPUs through Dynamic Resource Allocation on the simulated GPU cluster: the real
resourceclaim controller makes a pod's claim from its template, the real scheduler
allocates it from the DRA nodes' ResourceSlices, and the webhook confines the devices to
the tenant's product, keeps the pod's GPU toleration and charges its GPUs once.

The dra-a100 and dra-h100 nodes publish their GPUs through ResourceSlices only
(tests/e2e/gpucluster/gpu-cluster.yaml); their devices' productName is NVML's, with
spaces, which the webhook's selector reads as the node label's dashes.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2ekit import GPU_TOLERATION, short_id, to_yaml, wait_until
from gpucluster.fixtures import SimNamespaceFactory, pod
from gpucluster.sim import SimCluster
from kubernetes import client as k8s

pytestmark = pytest.mark.e2e


def template(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": count}}]}}}}


def dra_pod(name: str, template_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"tolerations": [GPU_TOLERATION],
                     "resourceClaims": [{"name": "gpu",
                                         "resourceClaimTemplateName": template_name}],
                     "containers": [{"name": "train", "image": "registry.local/train:1",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def apply_now(sim: SimCluster, ns: str, obj: dict[str, Any]) -> str:
    """kubectl apply, once: a template created a moment ago is read from the API server
    when the webhook's watch has not delivered it yet (webhook.admission.claimreads)."""
    out = sim.cp.kubectl("apply", "-n", ns, "-f", "-", input=to_yaml(obj), check=False)
    return out.stdout + out.stderr


def test_a_dra_pod_is_allocated_a_gpu_of_its_tenants_product_and_charged_once(
    sim: SimCluster, core: k8s.CoreV1Api, sim_namespace: SimNamespaceFactory,
) -> None:
    ns = sim_namespace("dra")  # 8 GPUs; claims confined to the default product, A100
    name = f"two-{short_id()}"
    out = sim.cp.kubectl("apply", "-n", ns, "-f", "-", input=to_yaml(template(name, 2)),
                         check=False)
    assert out.returncode == 0, out.stderr
    out_text = apply_now(sim, ns, dra_pod("trainer", name))
    assert "created" in out_text, out_text

    def running() -> bool:
        return core.read_namespaced_pod("trainer", ns).status.phase == "Running"

    wait_until("the DRA pod to run", running, timeout=90)
    p = core.read_namespaced_pod("trainer", ns)
    # On the A100 DRA node (an H100 one had free devices too), with its toleration kept.
    assert p.spec.node_name == "dra-a100-0"
    assert any(t.key == "nvidia.com/gpu" for t in p.spec.tolerations or [])
    claim_name = p.status.resource_claim_statuses[0].resource_claim_name
    results = sim.cp.kubectl("get", "resourceclaim", claim_name, "-n", ns, "-o",
                             "jsonpath={.status.allocation.devices.results}").stdout
    assert results.count('"driver":"gpu.nvidia.com"') == 2
    assert '"pool":"dra-a100-0"' in results

    # Charged once: the pod's 2 GPUs, not again for the claim the controller made.
    # 6 are free: a 6-GPU pod fits (dry run), a 7-GPU one does not.
    fits = sim.cp.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-",
                          input=to_yaml(pod("probe-6", 6)), check=False)
    assert fits.returncode == 0, fits.stderr
    over = sim.cp.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-",
                          input=to_yaml(pod("probe-7", 7)), check=False)
    assert over.returncode != 0 and "tenant dra would use 9 of its 8 GPUs" in over.stderr

    # At the cap, a DRA pod is refused at kubectl apply with the numbers.
    big = f"six-{short_id()}"
    sim.cp.kubectl("apply", "-n", ns, "-f", "-", input=to_yaml(template(big, 6)))
    assert "created" in apply_now(sim, ns, dra_pod("filler", big))
    refused = apply_now(sim, ns, dra_pod("one-too-many", name))
    assert "tenant dra would use 10 of its 8 GPUs" in refused, refused
