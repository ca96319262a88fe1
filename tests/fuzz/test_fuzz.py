"""Fuzzing the engine and quota with hypothesis (properties in ``fuzzkit`` and
``quotamachine``). CI runs a few hundred examples; ``FUZZ_EXAMPLES=100000`` (or
``python tests/fuzz/run_long.py``) runs the long campaign.
"""

from __future__ import annotations

import os
from typing import Any

from fuzzkit import check_review, reviews
from hypothesis import HealthCheck, given, settings
from quotamachine import QuotaMachine

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(reviews())
def test_engine_invariants(review: dict[str, Any]) -> None:
    check_review(review)


TestQuotaNeverNegativeOrOverCap = QuotaMachine.TestCase
TestQuotaNeverNegativeOrOverCap.settings = settings(
    FUZZ, max_examples=max(20, EXAMPLES // 4), stateful_step_count=40)
