"""Where a GPU pod may run: tolerations for the GPU taint, node affinity to the tenant's
products and racks, and the pod's own choices (nodeSelector, affinity, product label or
annotation) kept when the tenant allows them and refused when it does not.

The example policy's ``research`` tenant allows a100 and h100 (default a100) on racks
rack-a and rack-b; every case runs through ``mutate_checked``.
"""

from __future__ import annotations

from typing import Any

import pytest
from enginekit import (
    A100,
    GPU,
    GPU_TOLERATION,
    H100,
    L4,
    PRODUCT_LABEL,
    RACK_LABEL,
    REQUIRED,
    admitted,
    container,
    example_policy,
    example_variant,
    expr,
    gpus,
    mutate_checked,
    namespace_labels,
    node_terms,
    pod,
    required_affinity,
    review,
    validated,
)
from kit import validating

from webhook.admission.webhooks import mutating as mutate
from webhook.engine.charge import charge_of_pod
from webhook.engine.placement import Placement
from webhook.k8s.patch import Patch
from webhook.policy.model import Rule

PRODUCT_REQUEST = "gpu.example.com/product"
ZONE = "topology.kubernetes.io/zone"
PINNED = [expr(PRODUCT_LABEL, A100), expr(RACK_LABEL, "rack-a", "rack-b")]


# --- tolerations ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        pytest.param(None, [GPU_TOLERATION], id="none: the GPU toleration is added"),
        pytest.param([{"operator": "Exists"}], [{"operator": "Exists"}],
                     id="key-less Exists tolerates every taint: nothing added"),
        pytest.param([GPU_TOLERATION], [GPU_TOLERATION], id="already there: not duplicated"),
        pytest.param([{"key": GPU, "operator": "Exists"}], [{"key": GPU, "operator": "Exists"}],
                     id="GPU key with every effect: nothing added"),
        pytest.param(
            [{"key": GPU, "operator": "Exists", "effect": "NoExecute"}],
            [{"key": GPU, "operator": "Exists", "effect": "NoExecute"}, GPU_TOLERATION],
            id="GPU key for another effect: NoSchedule still added"),
        pytest.param(
            [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
             GPU_TOLERATION],
            id="other tolerations are kept, the GPU one appended"),
    ],
)
def test_gpu_toleration_is_added_once(existing: list[dict[str, Any]] | None,
                                      expected: list[dict[str, Any]]) -> None:
    m = mutate_checked(pod(tolerations=existing) if existing is not None else pod())
    assert m.decision.allowed, m.decision.message
    assert m.patched["spec"]["tolerations"] == expected
    assert ("gpu-tolerations" in m.decision.mutations) is (len(expected) > len(existing or []))


# --- node affinity --------------------------------------------------------------------


def test_pod_without_affinity_is_pinned_to_default_product_and_tenant_racks() -> None:
    m = mutate_checked(pod())
    assert m.decision.allowed
    assert node_terms(m.patched) == [{"matchExpressions": PINNED}]
    assert "gpu-node-affinity" in m.decision.mutations
    # The pinned pod is what the validating webhook expects to see.
    assert validated(m.patched).allowed


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        pytest.param(
            [[expr(ZONE, "us-east-1a")], [expr(ZONE, "us-east-1b"), expr("disk", "nvme")]],
            [[expr(ZONE, "us-east-1a"), *PINNED],
             [expr(ZONE, "us-east-1b"), expr("disk", "nvme"), *PINNED]],
            id="two terms: the requirement is ANDed into each, no third term"),
        pytest.param(
            [[expr(PRODUCT_LABEL, H100)], [expr(PRODUCT_LABEL, H100), expr(ZONE, "b")]],
            [[expr(PRODUCT_LABEL, H100), expr(RACK_LABEL, "rack-a", "rack-b")],
             [expr(PRODUCT_LABEL, H100), expr(ZONE, "b"), expr(RACK_LABEL, "rack-a", "rack-b")]],
            id="pod's own allowed product is kept in every term"),
        pytest.param(
            [[expr(PRODUCT_LABEL, A100, H100)]],
            [[expr(PRODUCT_LABEL, A100, H100), *PINNED]],
            id="pod allows both products: narrowed to the default"),
        pytest.param(
            [[expr(RACK_LABEL, "rack-b")]],
            [[expr(RACK_LABEL, "rack-b"), expr(PRODUCT_LABEL, A100)]],
            id="pod's own rack inside the tenant's racks is kept"),
    ],
)
def test_existing_required_affinity_is_narrowed_term_by_term(
        terms: list[list[dict[str, Any]]], expected: list[list[dict[str, Any]]]) -> None:
    m = mutate_checked(pod(affinity=required_affinity(*terms)))
    assert m.decision.allowed, m.decision.message
    assert node_terms(m.patched) == [{"matchExpressions": e} for e in expected]
    assert validated(m.patched).allowed


