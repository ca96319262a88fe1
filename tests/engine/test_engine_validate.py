"""The validating webhook on the final object: per-container and per-pod maximums counted
as Kubernetes counts a pod (init containers, sidecars), pinning to allowed products and
racks when the mutating webhook was bypassed, and never a patch.

``admitted`` runs both webhooks in API-server order; ``validated`` runs the validating
one alone on an object as if the mutating webhook had not run.
"""

from __future__ import annotations

from typing import Any

import pytest
from enginekit import (
    A100,
    GPU,
    H100,
    PRODUCT_LABEL,
    RACK_LABEL,
    admitted,
    container,
    expr,
    gpus,
    gpus_charged,
    pod,
    required_affinity,
    validated,
)

from webhook.policy.model import Rule

SHARED = "nvidia.com/gpu.shared"
ON_RACK_A = {PRODUCT_LABEL: A100, RACK_LABEL: "rack-a"}


def sidecar(name: str, n: int) -> dict[str, Any]:
    return container(name, limits=gpus(n), restartPolicy="Always")


def init(name: str, n: int) -> dict[str, Any]:
    return container(name, limits=gpus(n))


@pytest.mark.parametrize(
    ("init_containers", "app", "effective", "allowed"),
    [
        pytest.param([init("warmup", 8)], [4], 8, True,
                     id="init 8 then app 4: the init container's 8 count"),
        pytest.param([sidecar("proxy", 2)], [4, 3], 9, False,
                     id="app 4 + 3 with a 2-GPU sidecar: 9 > 8"),
        pytest.param([sidecar("proxy", 2), init("warmup", 7)], [1], 9, False,
                     id="sidecar started before a 7-GPU init: 9 at once"),
        pytest.param([init("warmup", 7), sidecar("proxy", 2)], [1], 7, True,
                     id="sidecar started after the init: 7 at most"),
        pytest.param([init("a", 3), init("b", 5)], [2], 5, True,
                     id="plain init containers run one at a time"),
    ],
)
def test_per_pod_maximum_uses_the_effective_request(init_containers: list[dict[str, Any]],
                                                    app: list[int], effective: float,
                                                    allowed: bool) -> None:
    p = pod(*(container(f"app-{i}", limits=gpus(n)) for i, n in enumerate(app)),
            init=init_containers)
    m, v = admitted(p)
    assert m.decision.allowed, m.decision.message
    # The missing requests were completed in init containers and sidecars too.
    for c in m.patched["spec"]["initContainers"]:
        assert c["resources"]["requests"] == c["resources"]["limits"]
    assert gpus_charged(m.patched) == effective
    assert v.allowed is allowed
    if not allowed:
        assert [f.rule for f in v.findings] == [Rule.MAX_PER_POD]
        assert f"asks for {effective} GPUs in all" in v.message
        assert "allows at most 8 GPUs per pod" in v.message


@pytest.mark.parametrize(
    ("namespace", "containers", "rules", "snippet"),
    [
        pytest.param("research", [container(limits=gpus(9))],
                     [Rule.MAX_PER_CONTAINER],  # one fault, one message (test_engine_maximums)
                     'container "main": asks for 9 GPUs; tenant research allows at most 8 GPUs per '
                     "container", id="one container over both caps"),
        pytest.param("research", [container("a", limits=gpus(5)),
                                  container("b", limits=gpus(5))],
                     [Rule.MAX_PER_POD], "asks for 10 GPUs in all", id="two containers over"),
        pytest.param("serving", [container(limits=gpus(8, SHARED))], [],
                     None, id="8 shared slices weigh 2 GPUs: within 2 per container"),
        pytest.param("serving", [container(limits=gpus(12, SHARED))],
                     [Rule.MAX_PER_CONTAINER], "asks for 12 nvidia.com/gpu.shared (12 x 0.25 = "
                     "3 GPUs); tenant inference allows at most 2 GPUs per container",
                     id="12 shared slices weigh 3 GPUs, named as asked"),
    ],
)
def test_maximums(namespace: str, containers: list[dict[str, Any]], rules: list[Rule],
                  snippet: str | None) -> None:
    m, v = admitted(pod(*containers, namespace=namespace))
    assert m.decision.allowed  # the caps belong to the validating webhook
    assert [f.rule for f in v.findings] == rules
    assert v.allowed is (not rules)
    if snippet is not None:
        assert snippet in v.message


