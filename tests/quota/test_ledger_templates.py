"""A pod whose ResourceClaimTemplate this replica has not seen yet.

Another replica admitted the pod, knowing the template, and reserved what it costs
(its devices through the template's claim). Here the pod's watch can deliver the pod
before the templates' watch delivers the template: the pod's charge is then missing
those devices. It must not count as seen (that would drop its reservation and count
too little); once the template arrives the pod is charged in full, with no further
event of the pod, and stays so after its reservation expires.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakeapi import running
from quotakit import LEDGER_NAMESPACE, NOW

from webhook.engine.charge import charge_of_pod
from webhook.k8s.claims import CLAIM, TEMPLATE
from webhook.libs.kube import ConfigMaps
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_file
from webhook.quota.cache import ClusterState
from webhook.quota.entries import LEDGER_PREFIX
from webhook.quota.ledger import LedgerStore

POLICY = compile_policy(load_file("policies/multi-tenant.yaml"))
TTL = 60.0
A100 = ("device.attributes['gpu.nvidia.com'].productName.replace(' ', '-') "
        "in ['NVIDIA-A100-SXM4-80GB']")
TEMPLATE_OBJ = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
    "metadata": {"name": "two-gpus", "namespace": "research", "uid": "t-1"},
    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": 2,
        "selectors": [{"cel": {"expression": A100}}]}}]}}},
}


def pod(plugin_gpus: int) -> dict[str, Any]:
    """A pod of tenant research using the template (and ``plugin_gpus`` device-plugin
    GPUs), pinned to A100s as the mutating webhook leaves it."""
    limits = {"nvidia.com/gpu": plugin_gpus} if plugin_gpus else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "research", "uid": "p-1"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "two-gpus"}],
            "containers": [{"name": "main", "image": "x", "resources": {
                "claims": [{"name": "gpu"}], "limits": limits, "requests": limits}}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{
                    "key": "nvidia.com/gpu.product", "operator": "In",
                    "values": ["NVIDIA-A100-SXM4-80GB"]}]}]}}},
        },
    }


def knows_template(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    return TEMPLATE_OBJ if (kind, namespace, name) == (TEMPLATE, "research", "two-gpus") \
        else None


@pytest.mark.parametrize("plugin_gpus", [0, 1], ids=["GPUs only through the template",
                                                     "a device-plugin GPU too"])
def test_a_pod_seen_before_its_template_is_counted_in_full(plugin_gpus: int) -> None:
    obj = pod(plugin_gpus)
    full = charge_of_pod(obj, POLICY, None, knows_template)
    assert full is not None and full.gpus == 2 + plugin_gpus
    clock = [NOW]
    with running() as api:
        maps = ConfigMaps(api.api_client(), LEDGER_NAMESPACE, timeout=2.0)
        # Replica A admitted the pod and reserved all it costs.
        a = ClusterState(lambda: POLICY)
        a.pod_event("SYNCED", {})
        a.namespace_event("SYNCED", {})
        admitting = LedgerStore(a, maps, ttl=TTL, wall=lambda: clock[0])
        assert asyncio.run(admitting.reserve("p-1", full, lambda _: True, 5.0,
                                             name="research/trainer"))

        # Replica B: its watches have listed; the pod arrives, the template not yet.
        b = ClusterState(lambda: POLICY)
        b.watch_claims()
        b.pod_event("SYNCED", {})
        b.namespace_event("SYNCED", {})
        for kind in (CLAIM, TEMPLATE):
            b.claim_event(kind)("SYNCED", {})
        store = LedgerStore(b, maps, ttl=TTL, wall=lambda: clock[0])

        def counted() -> float:
            ledger = {"research": maps.read(LEDGER_PREFIX + "research")}
            return store.reserved(ledger).tenant("research").gpus + \
                b.pods.tenant("research").gpus

        b.pod_event("ADDED", obj)
        assert not b.seen("p-1")  # its cost is not known in full: its reservation counts
        assert counted() >= full.gpus

        b.claim_event(TEMPLATE)("ADDED", TEMPLATE_OBJ)
        assert b.seen("p-1")
        assert b.pods.tenant("research").gpus == full.gpus  # charged in full, no pod event
        assert counted() == full.gpus  # and its reservation no longer counts besides

        clock[0] += 2 * TTL  # the reservation expired: the pod itself holds the GPUs
        assert counted() == full.gpus


def test_a_pod_deleted_while_its_template_is_unknown_is_forgotten() -> None:
    b = ClusterState(lambda: POLICY)
    b.watch_claims()
    b.pod_event("SYNCED", {})
    b.namespace_event("SYNCED", {})
    b.pod_event("ADDED", pod(1))
    b.pod_event("DELETED", pod(1))
    assert b.seen("p-1")  # ended: a reservation for it must not count again
    b.claim_event(TEMPLATE)("ADDED", TEMPLATE_OBJ)
    assert b.pods.tenant("research").gpus == 0  # not brought back by its template
