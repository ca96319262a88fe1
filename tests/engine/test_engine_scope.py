"""Which requests the engine acts on and how: workload kinds and their template paths,
operations and kinds it skips, exemptions, tenants (by name, by namespace labels, none),
non-GPU pods, enforcement modes and malformed objects.

Mutation cases run through ``mutate_checked``: the patch applies, the result is a valid
Kubernetes object and a second run changes nothing.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
import pytest
from enginekit import (
    GPU,
    GPU_TOLERATION,
    H100,
    K8S_VERSION,
    L4,
    PRODUCT_LABEL,
    RACK_LABEL,
    VOID_ENTRY,
    check_mutation,
    container,
    cronjob,
    deployment,
    example_policy,
    example_variant,
    expr,
    gpus,
    gpus_charged,
    job,
    mutate_checked,
    namespace_labels,
    neutralized_only,
    node_terms,
    pod,
    pod_spec,
    review,
    validated,
)
from kit import validating

from webhook.admission.webhooks import mutating as mutate
from webhook.engine.target import no_labels
from webhook.k8s.review import parse_review, request_review
from webhook.policy.model import Mode, Rule

EXEMPTING = example_variant((
    "    serviceAccounts: [gpu-operator/nvidia-device-plugin]",
    "    serviceAccounts: [gpu-operator/nvidia-device-plugin, ci/image-builder]\n"
    "    users: [alice@example.com]",
))
UNASSIGNED_ALLOWED = example_variant(
    ("unassignedNamespaces: deny", "unassignedNamespaces: allow"))
AUDIT_NOTEBOOKS = example_variant(("mode: warn ", "mode: audit "))


def toleration_policy(choice: str) -> Any:
    return example_variant(("nonGpuPodsToleratingGpuTaints: strip",
                            f"nonGpuPodsToleratingGpuTaints: {choice}"))


# --- workloads ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wrap", "spec_pointer"),
    [
        pytest.param(lambda p: p, "/spec", id="Pod"),
        pytest.param(deployment, "/spec/template/spec", id="Deployment"),
        pytest.param(job, "/spec/template/spec", id="Job"),
        pytest.param(cronjob, "/spec/jobTemplate/spec/template/spec", id="CronJob"),
    ],
)
def test_workload_templates_are_mutated_at_their_own_path(wrap: Any, spec_pointer: str) -> None:
    obj = wrap(pod(container(limits=gpus(2))))
    m = mutate_checked(obj)
    assert m.decision.allowed, m.decision.message
    template_pointer = spec_pointer.removesuffix("/spec")
    for path in m.paths:
        assert path.startswith((spec_pointer + "/", template_pointer + "/metadata")), path
    spec = pod_spec(m.patched)
    assert spec["containers"][0]["resources"]["requests"] == {GPU: 2}
    assert spec["tolerations"] == [GPU_TOLERATION]
    assert node_terms(m.patched) == [{"matchExpressions": [
        expr(PRODUCT_LABEL, "NVIDIA-A100-SXM4-80GB"), expr(RACK_LABEL, "rack-a", "rack-b")]}]
    assert validated(m.patched).allowed


def test_workload_denial_names_the_workload_and_its_template() -> None:
    m = mutate_checked(job(pod(container(requests=gpus(1), limits=gpus(2)), name="bert")))
    assert not m.decision.allowed
    assert m.decision.message.startswith(
        'job research/bert, pod template, container "main": nvidia.com/gpu request 1')


def test_deployment_update_is_checked_too() -> None:
    m = mutate_checked(deployment(pod(container(limits=gpus(1)))), operation="UPDATE")
    assert m.decision.allowed
    assert "/spec/template/spec/tolerations" in m.paths


# --- what is skipped ------------------------------------------------------------------


def configmap() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": "research"},
            "data": {"nvidia.com/gpu": "8"}}


@pytest.mark.parametrize(
    ("manifest", "operation", "skipped"),
    [
        pytest.param(pod(), "UPDATE", "operation", id="pod UPDATE: resources are immutable"),
        pytest.param(pod(), "DELETE", "operation", id="pod DELETE"),
        pytest.param(deployment(pod()), "DELETE", "operation", id="deployment DELETE"),
        pytest.param(configmap(), "CREATE", "kind", id="ConfigMap CREATE"),
        pytest.param(configmap(), "UPDATE", "kind", id="ConfigMap UPDATE"),
    ],
)
def test_operations_and_kinds_the_webhook_does_not_act_on(manifest: dict[str, Any],
                                                          operation: str, skipped: str) -> None:
    payload = request_review(copy.deepcopy(manifest), operation=operation)
    if operation == "DELETE":
        # The API server sends the object being deleted as oldObject, and no object.
        payload["request"]["oldObject"] = payload["request"]["object"]
        payload["request"]["object"] = None
    for run in (mutate, validating):
        d = run(parse_review(orjson.dumps(payload)), example_policy(), namespace_labels)
        assert d.allowed and d.patch == [] and d.findings == []
        assert d.skipped == skipped


@pytest.mark.parametrize(
    ("namespace", "username"),
    [
        pytest.param("kube-system", "developer", id="exempt namespace"),
        pytest.param("research", "alice@example.com", id="exempt user"),
        pytest.param("research", "system:serviceaccount:ci:image-builder",
                     id="exempt service account"),
    ],
)
def test_exempt_requests_pass_untouched(namespace: str, username: str) -> None:
    # Even a pod that breaks every rule: the exemption is the platform team's choice.
    bad = pod(container(requests=gpus(3), limits=gpus("500m")), namespace=namespace,
              nodeSelector={PRODUCT_LABEL: L4})
    m = mutate_checked(bad, EXEMPTING, username=username)
    assert m.decision.allowed and m.decision.patch == [] and m.decision.skipped == "exempt"
    v = validated(bad, EXEMPTING, username=username)
    assert v.allowed and v.skipped == "exempt"


def test_service_account_exemption_is_for_that_account_only() -> None:
    m = mutate_checked(pod(), EXEMPTING, username="system:serviceaccount:ci:other")
    assert m.decision.skipped is None
    assert m.decision.patch != []


# --- tenants --------------------------------------------------------------------------


def test_namespace_in_no_tenant_is_denied() -> None:
    m = mutate_checked(pod(namespace="sandbox"))
    d = m.decision
    assert not d.allowed
    assert [f.rule for f in d.findings] == [Rule.TENANT_REQUIRED]
    assert 'namespace "sandbox" belongs to no GPU tenant' in d.message
    assert "[rule tenant-required, policy shared-gpu-cluster]" in d.message
    assert not validated(pod(namespace="sandbox")).allowed


def test_unassigned_namespace_allowed_gets_only_tolerations_and_requests() -> None:
    m = mutate_checked(pod(namespace="sandbox"), UNASSIGNED_ALLOWED)
    assert m.decision.allowed, m.decision.message
    assert m.decision.tenant is None
    spec = m.patched["spec"]
    assert spec["tolerations"] == [GPU_TOLERATION]
    assert "affinity" not in spec  # no tenant, so no product or rack to pin to
    assert validated(m.patched, UNASSIGNED_ALLOWED).allowed


@pytest.mark.parametrize(
    ("labels", "tenant", "allowed"),
    [
        pytest.param(namespace_labels, "inference", True, id="selector matches"),
        pytest.param(no_labels, None, False, id="labels unknown: no tenant"),
    ],
)
def test_tenant_chosen_by_namespace_labels(labels: Any, tenant: str | None,
                                           allowed: bool) -> None:
    m = mutate_checked(pod(namespace="serving"), labels=labels)
    assert m.decision.tenant == tenant
    assert m.decision.allowed is allowed
    if allowed:
        # inference: its only product, no default needed, and no topology.
        assert node_terms(m.patched) == [{"matchExpressions": [expr(PRODUCT_LABEL, L4)]}]
        assert validated(m.patched, labels=labels).allowed


# --- pods without GPUs ----------------------------------------------------------------


def test_pod_without_gpus_passes_untouched() -> None:
    plain = pod(container(requests={"cpu": "1"}, limits={"memory": "1Gi"}),
                tolerations=[{"key": "dedicated", "operator": "Exists"}])
    # Untouched but for NVIDIA_VISIBLE_DEVICES=void: it is given no GPU (engine.routes).
    m = mutate_checked(plain)
    assert m.decision.allowed and neutralized_only(m.decision.patch)
    assert m.decision.findings == []
    assert validated(plain).allowed


@pytest.mark.parametrize(
    ("choice", "allowed", "tolerations_after"),
    [
        pytest.param("strip", True, [{"key": "dedicated", "operator": "Exists"}],
                     id="strip: the GPU toleration is removed"),
        pytest.param("deny", False, [GPU_TOLERATION, {"key": "dedicated", "operator": "Exists"}],
                     id="deny"),
        pytest.param("allow", True,
                     [GPU_TOLERATION, {"key": "dedicated", "operator": "Exists"}], id="allow"),
    ],
)
def test_pod_without_gpus_tolerating_the_gpu_taint(choice: str, allowed: bool,
                                                   tolerations_after: list[Any]) -> None:
    policy = toleration_policy(choice)
    p = pod(container(requests={"cpu": "1"}),
            tolerations=[GPU_TOLERATION, {"key": "dedicated", "operator": "Exists"}])
    m = mutate_checked(p, policy)
    assert m.decision.allowed is allowed
    assert m.patched["spec"]["tolerations"] == tolerations_after
    if choice == "strip":
        assert m.decision.mutations == ["strip-gpu-tolerations", "gpu-visible-devices"]
    if choice == "deny":
        assert [f.rule for f in m.decision.findings] == [Rule.NON_GPU_TOLERATIONS]
        assert "requests no GPU but tolerates the GPU nodes' taint (nvidia.com/gpu)" in \
            m.decision.message
    # The validating webhook holds the line if the mutating one was bypassed.
    assert validated(p, policy).allowed is (choice != "deny")


def test_tolerate_everything_is_not_stripped_from_non_gpu_pods() -> None:
    p = pod(container(), tolerations=[{"operator": "Exists"}])
    m = mutate_checked(p)
    assert m.patched["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert neutralized_only(m.decision.patch)


# --- modes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "mode", "warnings"),
    [
        pytest.param(example_policy(), Mode.WARN, 1, id="warn: allowed, kubectl shows why"),
        pytest.param(AUDIT_NOTEBOOKS, Mode.AUDIT, 0, id="audit: allowed, recorded only"),
    ],
)
def test_rollout_modes_allow_and_report(policy: Any, mode: Mode, warnings: int) -> None:
    # The notebooks tenant may use MIG slices only, and only a100.
    p = pod(container(limits=gpus(1)), namespace="notebooks",
            labels={"gpu.example.com/product": "h100"})
    m = mutate_checked(p, policy)
    d = m.decision
    assert d.allowed and d.message == ""
    assert [(f.rule, f.mode) for f in d.findings] == [
        (Rule.ALLOWED_RESOURCES, mode), (Rule.ALLOWED_PRODUCTS, mode)]
    assert len(d.warnings) == 2 * warnings
    assert d.outcome == ("warned" if warnings else "audited")
    if warnings:
        assert d.warnings[0].startswith('pod notebooks/trainer, container "main": '
                                        "nvidia.com/gpu is not a GPU resource tenant notebooks")
    # The pod is completed and tolerated, but not pinned against what it asked for.
    assert m.patched["spec"]["tolerations"] == [GPU_TOLERATION]
    assert node_terms(m.patched) == []
    # A finding is reported once, by the webhook that owns the rule.
    v = validated(m.patched, policy)
    assert v.allowed and v.warnings == []


def test_warn_mode_still_pins_what_does_not_conflict() -> None:
    m = mutate_checked(pod(container(limits=gpus(1, "nvidia.com/mig-1g.10gb")),
                           namespace="notebooks", labels={"gpu.example.com/product": "a100"}))
    assert m.decision.allowed and m.decision.warnings == []
    assert node_terms(m.patched) == [{"matchExpressions": [
        expr(PRODUCT_LABEL, "NVIDIA-A100-SXM4-80GB")]}]


# --- malformed objects ----------------------------------------------------------------


BOTH = (mutate, validating)


@pytest.mark.parametrize(
    ("spec_edit", "pointer", "phases"),
    [
        pytest.param({"containers": {"name": "main"}}, "/spec/containers must be a list", BOTH,
                     id="containers not a list"),
        pytest.param({"containers": ["main"]}, "/spec/containers/0 must be a container mapping",
                     BOTH, id="container not a mapping"),
        pytest.param({"containers": [{"name": "main", "resources": {"limits": [GPU]}}]},
                     "/spec/containers/0/resources/limits must be a mapping", BOTH,
                     id="limits not a mapping"),
        pytest.param({"containers": [container(limits=gpus(1))], "tolerations": "all"},
                     # Only the mutating webhook reads a GPU pod's tolerations.
                     "/spec/tolerations must be a list", (mutate,),
                     id="tolerations not a list"),
        pytest.param({"containers": [container(limits=gpus(1))],
                      "affinity": {"nodeAffinity": []}},
                     "/spec/affinity/nodeAffinity must be a mapping", BOTH,
                     id="nodeAffinity not a mapping"),
    ],
)
def test_malformed_object_is_denied_with_the_place_to_fix(spec_edit: dict[str, Any],
                                                          pointer: str, phases: Any) -> None:
    bad = pod()
    bad["spec"] = spec_edit
    for run in phases:
        d = run(review(bad), example_policy(), namespace_labels)
        assert not d.allowed
        assert d.patch == []
        # Said once, where to fix it and what it must be (not "X must be X must be ...").
        assert d.message == f"pod research/trainer: the object is malformed: {pointer}."


def test_malformed_template_of_a_workload() -> None:
    bad = deployment(pod())
    bad["spec"]["template"] = ["not", "a", "template"]
    d = mutate(review(bad), example_policy(), namespace_labels)
    assert not d.allowed
    assert "/spec/template must be a mapping" in d.message


# --- the realistic review -------------------------------------------------------------


def test_realistic_review_from_a_replicaset(admission_review: dict[str, Any]) -> None:
    m = check_mutation(admission_review)
    d = m.decision
    assert d.allowed, d.message
    spec = m.patched["spec"]
    trainer, metrics = spec["containers"]
    assert trainer["resources"]["requests"] == {"cpu": "16", "memory": "128Gi", GPU: "4"}
    # The containers given no GPU only get NVIDIA_VISIBLE_DEVICES=void.
    assert metrics == {**m.original["spec"]["containers"][1],
                       "env": [*m.original["spec"]["containers"][1].get("env", []),
                               VOID_ENTRY]}
    assert spec["initContainers"] == [
        {**c, "env": [*c.get("env", []), VOID_ENTRY]}
        for c in m.original["spec"]["initContainers"]]
    # The API server's default tolerations stay; the GPU one joins them.
    assert spec["tolerations"] == [*m.original["spec"]["tolerations"], GPU_TOLERATION]
    # Both zone terms keep their zone and gain the asked product and the tenant's racks.
    pinned = [expr(PRODUCT_LABEL, H100), expr(RACK_LABEL, "rack-a", "rack-b")]
    assert node_terms(m.patched) == [
        {"matchExpressions": [expr("topology.kubernetes.io/zone", "eu-west-1a"), *pinned]},
        {"matchExpressions": [expr("topology.kubernetes.io/zone", "eu-west-1b"), *pinned]},
    ]
    assert m.patched["metadata"]["annotations"] == {
        "kubectl.kubernetes.io/default-container": "trainer",
        "gpu-webhook.dev/mutated":
            "gpu-requests,gpu-tolerations,gpu-node-affinity,gpu-visible-devices",
    }
    # Then the validating webhook sees the final object and admits it.
    final = copy.deepcopy(admission_review)
    final["request"]["object"] = m.patched
    v = validating(parse_review(orjson.dumps(final)), example_policy(), namespace_labels)
    assert v.allowed and v.patch == [] and gpus_charged(m.patched) == 4


def test_realistic_review_with_patch_applied_by_jsonpatch(
        admission_review: dict[str, Any]) -> None:
    """The patch is applied to the object exactly as received, as the API server does."""
    raw = orjson.dumps(admission_review)
    d = mutate(parse_review(raw), example_policy(), namespace_labels)
    obj = jsonpatch.apply_patch(orjson.loads(raw)["request"]["object"], d.patch)
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert obj["metadata"]["managedFields"] == admission_review["request"]["object"][
        "metadata"]["managedFields"]