@pytest.mark.parametrize(
    ("spec", "rules"),
    [
        pytest.param({}, [Rule.ALLOWED_PRODUCTS, Rule.TOPOLOGY],
                     id="not pinned at all (mutating webhook bypassed)"),
        pytest.param({"nodeSelector": ON_RACK_A}, [], id="pinned by nodeSelector"),
        pytest.param({"affinity": required_affinity(
            [expr(PRODUCT_LABEL, A100), expr(RACK_LABEL, "rack-a", "rack-b")])}, [],
            id="pinned by node affinity"),
        pytest.param({"affinity": required_affinity(
            [expr(PRODUCT_LABEL, A100), expr(RACK_LABEL, "rack-a")],
            [expr(RACK_LABEL, "rack-b")])}, [Rule.ALLOWED_PRODUCTS],
            id="one term leaves the product open"),
        pytest.param({"nodeSelector": {PRODUCT_LABEL: "NVIDIA-L4", RACK_LABEL: "rack-a"}},
                     [Rule.ALLOWED_PRODUCTS], id="pinned to a product the tenant may not use"),
        pytest.param({"nodeSelector": {PRODUCT_LABEL: A100, RACK_LABEL: "rack-z"}},
                     [Rule.TOPOLOGY], id="pinned to a rack outside the tenant's"),
        # research counts quota per product: a pod free to land on a100 or h100 would be
        # charged to neither product's cap.
        pytest.param({"affinity": required_affinity(
            [expr(PRODUCT_LABEL, A100, H100), expr(RACK_LABEL, "rack-a")])},
            [Rule.ALLOWED_PRODUCTS], id="two allowed products, per-product quota"),
        pytest.param({"affinity": required_affinity(
            [expr(PRODUCT_LABEL, H100), expr(RACK_LABEL, "rack-a")],
            [expr(PRODUCT_LABEL, A100), expr(RACK_LABEL, "rack-b")])},
            [Rule.ALLOWED_PRODUCTS], id="one product per term, two in all, per-product quota"),
    ],
)
def test_gpu_pod_must_be_pinned_to_allowed_products_and_racks(spec: dict[str, Any],
                                                              rules: list[Rule]) -> None:
    v = validated(pod(**spec))
    assert [f.rule for f in v.findings] == rules
    assert v.allowed is (not rules)


def test_a_pod_of_a_per_product_quota_tenant_must_be_pinned_to_one_product() -> None:
    free = pod(affinity=required_affinity([expr(PRODUCT_LABEL, A100, H100),
                                           expr(RACK_LABEL, "rack-a")]))
    v = validated(free)
    assert v.message == (
        "pod research/trainer: may be scheduled on nvidia.com/gpu.product in "
        f"[{A100}, {H100}], but tenant research's quota counts GPUs per product "
        "([a100, h100]), so each of its GPU pods must be pinned to exactly one. Keep one "
        "value of nvidia.com/gpu.product in the pod's node affinity, or set a nodeSelector "
        "on it (the mutating webhook pins the tenant's default when it runs). "
        "[rule allowed-products, tenant research]")
    # Through both webhooks, as the API server runs them, the same pod is admitted: the
    # mutating webhook narrows it to the default product.
    m, v = admitted(free)
    assert v.allowed, v.message
    assert "gpu-node-affinity" in m.decision.mutations


def test_unpinned_message_says_what_to_add() -> None:
    v = validated(pod())
    assert v.message.splitlines() == [
        "pod research/trainer: may be scheduled on any nvidia.com/gpu.product, but tenant "
        "research's GPU pods must be pinned to [NVIDIA-A100-SXM4-80GB, "
        "NVIDIA-H100-80GB-HBM3]. Add a required node affinity "
        "(the mutating webhook does this when it runs) or a nodeSelector with an allowed "
        "value. [rule allowed-products, tenant research]",
        "pod research/trainer: may be scheduled on any topology.example.com/gpu-rack, but "
        "tenant research's GPU pods must be pinned to [rack-a, rack-b]. Add a required node "
        "affinity (the mutating webhook does this when it runs) or a nodeSelector with an "
        "allowed value. [rule topology, tenant research]",
    ]


@pytest.mark.parametrize(
    ("resources", "rule"),
    [
        pytest.param({"requests": gpus(1), "limits": gpus(2)}, Rule.REQUESTS_MATCH_LIMITS,
                     id="request differs from limit"),
        pytest.param({"limits": gpus("500m")}, Rule.GPU_QUANTITY, id="fractional GPU"),
        pytest.param({"limits": gpus(1, SHARED)}, Rule.ALLOWED_RESOURCES,
                     id="resource the tenant may not use"),
    ],
)
def test_rules_of_the_mutating_phase_are_enforced_when_it_was_bypassed(
        resources: dict[str, Any], rule: Rule) -> None:
    p = pod(container(**resources), nodeSelector=ON_RACK_A)
    v = validated(p)
    assert not v.allowed
    assert [f.rule for f in v.findings] == [rule]


def test_pinned_pod_within_every_cap_is_admitted_and_counted() -> None:
    p = pod(container(requests=gpus(4), limits=gpus(4)), nodeSelector=ON_RACK_A)
    v = validated(p)
    assert v.allowed and v.findings == [] and v.warnings == []
    assert v.tenant == "research" and gpus_charged(p) == 4


def test_validate_counts_gpus_in_weighted_equivalents() -> None:
    p = pod(container(limits={GPU: 1, SHARED: 2}), namespace="serving",
            nodeSelector={PRODUCT_LABEL: "NVIDIA-L4"})
    v = validated(p)
    assert v.allowed, v.message
    assert gpus_charged(p) == 1.5
