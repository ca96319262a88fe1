"""A pod's charge follows the product it was bound to: a pod allowed A100s or H100s is
charged to no product at admission (it may land on either), and to the product of its
node once the scheduler binds it (``spec.nodeName``, the node's product label), in
whatever order the cache sees the pod, its node and its namespace."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from kit import policy_yaml

from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text
from webhook.quota.cache import ClusterState

POLICY = compile_policy(load_text(policy_yaml("either", """\
  products:
    aliases: {a100: NVIDIA-A100-SXM4-80GB, h100: NVIDIA-H100-80GB-HBM3}
  tenants:
    - name: either
      namespaceSelector:
        matchLabels: {team: either}
      allowedProducts: [a100, h100]
      quota: {gpus: 8}
"""), "either.yaml"))
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"


def pod(node: str | None) -> dict[str, Any]:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{
            "key": "nvidia.com/gpu.product", "operator": "In", "values": [A100, H100]}]}]}}}
    spec: dict[str, Any] = {"affinity": affinity, "containers": [{
        "name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"},
                                   "requests": {"nvidia.com/gpu": "2"}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": "p", "namespace": "ns-e", "uid": "u1"}, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}


def node(name: str, product: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}}}


NS = {"metadata": {"name": "ns-e", "labels": {"team": "either"}}}


def products(s: ClusterState) -> dict[str, float]:
    return {k: v for k, v in s.pods.tenant("either").products.items() if v}


def test_a_pod_allowed_two_products_is_charged_to_the_one_it_is_bound_to() -> None:
    s = ClusterState(lambda: POLICY)
    s.namespace_event("ADDED", NS)
    s.namespace_event("SYNCED", {})
    s.node_event("ADDED", node("h100-0", H100))
    s.pod_event("ADDED", pod(None))
    assert s.pods.tenant("either").gpus == 2 and products(s) == {}  # either, so neither
    s.pod_event("MODIFIED", pod("h100-0"))
    assert products(s) == {"h100": 2} and s.pods.tenant("either").gpus == 2


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_the_binding_is_charged_whatever_order_pod_node_and_namespace_arrive(
        order: tuple[int, ...]) -> None:
    s = ClusterState(lambda: POLICY)
    bound = pod("h100-0")
    # The pods relist (a resync online): the pod delivered again.
    s.on_relabel = lambda: s.pod_event("MODIFIED", bound)
    events = [lambda: s.namespace_event("ADDED", NS), lambda: s.namespace_event("SYNCED", {}),
              lambda: s.node_event("ADDED", node("h100-0", H100)),
              lambda: s.pod_event("ADDED", bound)]
    for i in order:
        events[i]()
    assert products(s) == {"h100": 2}


def test_a_node_relabelled_under_a_pod_moves_its_charge() -> None:
    s = ClusterState(lambda: POLICY)
    bound = pod("gpu-0")
    s.on_relabel = lambda: s.pod_event("MODIFIED", bound)
    s.namespace_event("ADDED", NS)
    s.namespace_event("SYNCED", {})
    s.node_event("ADDED", node("gpu-0", A100))
    s.pod_event("ADDED", bound)
    assert products(s) == {"a100": 2}
    s.node_event("MODIFIED", node("gpu-0", H100))
    assert products(s) == {"h100": 2}


def test_a_pod_deleted_before_its_node_is_seen_is_not_charged_when_it_is() -> None:
    s = ClusterState(lambda: POLICY)
    s.namespace_event("ADDED", NS)
    s.namespace_event("SYNCED", {})
    s.pod_event("ADDED", pod("h100-0"))
    s.pod_event("DELETED", pod("h100-0"))
    s.node_event("ADDED", node("h100-0", H100))
    assert s.pods.tenant("either").gpus == 0