# The research tenant without its per-product quota: a pod there need not be pinned to
# one product, so a term that already names an allowed product is left as it is.
NO_PRODUCT_QUOTA = example_variant(("        products: {a100: 24, h100: 8}\n", ""))
RACKS = expr(RACK_LABEL, "rack-a", "rack-b")


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        pytest.param(
            [[expr(PRODUCT_LABEL, H100)], [expr(ZONE, "a")]],
            [[expr(PRODUCT_LABEL, H100), RACKS], [expr(ZONE, "a"), *PINNED]],
            id="one term names an allowed product: kept; the open term gets the default"),
        pytest.param(
            [[expr(PRODUCT_LABEL, H100)], [expr(PRODUCT_LABEL, A100)]],
            [[expr(PRODUCT_LABEL, H100), RACKS], [expr(PRODUCT_LABEL, A100), RACKS]],
            id="each term names an allowed product: each kept"),
        pytest.param(
            [[expr(PRODUCT_LABEL, H100), expr(ZONE, "a")], [expr(ZONE, "b")],
             [expr(PRODUCT_LABEL, A100, H100)]],
            [[expr(PRODUCT_LABEL, H100), expr(ZONE, "a"), RACKS], [expr(ZONE, "b"), *PINNED],
             [expr(PRODUCT_LABEL, A100, H100), *PINNED]],
            id="three terms: named kept, open gets the default, both-allowed narrowed"),
        pytest.param(
            [[expr(PRODUCT_LABEL, A100, H100)], [expr(ZONE, "a")]],
            [[expr(PRODUCT_LABEL, A100, H100), *PINNED], [expr(ZONE, "a"), *PINNED]],
            id="a term offering the default among several is narrowed to it, as one alone is"),
        pytest.param(
            [[expr(PRODUCT_LABEL, L4)], [expr(ZONE, "a")]],
            [[expr(PRODUCT_LABEL, L4), *PINNED], [expr(ZONE, "a"), *PINNED]],
            id="a term naming a product the tenant may not use still gets the default"),
        pytest.param(
            [[expr(PRODUCT_LABEL, H100, L4)], [expr(ZONE, "a")]],
            [[expr(PRODUCT_LABEL, H100, L4), expr(PRODUCT_LABEL, H100), RACKS],
             [expr(ZONE, "a"), *PINNED]],
            id="a term naming an allowed and a disallowed product is narrowed to its own"),
        pytest.param(
            [[expr(PRODUCT_LABEL, "h100")], [expr(ZONE, "a")]],
            [[expr(PRODUCT_LABEL, "h100"), *PINNED], [expr(ZONE, "a"), *PINNED]],
            id="a short name in a term matches no node: the term still gets the default"),
        pytest.param(
            [[expr(PRODUCT_LABEL, H100)], [expr(ZONE, "a"), expr(PRODUCT_LABEL, A100, op="NotIn")]],
            [[expr(PRODUCT_LABEL, H100), RACKS],
             [expr(ZONE, "a"), expr(PRODUCT_LABEL, A100, op="NotIn"),
              expr(PRODUCT_LABEL, A100, H100), RACKS]],
            id="the default ruled out in the open term: widened there, the named term kept"),
        pytest.param(
            [[expr(RACK_LABEL, "rack-b")], [expr(ZONE, "a")]],
            [[expr(RACK_LABEL, "rack-b"), expr(PRODUCT_LABEL, A100)],
             [expr(ZONE, "a"), *PINNED]],
            id="topology: a term on one of the tenant's racks is kept, the open one pinned"),
        pytest.param(
            [[expr(RACK_LABEL, "rack-z")], [expr(ZONE, "a")]],
            [[expr(RACK_LABEL, "rack-z"), *PINNED], [expr(ZONE, "a"), *PINNED]],
            id="topology: a term on a rack outside the tenant's still gets the tenant's"),
    ],
)
def test_terms_that_already_comply_are_left_as_they_are(
        terms: list[list[dict[str, Any]]], expected: list[list[dict[str, Any]]]) -> None:
    """Kubernetes ORs the terms: ANDing the default product into a term that names
    another allowed product would make that term match no node and quietly take the
    pod's choice away. ``admitted`` runs mutate (checking idempotence) then validate."""
    m, v = admitted(pod(affinity=required_affinity(*terms)), NO_PRODUCT_QUOTA)
    assert m.decision.allowed, m.decision.message
    assert m.decision.findings == []
    assert node_terms(m.patched) == [{"matchExpressions": e} for e in expected]
    assert v.allowed, v.message
    assert v.findings == []


