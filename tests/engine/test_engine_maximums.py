"""The per-container and per-pod GPU caps, as the developer reads them: one container
over both caps is one fault and gets one message, with the cap that lets the pod in
(the looser cap's "ask for N or fewer" would name a number still refused); several
containers, or caps in different modes, keep every message that changes the outcome.

Tenant research caps 8 per container and 8 per pod; inference 2 per container and 4
per pod (policies/multi-tenant.yaml; namespace serving is labelled for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from enginekit import (
    admitted,
    container,
    example_variant,
    gpus,
    pod,
)

from webhook.engine.decision import Decision, Finding
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode, Rule

RESEARCH_CAPS = ("      maxGpusPerContainer: 8\n      maxGpusPerPod: 8\n")


def decided(manifest: dict[str, Any], policy: CompiledPolicy | None = None) -> Decision:
    """The validating webhook's decision on the pod the mutating webhook let through."""
    return admitted(manifest, policy)[1]


def rules(findings: Sequence[Finding]) -> list[tuple[Rule, Mode]]:
    return [(f.rule, f.mode) for f in findings]


def test_one_container_over_equal_caps_is_told_once_naming_the_container() -> None:
    d = decided(pod(container(limits=gpus(12), requests=gpus(12))))
    assert rules(d.findings) == [(Rule.MAX_PER_CONTAINER, Mode.ENFORCE)]
    assert d.message.count("asks for 12 GPUs") == 1
    assert 'container "main"' in d.message and "Ask for 8 or fewer" in d.message


def test_one_container_over_a_tighter_pod_cap_is_told_the_pod_cap() -> None:
    # 4 per pod, 16 per container: "ask for 16 or fewer" would still be refused.
    policy = example_variant((RESEARCH_CAPS,
                              "      maxGpusPerContainer: 16\n      maxGpusPerPod: 4\n"))
    d = decided(pod(container(limits=gpus(20), requests=gpus(20))), policy)
    assert rules(d.findings) == [(Rule.MAX_PER_POD, Mode.ENFORCE)]
    assert "at most 4 GPUs per pod" in d.message and "Ask for 4 or fewer" in d.message
    assert "16" not in d.message


def test_only_the_cap_that_is_crossed_is_told() -> None:
    d = decided(pod(container(limits=gpus(3), requests=gpus(3)), namespace="serving"))
    assert rules(d.findings) == [(Rule.MAX_PER_CONTAINER, Mode.ENFORCE)]  # 3 > 2 per container
    d = decided(pod(container("a", limits=gpus(2), requests=gpus(2)),
                      container("b", limits=gpus(2), requests=gpus(2)),
                      container("c", limits=gpus(1), requests=gpus(1)),
                      namespace="serving"))
    assert rules(d.findings) == [(Rule.MAX_PER_POD, Mode.ENFORCE)]  # 5 > 4 per pod


def test_several_containers_over_their_cap_keep_both_messages() -> None:
    # Two containers of 9: each over 8 per container, and 18 over 8 per pod. Bringing
    # each container to 8 still leaves 16 in the pod: both messages are needed.
    d = decided(pod(container("a", limits=gpus(9), requests=gpus(9)),
                      container("b", limits=gpus(9), requests=gpus(9))))
    assert rules(d.findings) == [(Rule.MAX_PER_CONTAINER, Mode.ENFORCE),
                                 (Rule.MAX_PER_CONTAINER, Mode.ENFORCE),
                                 (Rule.MAX_PER_POD, Mode.ENFORCE)]


def test_a_looser_cap_that_denies_is_kept_beside_a_tighter_one_that_warns() -> None:
    # The pod cap (4, tighter) only warns; the container cap (16) denies: the denial
    # must stay, and the warning tells what the rollout will ask next.
    policy = example_variant(
        (RESEARCH_CAPS, "      maxGpusPerContainer: 16\n      maxGpusPerPod: 4\n"),
        ("  tenants:\n", "  rules:\n    max-gpus-per-pod: {mode: warn}\n  tenants:\n"))
    d = decided(pod(container(limits=gpus(20), requests=gpus(20))), policy)
    assert rules(d.findings) == [(Rule.MAX_PER_CONTAINER, Mode.ENFORCE),
                                 (Rule.MAX_PER_POD, Mode.WARN)]
    assert not d.allowed


def test_a_looser_cap_that_warns_beside_a_tighter_one_that_denies_is_left_out() -> None:
    policy = example_variant(
        (RESEARCH_CAPS, "      maxGpusPerContainer: 16\n      maxGpusPerPod: 4\n"),
        ("  tenants:\n", "  rules:\n    max-gpus-per-container: {mode: warn}\n  tenants:\n"))
    d = decided(pod(container(limits=gpus(20), requests=gpus(20))), policy)
    assert rules(d.findings) == [(Rule.MAX_PER_POD, Mode.ENFORCE)]
