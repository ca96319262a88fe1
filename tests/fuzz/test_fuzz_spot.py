"""Fuzzing the spot rules: the engine invariants of ``fuzzkit.check_review`` (a valid
reply, the same verdict twice, idempotent patches, and nothing the mutating webhook
passed cleanly refused by the validating one) under the example policy with spot
capacity, on pods that say or deny they are fault tolerant, ask for or rule out spot
nodes, and carry spot tolerations of every shape.
"""

from __future__ import annotations

from typing import Any

from fuzzkit import POLICY_FILE, check_review, pod_templates, reviews
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import EXAMPLES

from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text

LABEL = "karpenter.sh/capacity-type"
FT = "gpu-webhook.dev/fault-tolerant"


def _spot_policy() -> CompiledPolicy:
    text = POLICY_FILE.read_text()
    for old, new in (
        ("  tenants:\n", "  spot:\n    provider: karpenter\n    tolerations:\n"
                         f"      - {{key: {LABEL}, operator: Equal, value: spot, "
                         "effect: NoSchedule}\n"
                         "    faultTolerant: {priorityClasses: [batch]}\n  tenants:\n"),
        ("      namespaces: [research, research-dev]\n",
         "      namespaces: [research, research-dev]\n      spot: {placement: allowed}\n"),
        ("      namespaces: [notebooks]\n",
         "      namespaces: [notebooks]\n"
         "      spot: {placement: required, gpus: 2, weight: 0.5}\n"),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return compile_policy(load_text(text, "spot-fuzz"))


SPOT_POLICY = _spot_policy()

spot_tolerations = st.sampled_from([
    {"key": LABEL, "operator": "Exists"},
    {"key": LABEL, "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
    {"key": LABEL, "operator": "Equal", "value": "on-demand"},
    {"operator": "Exists"},
])
spot_expressions = st.sampled_from([
    {"key": LABEL, "operator": "In", "values": ["spot"]},
    {"key": LABEL, "operator": "In", "values": ["on-demand"]},
    {"key": LABEL, "operator": "In", "values": ["spot", "on-demand"]},
    {"key": LABEL, "operator": "NotIn", "values": ["spot"]},
    {"key": LABEL, "operator": "DoesNotExist"},
])


@st.composite
def spot_templates(draw: st.DrawFn) -> dict[str, Any]:
    """A fuzzed pod template with spot-related edits on top."""
    t = draw(pod_templates())
    meta, spec = t["metadata"], t["spec"]
    said = draw(st.sampled_from([None, None, "true", "false", "TRUE", "yes"]))
    if said is not None:
        meta.setdefault("labels", {})[FT] = said
    if draw(st.integers(0, 3)) == 0:
        spec["priorityClassName"] = draw(st.sampled_from(["batch", "serving"]))
    if draw(st.booleans()):
        spec["tolerations"] = [*spec.get("tolerations", []),
                               *draw(st.lists(spot_tolerations, max_size=2))]
    if draw(st.integers(0, 3)) == 0:
        spec.setdefault("nodeSelector", {})[LABEL] = draw(st.sampled_from(["spot",
                                                                           "on-demand"]))
    terms = (spec.get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {})
             .get("nodeSelectorTerms"))
    if terms and draw(st.booleans()):
        for term in terms:
            if draw(st.booleans()):
                term["matchExpressions"].append(draw(spot_expressions))
    elif draw(st.integers(0, 3)) == 0:
        spec["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [draw(spot_expressions)]}]}}}
    return t


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(reviews(spot_templates()))
def test_engine_invariants_with_spot(review: dict[str, Any]) -> None:
    check_review(review, SPOT_POLICY)