@pytest.mark.parametrize(
    "terms",
    [
        pytest.param([[expr(PRODUCT_LABEL, H100)], [expr(ZONE, "a")]], id="named and open"),
        pytest.param([[expr(PRODUCT_LABEL, H100)], [expr(PRODUCT_LABEL, A100)]],
                     id="each names one"),
    ],
)
def test_a_tenant_with_per_product_quota_still_pins_each_pod_to_one_product(
        terms: list[list[dict[str, Any]]]) -> None:
    """Per-product quota charges a pod to the one product it can land on; a pod left
    able to land on two would be charged to neither. So there the default is ANDed into
    every term as before, even where that leaves a term no node."""
    m, v = admitted(pod(affinity=required_affinity(*terms)))
    assert m.decision.allowed, m.decision.message
    assert [t["matchExpressions"][-2:] for t in node_terms(m.patched)] == [PINNED] * len(terms)
    assert v.allowed, v.message
    charge = charge_of_pod(m.patched, example_policy())
    assert charge is not None and charge.product == "a100"


def test_a_pod_left_on_two_products_is_charged_to_no_product_cap() -> None:
    """Without per-product quota a pod may keep two products; quota then counts it
    against the tenant's GPUs (and resources, pods) and no product's cap."""
    m, v = admitted(pod(affinity=required_affinity([expr(PRODUCT_LABEL, H100)],
                                                   [expr(ZONE, "a")])), NO_PRODUCT_QUOTA)
    assert m.decision.allowed and v.allowed, (m.decision.message, v.message)
    charge = charge_of_pod(m.patched, NO_PRODUCT_QUOTA)
    assert charge is not None
    assert charge.product is None
    assert charge.gpus == 1.0


@pytest.mark.parametrize(
    ("selector", "terms", "expected"),
    [
        pytest.param({PRODUCT_LABEL: H100}, [[expr(ZONE, "a")], [expr(ZONE, "b")]],
                     [[expr(ZONE, "a"), RACKS], [expr(ZONE, "b"), RACKS]],
                     id="nodeSelector on an allowed product: no product affinity"),
        pytest.param({RACK_LABEL: "rack-b"}, [[expr(PRODUCT_LABEL, H100)], [expr(ZONE, "a")]],
                     [[expr(PRODUCT_LABEL, H100)], [expr(ZONE, "a"), expr(PRODUCT_LABEL, A100)]],
                     id="nodeSelector on a rack: no rack affinity, terms as above"),
    ],
)
def test_node_selector_with_several_terms(selector: dict[str, str],
                                          terms: list[list[dict[str, Any]]],
                                          expected: list[list[dict[str, Any]]]) -> None:
    m, v = admitted(pod(nodeSelector=selector, affinity=required_affinity(*terms)),
                    NO_PRODUCT_QUOTA)
    assert m.decision.allowed, m.decision.message
    assert m.patched["spec"]["nodeSelector"] == selector
    assert node_terms(m.patched) == [{"matchExpressions": e} for e in expected]
    assert v.allowed, v.message


