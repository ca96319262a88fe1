"""Fuzzing the engine and quota with hypothesis (properties in ``fuzzkit`` and
``quotamachine``). CI runs a few hundred examples; ``FUZZ_EXAMPLES=100000`` (or
``python tests/fuzz/run_long.py``) runs the long campaign.
"""

from __future__ import annotations

import os
from typing import Any

from fuzzkit import PRODUCT_LABEL, RACK_LABEL, check_review, reviews
from hypothesis import HealthCheck, Phase, example, given, settings
from quotamachine import QuotaMachine

from webhook.k8s.review import request_review

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    """One node selector requirement: ``key`` ``operator`` ``values``."""
    return {"key": key, "operator": operator, "values": list(values)}


def affinity_review(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    """The review of a one-GPU pod in research whose required node affinity has one
    term per list of match expressions in ``terms``."""
    return dict(request_review(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "research"},
         "spec": {"containers": [{"name": "app",
                                  "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                  "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                      "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}}))


@FUZZ
@given(reviews())
def test_engine_invariants(review: dict[str, Any]) -> None:
    check_review(review)


@settings(FUZZ, phases=[Phase.explicit])  # just the cases below, once each
@given(reviews())
@example(affinity_review(  # found by the first long run: NotIn the default product
    [expr(PRODUCT_LABEL, "NotIn", "NVIDIA-A100-SXM4-80GB")]))
@example(affinity_review(  # found by the second: a short product name in affinity
    [expr(PRODUCT_LABEL, "In", "a100", "NVIDIA-H100-80GB-HBM3")]))
@example(affinity_review([expr(PRODUCT_LABEL, "In", "a100")]))
@example(affinity_review(  # found by the third: one term In H100, one NotIn A100
    [expr(PRODUCT_LABEL, "In", "NVIDIA-H100-80GB-HBM3")],
    [expr(PRODUCT_LABEL, "NotIn", "NVIDIA-A100-SXM4-80GB")]))
@example(affinity_review(  # no rack of the tenant's is left in either term
    [expr(RACK_LABEL, "In", "rack-a"), expr(RACK_LABEL, "NotIn", "rack-a")],
    [expr(RACK_LABEL, "NotIn", "rack-a", "rack-b")]))
def test_engine_invariants_found_cases(review: dict[str, Any]) -> None:
    check_review(review)


TestQuotaAdmitsWhatFitsAndNothingOverCap = QuotaMachine.TestCase
TestQuotaAdmitsWhatFitsAndNothingOverCap.settings = settings(
    FUZZ, max_examples=max(20, EXAMPLES // 4), stateful_step_count=40)
