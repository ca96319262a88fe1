"""Pinning pods with several node-affinity terms, over generated terms.

Kubernetes ORs the terms, so a term that already names an allowed product (or one of the
tenant's racks) must come out of the mutating webhook still able to match a node. The
research tenant without per-product quota (``NO_PRODUCT_QUOTA``) keeps such terms as they
are; the example policy, whose per-product quota needs each pod on one product, pins the
chosen product into every term. The two must agree on every pod that has at most one
term or names its product itself.
"""

from __future__ import annotations

from typing import Any

from enginekit import (
    A100,
    H100,
    L4,
    PRODUCT_LABEL,
    RACK_LABEL,
    example_policy,
    example_variant,
    mutate_checked,
    node_terms,
    pod,
    required_affinity,
    validated,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.policy.model import Mode

NO_PRODUCT_QUOTA = example_variant(("        products: {a100: 24, h100: 8}\n", ""))
ZONE = "topology.kubernetes.io/zone"
PRODUCT_REQUEST = "gpu.example.com/product"
ALLOWED = {A100, H100}
RACKS = {"rack-a", "rack-b"}
POOLS = {PRODUCT_LABEL: [A100, H100, L4, "h100"], RACK_LABEL: ["rack-a", "rack-b", "rack-z"],
         ZONE: ["a", "b"]}

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def _expr(draw: st.DrawFn) -> dict[str, Any]:
    key = draw(st.sampled_from(sorted(POOLS)))
    op = draw(st.sampled_from(["In", "In", "In", "NotIn", "Exists", "DoesNotExist"]))
    if op in ("Exists", "DoesNotExist"):
        return {"key": key, "operator": op}
    values = draw(st.lists(st.sampled_from(POOLS[key]), min_size=1, max_size=2, unique=True))
    return {"key": key, "operator": op, "values": values}


_terms = st.lists(st.lists(_expr(), max_size=3), max_size=3)


def _admitted(term: list[dict[str, Any]], key: str,
              universe: set[str] | None = None) -> set[str] | None:
    """The values of ``key`` a term admits; for a term without ``In`` on ``key``, those of
    ``universe`` it does not rule out (None when no universe is given)."""
    within: set[str] | None = None
    banned: set[str] = set()
    for e in term:
        if e["key"] != key:
            continue
        if e["operator"] == "In":
            within = set(e["values"]) if within is None else within & set(e["values"])
        elif e["operator"] == "NotIn":
            banned |= set(e["values"])
        elif e["operator"] == "DoesNotExist":
            return set()
    if within is None:
        return None if universe is None else universe - banned
    return within - banned


def _complies(term: list[dict[str, Any]]) -> bool:
    """Whether a term names only allowed products and leaves some node of the tenant's
    racks (in a zone it does not rule out entirely)."""
    product = _admitted(term, PRODUCT_LABEL)
    racks = _admitted(term, RACK_LABEL, RACKS)
    return bool(product and product <= ALLOWED and racks and racks <= RACKS
                and _admitted(term, ZONE) != set())


def _manifest(terms: list[list[dict[str, Any]]], **extra: Any) -> dict[str, Any]:
    return pod(affinity=required_affinity(*terms), **extra) if terms else pod(**extra)


@SETTINGS
@given(_terms)
def test_a_term_that_complies_keeps_a_node(terms: list[list[dict[str, Any]]]) -> None:
    m = mutate_checked(_manifest(terms), NO_PRODUCT_QUOTA)
    if not m.decision.allowed:
        return
    # No terms: the pin creates one. Otherwise term i of the result is term i of the pod.
    after = [t["matchExpressions"] for t in node_terms(m.patched)] if terms else []
    for before, now in zip(terms, after, strict=True):
        if _complies(before):
            assert _admitted(now, PRODUCT_LABEL), (before, now)
            assert _admitted(now, RACK_LABEL), (before, now)
    # What the mutating webhook passed cleanly, the validating one accepts as it is.
    v = validated(m.patched, NO_PRODUCT_QUOTA)
    if not m.decision.findings:
        assert v.allowed, v.message
        assert not [f for f in v.findings if f.mode is Mode.ENFORCE]


@SETTINGS
@given(terms=st.lists(st.lists(_expr(), max_size=3), max_size=1),
       selector=st.sampled_from([None, {PRODUCT_LABEL: H100}, {PRODUCT_LABEL: L4},
                                 {RACK_LABEL: "rack-b"}]),
       asked=st.sampled_from([None, "a100", "h100"]))
def test_one_term_or_a_named_product_is_pinned_as_before(
        terms: list[list[dict[str, Any]]], selector: dict[str, str] | None,
        asked: str | None) -> None:
    extra: dict[str, Any] = {}
    if selector:
        extra["nodeSelector"] = selector
    if asked:
        extra["labels"] = {PRODUCT_REQUEST: asked}
    one = mutate_checked(_manifest(terms, **extra), example_policy())
    kept = mutate_checked(_manifest(terms, **extra), NO_PRODUCT_QUOTA)
    assert (kept.decision.allowed, kept.decision.message, kept.decision.patch) == \
        (one.decision.allowed, one.decision.message, one.decision.patch)


@SETTINGS
@given(terms=st.lists(st.lists(_expr(), max_size=3), min_size=2, max_size=3),
       asked=st.sampled_from(["a100", "h100"]))
def test_a_product_asked_by_label_goes_into_every_term_as_before(
        terms: list[list[dict[str, Any]]], asked: str) -> None:
    manifest = _manifest(terms, labels={PRODUCT_REQUEST: asked})
    one = mutate_checked(manifest, example_policy())
    kept = mutate_checked(manifest, NO_PRODUCT_QUOTA)
    assert (kept.decision.allowed, kept.decision.message, kept.decision.patch) == \
        (one.decision.allowed, one.decision.message, one.decision.patch)