@pytest.mark.parametrize(
    ("selector", "allowed", "rule", "expected_terms", "message"),
    [
        pytest.param({PRODUCT_LABEL: H100}, True, None,
                     [{"matchExpressions": [expr(RACK_LABEL, "rack-a", "rack-b")]}], None,
                     id="allowed product: no product affinity added"),
        pytest.param({PRODUCT_LABEL: "NVIDIA-L4"}, False, Rule.ALLOWED_PRODUCTS, [],
                     'asks for GPU product "l4" (nodeSelector nvidia.com/gpu.product), which '
                     "tenant research may not use. Ask for one of: a100, h100.",
                     id="product the tenant may not use: denied"),
        pytest.param({PRODUCT_LABEL: "h100"}, False, Rule.ALLOWED_PRODUCTS, [],
                     'has nodeSelector nvidia.com/gpu.product: "h100", the short name of a '
                     'product; nodes carry the full value, so no node matches it. Set it to '
                     '"NVIDIA-H100-80GB-HBM3".',
                     id="short product name: would never schedule, denied"),
        pytest.param({RACK_LABEL: "rack-a"}, True, None,
                     [{"matchExpressions": [expr(PRODUCT_LABEL, A100)]}], None,
                     id="allowed rack: no rack affinity added"),
        pytest.param({RACK_LABEL: "rack-z"}, False, Rule.TOPOLOGY, [],
                     "its nodeSelector allows only topology.example.com/gpu-rack in [rack-z], "
                     "but tenant research's GPU pods may run only on "
                     "topology.example.com/gpu-rack in [rack-a, rack-b].",
                     id="rack outside the tenant's: denied"),
    ],
)
def test_existing_node_selector(selector: dict[str, str], allowed: bool, rule: Rule | None,
                                expected_terms: list[dict[str, Any]],
                                message: str | None) -> None:
    m = mutate_checked(pod(nodeSelector=selector))
    d = m.decision
    assert d.allowed is allowed, d.message
    assert m.patched["spec"]["nodeSelector"] == selector
    assert node_terms(m.patched) == expected_terms
    if rule is not None:
        assert [f.rule for f in d.findings] == [rule]
        assert message is not None and message in d.message


def test_affinity_to_a_product_the_tenant_may_not_use_is_denied() -> None:
    m = mutate_checked(pod(affinity=required_affinity([expr(PRODUCT_LABEL, "NVIDIA-L4")])))
    assert not m.decision.allowed
    assert [f.rule for f in m.decision.findings] == [Rule.ALLOWED_PRODUCTS]
    assert "its node affinity allows only nvidia.com/gpu.product in [NVIDIA-L4]" in \
        m.decision.message


@pytest.mark.parametrize(
    ("labels", "annotations", "pinned_to", "message"),
    [
        pytest.param({PRODUCT_REQUEST: "h100"}, None, H100, None, id="label, short name"),
        pytest.param(None, {PRODUCT_REQUEST: H100}, H100, None,
                     id="annotation, node label value"),
        pytest.param({PRODUCT_REQUEST: "a100"}, {PRODUCT_REQUEST: A100}, A100, None,
                     id="label and annotation agree"),
        pytest.param({PRODUCT_REQUEST: "l4"}, None, None,
                     'asks for GPU product "l4" (label gpu.example.com/product), which tenant '
                     "research may not use. Ask for one of: a100, h100.",
                     id="product the tenant may not use"),
        pytest.param(None, {PRODUCT_REQUEST: "v100"}, None,
                     'asks for GPU product "v100" (annotation gpu.example.com/product), which '
                     "is not a product this cluster defines. Ask for one of: a100, h100.",
                     id="unknown product"),
        pytest.param({PRODUCT_REQUEST: "h100"}, {PRODUCT_REQUEST: "a100"}, None,
                     "asks for several GPU products at once (h100, a100).",
                     id="label and annotation disagree"),
    ],
)
def test_pod_asks_for_a_product(labels: dict[str, str] | None,
                                annotations: dict[str, str] | None, pinned_to: str | None,
                                message: str | None) -> None:
    m = mutate_checked(pod(labels=labels, annotations=annotations))
    d = m.decision
    if pinned_to is not None:
        assert d.allowed, d.message
        assert node_terms(m.patched) == [{"matchExpressions": [
            expr(PRODUCT_LABEL, pinned_to), expr(RACK_LABEL, "rack-a", "rack-b")]}]
    else:
        assert not d.allowed
        assert [f.rule for f in d.findings] == [Rule.ALLOWED_PRODUCTS]
        assert message is not None and message in d.message


