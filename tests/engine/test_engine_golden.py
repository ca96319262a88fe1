"""Golden files: the exact text developers read (denials, warnings) and the exact JSON
Patches the API server applies, for representative cases.

A wording change in ``webhook.engine.messages`` or a change in patch shape shows up as a
diff under ``tests/golden/``; regenerate with ``UPDATE_GOLDEN=1`` when it is intended.
Besides matching its file, every message must read resource -> reason -> how to fix,
tagged with its rule: a developer should be able to act on it without the policy file.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from enginekit import (
    GPU_TOLERATION,
    L4,
    PRODUCT_LABEL,
    RACK_LABEL,
    admitted,
    check_mutation,
    claim,
    container,
    cronjob,
    deployment,
    device_request,
    example_policy,
    example_variant,
    expr,
    gpus,
    holding_policy,
    job,
    mutate_checked,
    pod,
    required_affinity,
    review,
    spot_policy,
    validated,
)

from webhook.admission.webhooks import mutating as mutate
from webhook.engine.decision import Decision
from webhook.policy.model import Rule

DENY_TOLERATIONS = example_variant(("nonGpuPodsToleratingGpuTaints: strip",
                                    "nonGpuPodsToleratingGpuTaints: deny"))
DENY_VISIBLE_DEVICES = example_variant((
    "nonGpuPodsToleratingGpuTaints: strip",
    "nonGpuPodsToleratingGpuTaints: strip\n  gpuRoutes: {visibleDevices: deny}"))
ALL_GPUS = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
ON_RACK_A = {PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB", RACK_LABEL: "rack-a"}
SPOT_LABEL = "karpenter.sh/capacity-type"
SPOT_TOLERATION = {"key": SPOT_LABEL, "operator": "Exists"}


def mutating(manifest: dict[str, Any], policy: Any = None) -> Callable[[], Decision]:
    return lambda: mutate_checked(manifest, policy).decision


def validating(manifest: dict[str, Any], policy: Any = None) -> Callable[[], Decision]:
    return lambda: validated(manifest, policy)


def after_mutating(manifest: dict[str, Any], policy: Any = None) -> Callable[[], Decision]:
    """The validating webhook's decision on what the mutating webhook made."""
    return lambda: admitted(manifest, policy)[1]


