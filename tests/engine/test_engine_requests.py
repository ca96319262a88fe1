"""GPU requests and limits in the mutating webhook: the missing half is completed, a
mismatch is refused with a message, and quantities are read the way Kubernetes reads
them (whole devices only).

Every case runs through ``mutate_checked``: the patch applies, the result is a valid
Kubernetes object and a second run changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from enginekit import (
    GPU,
    VOID_ENTRY,
    container,
    example_policy,
    gpus,
    gpus_charged,
    mutate_checked,
    neutralized_only,
    pod,
    review,
    validated,
)

from webhook.admission.webhooks import mutating as mutate
from webhook.policy.model import Rule

MIG = "nvidia.com/mig-1g.10gb"


def resources(obj: dict[str, Any], index: int = 0, key: str = "containers") -> dict[str, Any]:
    return dict(obj["spec"][key][index].get("resources", {}))


@pytest.mark.parametrize(
    ("given", "expected_resources", "expected_new_paths"),
    [
        pytest.param(
            container(limits=gpus(2)),
            {"limits": {GPU: 2}, "requests": {GPU: 2}},
            # One op adds the missing map with the GPU in it: no add under a missing parent.
            ["/spec/containers/0/resources/requests"],
            id="limit only: the request is added, equal to the limit",
        ),
        pytest.param(
            container(requests=gpus("4")),
            {"requests": {GPU: "4"}, "limits": {GPU: "4"}},
            ["/spec/containers/0/resources/limits"],
            id="request only: the limit is added, equal to the request",
        ),
        pytest.param(
            container(requests={GPU: 1, "cpu": "4"}, limits={"memory": "32Gi"}),
            {"requests": {GPU: 1, "cpu": "4"}, "limits": {"memory": "32Gi", GPU: 1}},
            ["/spec/containers/0/resources/limits/nvidia.com~1gpu"],
            id="request only, limits map exists for memory: the GPU joins it",
        ),
        pytest.param(
            container(requests=gpus("1000m"), limits=gpus(1)),
            {"requests": {GPU: "1000m"}, "limits": {GPU: 1}},
            [],
            id="both present and equal (written differently): left alone",
        ),
    ],
)
def test_missing_half_of_the_pair_is_completed(given: dict[str, Any],
                                               expected_resources: dict[str, Any],
                                               expected_new_paths: list[str]) -> None:
    m = mutate_checked(pod(given))
    assert m.decision.allowed, m.decision.message
    assert resources(m.patched) == expected_resources
    resource_ops = [p for p in m.paths if "/resources" in p]
    assert resource_ops == expected_new_paths
    if expected_new_paths:
        assert "gpu-requests" in m.decision.mutations


def test_container_without_resources_is_left_alone_next_to_a_gpu_container() -> None:
    # Its resources are: it only gets NVIDIA_VISIBLE_DEVICES=void, being given no GPU.
    sidecar = container("log-shipper")
    m = mutate_checked(pod(container(limits=gpus(1)), sidecar))
    assert m.decision.allowed
    assert m.patched["spec"]["containers"][1] == {**sidecar, "env": [VOID_ENTRY]}
    assert [p for p in m.paths if p.startswith("/spec/containers/1")] == [
        "/spec/containers/1/env"]


def test_pod_whose_containers_have_no_resources_is_not_a_gpu_pod() -> None:
    m = mutate_checked(pod(container()))
    assert m.decision.allowed
    assert neutralized_only(m.decision.patch)
    assert m.decision.findings == []


def test_a_null_gpu_value_asks_for_no_gpu() -> None:
    # Not a request of 0 GPUs: the pod gets no GPU toleration and no product pinning.
    # (Run without the schema check: a null quantity is not a valid object, and core
    # validation answers it; the webhook must just not treat it as a GPU pod.)
    d = mutate(review(pod(container(limits={GPU: None, "cpu": "1"}))), example_policy())
    assert d.allowed
    assert neutralized_only(d.patch)
    assert d.mutations == ["gpu-visible-devices"]


@pytest.mark.parametrize(
    ("requests", "limits", "shown"),
    [
        (gpus(1), gpus(2), "request 1 differs from limit 2"),
        (gpus("4"), gpus("2000m"), "request 4 differs from limit 2"),
    ],
)
def test_request_different_from_limit_is_denied(requests: dict[str, Any],
                                                limits: dict[str, Any], shown: str) -> None:
    m = mutate_checked(pod(container(requests=requests, limits=limits)))
    d = m.decision
    assert not d.allowed
    assert [f.rule for f in d.findings] == [Rule.REQUESTS_MATCH_LIMITS]
    assert d.message.startswith('pod research/trainer, container "main": nvidia.com/gpu ')
    assert shown in d.message
    assert "set both to" in d.message  # the fix is spelled out


@pytest.mark.parametrize(
    ("value", "mutate_allows", "validate_rules"),
    [
        pytest.param(2, True, [], id="number 2"),
        pytest.param("2", True, [], id="string 2"),
        ("1000m", True, []),  # 1000 milli-devices is exactly one device
        ("500m", False, [Rule.GPU_QUANTITY]),
        ("1.5", False, [Rule.GPU_QUANTITY]),
        ("-1", False, [Rule.GPU_QUANTITY]),
        ("abc", False, [Rule.GPU_QUANTITY]),
        # 1000 devices is a valid whole count; the caps are the validating webhook's
        # (one container over both: said once, see test_engine_maximums).
        ("1k", True, [Rule.MAX_PER_CONTAINER]),
    ],
)
def test_quantities_are_read_as_kubernetes_reads_them(value: Any, mutate_allows: bool,
                                                      validate_rules: list[Rule]) -> None:
    m = mutate_checked(pod(container(limits=gpus(value))))
    assert m.decision.allowed is mutate_allows, m.decision.message
    if mutate_allows:
        # The request is a copy of what the user wrote, not a re-rendering of it.
        assert resources(m.patched)["requests"] == {GPU: value}
        v = validated(m.patched)
        assert [f.rule for f in v.findings] == validate_rules
        assert v.allowed is (not validate_rules)
    else:
        assert [f.rule for f in m.decision.findings] == [Rule.GPU_QUANTITY]
        # A fraction is named as the number it is ("500m" reaches admission for a 0.5).
        shown = {"500m": "0.5", "1.5": "1.5"}.get(value, f"'{value}'")
        assert f"nvidia.com/gpu limit {shown} is " in m.decision.message
        assert 'whole number of 1 or more, e.g. "1"' in m.decision.message


def test_a_fraction_reads_the_same_offline_and_through_the_api_server() -> None:
    # Offline, a manifest's `nvidia.com/gpu: 0.5` is the number 0.5; through kubectl the
    # API server hands admission its canonical form, "500m". One message for both.
    offline, online = (mutate_checked(pod(container(limits=gpus(v)))).decision.message
                       for v in (0.5, "500m"))
    assert offline == online
    assert "nvidia.com/gpu limit 0.5 is not a whole number." in offline


@pytest.mark.parametrize("zero", [0, "0", "0m", "0.0"])
def test_a_zero_count_asks_for_no_gpu(zero: Any) -> None:
    # Charts render `nvidia.com/gpu: 0` to mean "GPU off"; Kubernetes schedules such a
    # pod as one without GPUs. It is left as it is: no request completed, no GPU
    # toleration or product pinning, no quota charge.
    m = mutate_checked(pod(container(limits=gpus(zero))))
    assert m.decision.allowed, m.decision.message
    assert neutralized_only(m.decision.patch) and m.decision.skipped is None
    assert m.decision.findings == []
    v = validated(m.patched)
    assert v.allowed and v.findings == [] and gpus_charged(m.patched) == 0


def test_a_zero_request_with_a_nonzero_limit_is_a_mismatch() -> None:
    m = mutate_checked(pod(container(requests=gpus("0"), limits=gpus(2))))
    assert not m.decision.allowed
    assert [f.rule for f in m.decision.findings] == [Rule.REQUESTS_MATCH_LIMITS]
    assert "request 0 differs from limit 2" in m.decision.message


@pytest.mark.parametrize(
    ("namespace", "resource", "path_key"),
    [
        ("research", "nvidia.com/gpu", "nvidia.com~1gpu"),
        ("notebooks", MIG, "nvidia.com~1mig-1g.10gb"),
    ],
)
def test_resource_names_with_a_slash_are_escaped_in_patch_paths(namespace: str, resource: str,
                                                                path_key: str) -> None:
    # A requests map exists (for CPU), so the op adds the GPU key itself to it.
    m = mutate_checked(pod(container(limits=gpus(1, resource), requests={"cpu": "1"}),
                           namespace=namespace))
    assert m.decision.allowed, m.decision.message
    assert f"/spec/containers/0/resources/requests/{path_key}" in m.paths
    assert resources(m.patched)["requests"] == {"cpu": "1", resource: 1}


@pytest.mark.parametrize(
    ("namespace", "resource", "allowed", "warned"),
    [
        ("research", "nvidia.com/gpu.shared", False, False),  # enforce
        ("notebooks", GPU, True, True),  # the notebooks tenant is in warn mode
        ("notebooks", MIG, True, False),
    ],
)
def test_tenant_may_use_only_its_gpu_resources(namespace: str, resource: str, allowed: bool,
                                               warned: bool) -> None:
    m = mutate_checked(pod(container(limits=gpus(1, resource)), namespace=namespace))
    d = m.decision
    assert d.allowed is allowed
    assert bool(d.warnings) is warned
    if not allowed or warned:
        text = d.message or d.warnings[0]
        assert f"{resource} is not a GPU resource tenant" in text
        assert "[rule allowed-resources," in text
