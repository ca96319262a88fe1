"""Fuzzing the engine and quota with hypothesis (properties in ``fuzzkit`` and
``quotamachine``). CI runs a few hundred examples; ``FUZZ_EXAMPLES=100000`` (or
``python tests/fuzz/run_long.py``) runs the long campaign.
"""

from __future__ import annotations

import os
from typing import Any

from fuzzkit import check_review, reviews
from hypothesis import HealthCheck, Phase, example, given, settings
from quotamachine import QuotaMachine

from webhook.k8s.review import request_review

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(reviews())
def test_engine_invariants(review: dict[str, Any]) -> None:
    check_review(review)


@settings(FUZZ, phases=[Phase.explicit])  # just the cases below, once each
@given(reviews())
@example(dict(request_review(  # found by the first long run: NotIn the default product
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "research"},
     "spec": {"containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                  "nodeSelectorTerms": [{"matchExpressions": [{
                      "key": "nvidia.com/gpu.product", "operator": "NotIn",
                      "values": ["NVIDIA-A100-SXM4-80GB"]}]}]}}}}})))
@example(dict(request_review(  # found by the second: a short product name in affinity
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "research"},
     "spec": {"containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                  "nodeSelectorTerms": [{"matchExpressions": [{
                      "key": "nvidia.com/gpu.product", "operator": "In",
                      "values": ["a100", "NVIDIA-H100-80GB-HBM3"]}]}]}}}}})))
@example(dict(request_review(
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "research"},
     "spec": {"containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                  "nodeSelectorTerms": [{"matchExpressions": [{
                      "key": "nvidia.com/gpu.product", "operator": "In",
                      "values": ["a100"]}]}]}}}}})))
@example(dict(request_review(  # found by the third: one term In H100, one NotIn A100
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "research"},
     "spec": {"containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                  "nodeSelectorTerms": [
                      {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                             "values": ["NVIDIA-H100-80GB-HBM3"]}]},
                      {"matchExpressions": [{"key": "nvidia.com/gpu.product",
                                             "operator": "NotIn",
                                             "values": ["NVIDIA-A100-SXM4-80GB"]}]}]}}}}})))
@example(dict(request_review(  # no rack of the tenant's is left in either term
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "research"},
     "spec": {"containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                  "nodeSelectorTerms": [
                      {"matchExpressions": [{"key": "topology.example.com/gpu-rack",
                                             "operator": "In", "values": ["rack-a"]},
                                            {"key": "topology.example.com/gpu-rack",
                                             "operator": "NotIn", "values": ["rack-a"]}]},
                      {"matchExpressions": [{"key": "topology.example.com/gpu-rack",
                                             "operator": "NotIn",
                                             "values": ["rack-a", "rack-b"]}]}]}}}}})))
def test_engine_invariants_found_cases(review: dict[str, Any]) -> None:
    check_review(review)


TestQuotaAdmitsWhatFitsAndNothingOverCap = QuotaMachine.TestCase
TestQuotaAdmitsWhatFitsAndNothingOverCap.settings = settings(
    FUZZ, max_examples=max(20, EXAMPLES // 4), stateful_step_count=40)