# name -> (how to get the decision, the rules its text must carry)
MESSAGE_CASES: dict[str, tuple[Callable[[], Decision], list[Rule]]] = {
    "tenant-required": (mutating(pod(namespace="sandbox")), [Rule.TENANT_REQUIRED]),
    "gpu-whole-number": (mutating(pod(container(limits=gpus("500m")))), [Rule.GPU_QUANTITY]),
    "gpu-requests-match-limits": (
        mutating(pod(container(requests=gpus(1), limits=gpus(2)))),
        [Rule.REQUESTS_MATCH_LIMITS]),
    "allowed-resources": (
        mutating(pod(container(limits=gpus(1, "nvidia.com/gpu.shared")))),
        [Rule.ALLOWED_RESOURCES]),
    "allowed-products-not-allowed": (
        mutating(pod(labels={"gpu.example.com/product": "l4"})), [Rule.ALLOWED_PRODUCTS]),
    "allowed-products-unknown": (
        mutating(pod(annotations={"gpu.example.com/product": "v100"})),
        [Rule.ALLOWED_PRODUCTS]),
    "allowed-products-short-name-selector": (
        mutating(pod(nodeSelector={PRODUCT_LABEL: "h100"})), [Rule.ALLOWED_PRODUCTS]),
    "allowed-products-unpinned": (
        validating(pod(nodeSelector={RACK_LABEL: "rack-a"})), [Rule.ALLOWED_PRODUCTS]),
    "topology": (mutating(pod(nodeSelector={RACK_LABEL: "rack-z"})), [Rule.TOPOLOGY]),
    "max-gpus-per-container": (
        validating(pod(container(limits=gpus(3)), namespace="serving",
                       nodeSelector={PRODUCT_LABEL: L4})), [Rule.MAX_PER_CONTAINER]),
    "max-gpus-per-pod": (
        validating(pod(container("a", limits=gpus(5)), container("b", limits=gpus(5)),
                       nodeSelector=ON_RACK_A)), [Rule.MAX_PER_POD]),
    "non-gpu-tolerations": (
        mutating(pod(container(), tolerations=[GPU_TOLERATION]), DENY_TOLERATIONS),
        [Rule.NON_GPU_TOLERATIONS]),
    "job-template": (
        mutating(job(pod(container(requests=gpus(2), limits=gpus("1")), name="bert"))),
        [Rule.REQUESTS_MATCH_LIMITS]),
    "warn-notebooks": (
        mutating(pod(container(limits=gpus(1)), namespace="notebooks")),
        [Rule.ALLOWED_RESOURCES]),
    # GPUs through Dynamic Resource Allocation
    "allowed-device-classes": (
        mutating(claim(device_request("mig.nvidia.com"))), [Rule.ALLOWED_DEVICE_CLASSES]),
    "device-admin-access": (
        mutating(claim(device_request(adminAccess=True))), [Rule.DEVICE_ADMIN_ACCESS]),
    "extended-resource-claim": (
        mutating(claim(annotations={"resource.kubernetes.io/extended-resource-claim": "true"})),
        [Rule.EXTENDED_RESOURCE_CLAIM]),
    "unknown-claim": (
        validating(pod(container(limits={"cpu": "1"}), resourceClaims=[
            {"name": "gpu", "resourceClaimTemplateName": "single-gpu"}])),
        [Rule.UNKNOWN_CLAIM]),
    # Spot capacity (policies/examples/spot.yaml)
    "spot-tolerated": (
        mutating(pod(tolerations=[SPOT_TOLERATION]),
                 spot_policy(("podsToleratingSpot: strip", "podsToleratingSpot: deny"))),
        [Rule.SPOT_PLACEMENT]),
    "spot-asked-never": (
        mutating(pod(namespace="serving", nodeSelector={SPOT_LABEL: "spot"}), spot_policy()),
        [Rule.SPOT_PLACEMENT]),
    "spot-only": (
        mutating(pod(namespace="sweeps", labels={"gpu-webhook.dev/fault-tolerant": "false"}),
                 spot_policy()), [Rule.SPOT_PLACEMENT]),
    "spot-unguarded": (validating(pod(), spot_policy()), [Rule.SPOT_PLACEMENT]),
    "spot-unclear-label": (
        mutating(pod(labels={"gpu-webhook.dev/fault-tolerant": "yes"}), spot_policy()),
        [Rule.SPOT_PLACEMENT]),
    "spot-unpinned": (validating(pod(namespace="sweeps"), spot_policy()),
                      [Rule.SPOT_PLACEMENT]),
    # Routes to a GPU that skip the GPU request (engine.routes)
    "gpu-visible-devices": (
        mutating(pod(container(env=[ALL_GPUS])), DENY_VISIBLE_DEVICES),
        [Rule.VISIBLE_DEVICES]),
    "gpu-visible-devices-charged": (
        mutating(pod(container(limits=gpus(1), env=[ALL_GPUS])), DENY_VISIBLE_DEVICES),
        [Rule.VISIBLE_DEVICES]),
    "privileged-on-gpu-nodes": (
        mutating(pod(container(limits=gpus(1), securityContext={"privileged": True}))),
        [Rule.PRIVILEGED]),
    "device-host-paths": (
        mutating(pod(container(), tolerations=[{"operator": "Exists"}],
                     volumes=[{"name": "dev", "hostPath": {"path": "/dev/nvidia0"}}])),
        [Rule.DEVICE_HOST_PATHS]),
    "node-name": (mutating(pod(container(), nodeName="a100-node-3")), [Rule.NODE_NAME]),
    "priority-class": (
        mutating(pod(container(limits=gpus(1)), priorityClassName="urgent",
                     priority=100000)), [Rule.PRIORITY_CLASS]),
    "device-taint-tolerations": (
        mutating(claim(device_request(tolerations=[{"operator": "Exists"}]))),
        [Rule.DEVICE_TAINT_TOLERATIONS]),
    # How GPUs are held (engine.holding; policies/examples/holding.yaml)
    "max-runtime": (
        mutating(pod(namespace="batch", activeDeadlineSeconds=172800), holding_policy()),
        [Rule.MAX_RUNTIME]),
    "max-runtime-shortened": (
        mutating(pod(container(limits={**gpus(1), "cpu": "8"}),
                     labels={"app.kubernetes.io/component": "notebook"},
                     activeDeadlineSeconds=86400), holding_policy()),
        [Rule.MAX_RUNTIME]),
    "resources-per-gpu": (
        after_mutating(pod(container(limits={**gpus(1), "cpu": "64", "memory": "64Gi"})),
                       holding_policy()), [Rule.RESOURCES_PER_GPU]),
    "resources-per-gpu-memory": (
        after_mutating(pod(container(limits={**gpus(2), "cpu": "8", "memory": "600Gi"}),
                           nodeSelector={PRODUCT_LABEL: "NVIDIA-H200"}), holding_policy()),
        [Rule.RESOURCES_PER_GPU]),
    "queue-routing": (
        validating(pod(namespace="batch", activeDeadlineSeconds=3600,
                       nodeSelector={PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}),
                   holding_policy()),
        [Rule.QUEUE_ROUTING]),
    "gpu-capability": (
        mutating(pod(labels={"gpu-webhook.dev/min-gpu-memory": "lots"}, namespace="batch"),
                 holding_policy()), [Rule.GPU_CAPABILITY]),
}