@pytest.mark.parametrize(
    "terms",
    [
        pytest.param([[expr(PRODUCT_LABEL, A100)]], id="its only term is on another product"),
        pytest.param([[expr(PRODUCT_LABEL, H100, op="NotIn")]], id="its only term rules it out"),
        pytest.param([[expr(PRODUCT_LABEL, A100)], [expr(PRODUCT_LABEL, H100, op="NotIn")]],
                     id="every term rules it out its own way"),
    ],
)
def test_a_product_asked_for_but_ruled_out_by_the_pods_affinity_is_denied(
        terms: list[list[dict[str, Any]]]) -> None:
    # Widening to the tenant's other products would run the pod on one it did not ask for.
    m = mutate_checked(pod(labels={PRODUCT_REQUEST: "h100"},
                           affinity=required_affinity(*terms)))
    assert not m.decision.allowed
    assert [f.rule for f in m.decision.findings] == [Rule.ALLOWED_PRODUCTS]
    assert m.decision.message == (
        "pod research/trainer: asks for GPU product h100, but its required node affinity "
        f"leaves no term that admits {PRODUCT_LABEL}={H100}: it could never run on h100. "
        "Change the node affinity to allow it, or drop the product request. "
        "[rule allowed-products, tenant research]")


def test_pinning_keeps_the_users_own_affinity_and_tolerations_intact() -> None:
    """A realistic pod with preferred affinity, pod anti-affinity and extra tolerations:
    only the required node affinity and the GPU toleration are added."""
    preferred = [{"weight": 10, "preference": {"matchExpressions": [expr("disk", "nvme")]}}]
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "trainer"}},
         "topologyKey": "kubernetes.io/hostname"}]}
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred},
                "podAntiAffinity": anti}
    m = mutate_checked(pod(container(requests=gpus(2), limits=gpus(2)), affinity=affinity))
    assert m.decision.allowed
    aff = m.patched["spec"]["affinity"]
    assert aff["podAntiAffinity"] == anti
    assert aff["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert node_terms(m.patched) == [{"matchExpressions": PINNED}]


# --- the parsed node affinity -----------------------------------------------------------


# A policy whose research tenant's topology label is the product label itself: the
# topology pin must see the product expression the product pin has just appended.
SAME_KEY = example_variant(
    ("nodeLabel: topology.example.com/gpu-rack", f"nodeLabel: {PRODUCT_LABEL}"),
    ("values: [rack-a, rack-b]", f"values: [{A100}, {H100}]"))


@pytest.mark.parametrize(
    ("affinity", "expected"),
    [
        pytest.param(None, [[expr(PRODUCT_LABEL, A100)]],
                     id="no affinity: the term the product pin creates satisfies both"),
        pytest.param(required_affinity([expr(ZONE, "a")], [expr(ZONE, "b")]),
                     [[expr(ZONE, "a"), expr(PRODUCT_LABEL, A100)],
                      [expr(ZONE, "b"), expr(PRODUCT_LABEL, A100)]],
                     id="two terms: the product pin appended to each satisfies both"),
    ],
)
def test_topology_pin_on_the_product_label_sees_the_product_pin(
        affinity: dict[str, Any] | None, expected: list[list[dict[str, Any]]]) -> None:
    m = mutate_checked(pod(affinity=affinity) if affinity else pod(), SAME_KEY)
    assert m.decision.allowed, m.decision.message
    assert node_terms(m.patched) == [{"matchExpressions": e} for e in expected]


@pytest.mark.parametrize(
    "terms",
    [
        pytest.param([], id="no terms"),
        pytest.param([{"matchExpressions": [expr(ZONE, "a")]}, {}], id="term without list"),
        pytest.param([{"matchExpressions": [expr(PRODUCT_LABEL, A100, H100),
                                            expr(RACK_LABEL, "rack-c", op="NotIn")]},
                      {"matchExpressions": [expr(RACK_LABEL, op="DoesNotExist")]}],
                     id="In, NotIn and DoesNotExist"),
    ],
)
def test_placement_stays_in_step_with_the_spec_it_pins(terms: list[dict[str, Any]]) -> None:
    """After pins, a Placement answers as one freshly read from the patched spec."""
    spec: dict[str, Any] = {"affinity": {"nodeAffinity": {REQUIRED: {
        "nodeSelectorTerms": terms}}}}
    placement, patch = Placement(spec, "/spec"), Patch()
    placement.pin(PRODUCT_LABEL, [A100], patch)
    placement.pin(RACK_LABEL, ["rack-a", "rack-b"], patch)
    placement.pin(PRODUCT_LABEL, [A100, H100], patch)
    fresh = Placement(spec, "/spec")
    for key in (PRODUCT_LABEL, RACK_LABEL, ZONE):
        assert placement.restriction(key) == fresh.restriction(key)
        assert placement.excluded(key) == fresh.excluded(key)
        for values in ([A100], ["rack-a"], ["rack-c"]):
            assert placement.survives(key, values) == fresh.survives(key, values)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"affinity": required_affinity([expr(PRODUCT_LABEL, H100)],
                                                    [expr(PRODUCT_LABEL, A100, H100)],
                                                    [expr(PRODUCT_LABEL, L4)], [])},
                     [[expr(PRODUCT_LABEL, H100)],
                      [expr(PRODUCT_LABEL, A100, H100), expr(PRODUCT_LABEL, A100)],
                      [expr(PRODUCT_LABEL, L4), expr(PRODUCT_LABEL, A100)],
                      [expr(PRODUCT_LABEL, A100)]],
                     id="a term within keep stays; one reaching outside it is pinned"),
        pytest.param({"nodeSelector": {PRODUCT_LABEL: H100},
                      "affinity": required_affinity([expr(ZONE, "a")])},
                     [[expr(ZONE, "a")]],
                     id="a nodeSelector value within keep already complies"),
    ],
)
def test_pin_leaves_terms_within_keep(spec: dict[str, Any],
                                      expected: list[list[dict[str, Any]]]) -> None:
    placement, patch = Placement(spec, "/spec"), Patch()
    placement.pin(PRODUCT_LABEL, [A100], patch, keep=frozenset([H100]))
    assert [t.get("matchExpressions", []) for t in
            spec["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]] == expected
    # Pinning again changes nothing: the summary saw what the first pin appended.
    again = Patch()
    assert not placement.pin(PRODUCT_LABEL, [A100], again, keep=frozenset([H100]))
    assert again.ops == []


TERMS = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"


@pytest.mark.parametrize(
    ("required", "pointer"),
    [
        pytest.param({"nodeSelectorTerms": {"matchExpressions": []}}, f"{TERMS} must be a list",
                     id="terms not a list"),
        pytest.param({"nodeSelectorTerms": [{}, "zone=a"]}, f"{TERMS}/1 must be a mapping",
                     id="second term not a mapping"),
        pytest.param({"nodeSelectorTerms": [{"matchExpressions": [expr(ZONE, "a")]},
                                            {"matchExpressions": expr(ZONE, "b")}]},
                     f"{TERMS}/1/matchExpressions must be a list",
                     id="expressions not a list"),
    ],
)
def test_malformed_required_terms_are_denied_with_the_place_to_fix(
        required: dict[str, Any], pointer: str) -> None:
    bad = pod(affinity={"nodeAffinity": {REQUIRED: required}})
    for run in (mutate, validating):
        d = run(review(bad), example_policy(), namespace_labels)
        assert not d.allowed
        assert d.patch == []
        # Said once, where to fix it and what it must be (not "X must be X must be ...").
        assert d.message == f"pod research/trainer: the object is malformed: {pointer}."