# A sentence that tells the developer what to do starts with one of these verbs.
FIX_VERBS = ("ask", "set", "use", "change", "add", "remove", "name", "split", "drop", "wait")
LINE = re.compile(
    r"(?P<subject>(pod|[a-z]+ [a-z0-9-]+/[a-z0-9-]+, pod template|"
    r"resourceclaim(template)? [a-z0-9-]+/[a-z0-9-]+)[^:]*): (?P<body>.+) "
    r"\[rule (?P<rule>[a-z-]+), (tenant|policy) [a-z0-9-]+\]"
)


def shown(d: Decision) -> str:
    """What kubectl shows: the denial, or the warnings of an admitted object."""
    return d.message if not d.allowed else "\n".join(d.warnings)


def test_every_rule_but_quota_has_a_golden_message() -> None:
    covered = {r for _, rules in MESSAGE_CASES.values() for r in rules}
    assert covered == set(Rule) - {Rule.QUOTA}


@pytest.mark.parametrize(("name", "case"), MESSAGE_CASES.items(), ids=list(MESSAGE_CASES))
def test_message_matches_golden_file(name: str, case: tuple[Callable[[], Decision], list[Rule]],
                                     golden: Callable[[str, str], None]) -> None:
    run, _ = case
    text = shown(run())
    assert text, "the case must produce a message"
    golden(f"messages/{name}.txt", text)


@pytest.mark.parametrize(("name", "case"), MESSAGE_CASES.items(), ids=list(MESSAGE_CASES))
def test_message_reads_resource_reason_fix_rule(
        name: str, case: tuple[Callable[[], Decision], list[Rule]]) -> None:
    run, rules = case
    lines = shown(run()).splitlines()
    tagged: list[str] = []
    for line in lines:
        m = LINE.fullmatch(line)
        assert m is not None, f"not subject: reason. fix. [rule ...]: {line!r}"
        tagged.append(m.group("rule"))
        sentences = [s.strip() for s in re.split(r"(?<=\.) (?=[A-Z])", m.group("body"))]
        assert len(sentences) >= 2, f"a reason and a fix, in separate sentences: {line!r}"
        fixes = [s for s in sentences[1:]
                 if any(part.strip().lower().startswith(FIX_VERBS) for part in s.split(":"))]
        assert fixes, f"no sentence says how to fix it: {line!r}"
        # Python reprs and placeholders are not for developers' eyes.
        for leak in ("None", "frozenset", "[]", "{", "}", "['", "']", "(unnamed)"):
            assert leak not in line, f"{leak!r} leaks into {line!r}"
    assert tagged == [r.value for r in rules]


def test_malformed_object_message_golden(golden: Callable[[str, str], None]) -> None:
    bad = pod()
    bad["spec"]["containers"] = {"name": "main"}
    decision = mutate(review(bad), example_policy())
    assert not decision.allowed
    golden("messages/malformed.txt", decision.message)


# --- patches ----------------------------------------------------------------------------


def patch_text(ops: list[dict[str, Any]]) -> str:
    return json.dumps(ops, indent=2) + "\n"


PATCH_CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "pod-limit-only": (pod(container(limits=gpus(2))), None),
    "cronjob-request-only": (cronjob(pod(container(requests=gpus("1")), name="nightly")),
                             None),
    "strip-gpu-toleration": (
        pod(container(), tolerations=[{"key": "dedicated", "operator": "Exists"},
                                      GPU_TOLERATION]), None),
    "neutralize-visible-devices": (
        pod(container("cuda"), container("app", envFrom=[{"configMapRef": {"name": "app"}}],
                                         env=[{"name": "NVIDIA_VISIBLE_DEVICES",
                                               "valueFrom": {"configMapKeyRef": {
                                                   "name": "app", "key": "gpus"}}}]),
            container("train", limits=gpus(1), env=[ALL_GPUS])), None),
    "spot-fault-tolerant-deployment": (
        deployment(pod(labels={"gpu-webhook.dev/fault-tolerant": "true"}, name="sweep")),
        spot_policy()),
    "spot-strip-and-exclude": (
        pod(tolerations=[SPOT_TOLERATION], affinity=required_affinity(
            [expr("topology.kubernetes.io/zone", "z1")],
            [expr("topology.kubernetes.io/zone", "z2")])), spot_policy()),
}


@pytest.mark.parametrize(("name", "case"), PATCH_CASES.items(), ids=list(PATCH_CASES))
def test_patch_matches_golden_file(name: str, case: tuple[dict[str, Any], Any],
                                   golden: Callable[[str, str], None]) -> None:
    manifest, policy = case
    m = mutate_checked(manifest, policy)
    assert m.decision.allowed and m.decision.patch
    golden(f"patches/{name}.json", patch_text(m.decision.patch))


def test_realistic_review_patch_matches_golden_file(admission_review: dict[str, Any],
                                                    golden: Callable[[str, str], None]) -> None:
    m = check_mutation(copy.deepcopy(admission_review))
    assert m.decision.allowed
    golden("patches/replicaset-pod-two-zone-terms.json", patch_text(m.decision.patch))
