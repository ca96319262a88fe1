"""Spot placement rules (policies/examples/spot.yaml and variants): which GPU pods are
sent to spot nodes and how, which are kept off and what happens to their spot
tolerations, what the validating webhook re-checks, and how spot GPUs are charged.

Every mutation runs through ``mutate_checked``: the patch applies, the result is a
valid Kubernetes object, and a second run adds nothing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml
from enginekit import (
    K8S_VERSION,
    container,
    deployment,
    expr,
    gpus,
    job,
    mutate_checked,
    namespace_labels,
    neutralized_only,
    node_terms,
    pod,
    pod_spec,
    required_affinity,
    review,
    spot_policy,
    validated,
)
from kit import policy_yaml

from webhook.admission.webhooks import mutating as mutate
from webhook.engine.charge import charge_of_pod
from webhook.engine.cost import Charge
from webhook.k8s.workloads import read_workload
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import PolicyError, load_text
from webhook.policy.model import Rule
from webhook.quota.entries import Entry, decode, encode
from webhook.quota.store import MemoryStore
from webhook.server.metrics import StateCollector
from webhook.tools.status import Cluster, report

LABEL = "karpenter.sh/capacity-type"
FT = {"gpu-webhook.dev/fault-tolerant": "true"}
NOT_FT = {"gpu-webhook.dev/fault-tolerant": "false"}
SPOT_TOLERATION = {"key": LABEL, "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
ON_SPOT = expr(LABEL, "spot")
OFF_SPOT = expr(LABEL, "spot", op="NotIn")
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def tolerations(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod_spec(obj).get("tolerations") or [])


def spot_exprs(obj: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Per required term, its expressions on the spot label."""
    return [[e for e in t["matchExpressions"] if e["key"] == LABEL] for t in node_terms(obj)]


def policy_text(spot: str, tenant_spot: str = "{placement: allowed}") -> CompiledPolicy:
    return compile_policy(load_text(f"""
apiVersion: gpu-webhook.dev/v1alpha1
kind: GPUPolicy
metadata: {{name: t}}
spec:
  spot: {spot}
  tenants:
    - {{name: research, namespaces: [research], spot: {tenant_spot}}}
""", "spot-variant"))


# --- the providers' presets --------------------------------------------------------------

@pytest.mark.parametrize(("provider", "label", "value", "tainted"), [
    ("gke", "cloud.google.com/gke-spot", "true", True),
    ("karpenter", "karpenter.sh/capacity-type", "spot", False),
    ("eks", "eks.amazonaws.com/capacityType", "SPOT", False),
    ("aks", "kubernetes.azure.com/scalesetpriority", "spot", True),
])
def test_each_provider_preset_marks_its_spot_nodes(provider: str, label: str, value: str,
                                                   tainted: bool) -> None:
    policy = policy_text(f"{{provider: {provider}}}")
    m = mutate_checked(pod(labels=FT), policy)
    assert m.decision.allowed
    assert node_terms(m.patched) == [{"matchExpressions": [expr(label, value)]}]
    spot_tolerations = [t for t in tolerations(m.patched) if t.get("key") == label]
    assert spot_tolerations == ([{"key": label, "operator": "Equal", "value": value,
                                  "effect": "NoSchedule"}] if tainted else [])
    off = mutate_checked(pod(), policy)
    assert node_terms(off.patched) == [{"matchExpressions": [expr(label, value, op="NotIn")]}]


def test_a_custom_label_and_values_replace_the_preset() -> None:
    policy = policy_text("{provider: gke, nodeLabel: cloud.google.com/gke-preemptible, "
                         "values: ['true'], tolerations: []}")
    m = mutate_checked(pod(labels=FT), policy)
    assert node_terms(m.patched) == [
        {"matchExpressions": [expr("cloud.google.com/gke-preemptible", "true")]}]
    assert [t["key"] for t in tolerations(m.patched)] == ["nvidia.com/gpu"]


# --- who is fault tolerant ---------------------------------------------------------------

@pytest.mark.parametrize(("case", "manifest", "policy", "on_spot"), [
    ("label true", pod(labels=FT), spot_policy(), True),
    ("no label", pod(), spot_policy(), False),
    ("priority class", pod(priorityClassName="preemptible-batch"), spot_policy(), True),
    ("other priority class", pod(priorityClassName="serving-critical"), spot_policy(),
     False),
    ("label false beats the priority class",
     pod(labels=NOT_FT, priorityClassName="preemptible-batch"), spot_policy(), False),
    ("tenant default", pod(), policy_text("{provider: karpenter}",
                                          "{placement: allowed, faultTolerant: true}"), True),
    ("label false beats the tenant default", pod(labels=NOT_FT),
     policy_text("{provider: karpenter}", "{placement: allowed, faultTolerant: true}"), False),
    ("annotation", pod(annotations=FT),
     policy_text("{provider: karpenter, faultTolerant: {label: null, "
                 "annotation: gpu-webhook.dev/fault-tolerant}}"), True),
    ("a label the policy does not read", pod(labels=FT),
     policy_text("{provider: karpenter, faultTolerant: {label: null, "
                 "annotation: gpu-webhook.dev/fault-tolerant}}"), False),
], ids=lambda x: x if isinstance(x, str) else "")
def test_who_is_fault_tolerant(case: str, manifest: dict[str, Any], policy: CompiledPolicy,
                               on_spot: bool) -> None:
    m = mutate_checked(manifest, policy)
    assert m.decision.allowed
    assert spot_exprs(m.patched) == [[ON_SPOT if on_spot else OFF_SPOT]]


# --- placement per tenant ----------------------------------------------------------------

def test_a_fault_tolerant_pod_gets_the_toleration_and_required_affinity() -> None:
    m = mutate_checked(pod(labels=FT), spot_policy())
    assert SPOT_TOLERATION in tolerations(m.patched)
    assert spot_exprs(m.patched) == [[ON_SPOT]]
    assert m.decision.mutations[-2:] == ["spot-tolerations", "spot-node-affinity"]


def test_a_legitimate_spot_toleration_is_kept_not_duplicated() -> None:
    own = {"key": LABEL, "operator": "Exists"}
    m = mutate_checked(pod(labels=FT, tolerations=[own]), spot_policy())
    assert own in tolerations(m.patched)
    assert [t for t in tolerations(m.patched) if t.get("key") == LABEL] == [own]
    assert "strip-spot-tolerations" not in m.decision.mutations


def test_spot_is_anded_into_every_term_of_the_pods_own_affinity() -> None:
    zones = required_affinity([expr("topology.kubernetes.io/zone", "z1")],
                              [expr("topology.kubernetes.io/zone", "z2")])
    m = mutate_checked(pod(labels=FT, affinity=zones), spot_policy())
    assert spot_exprs(m.patched) == [[ON_SPOT], [ON_SPOT]]
    off = mutate_checked(pod(affinity=zones), spot_policy())
    assert spot_exprs(off.patched) == [[OFF_SPOT], [OFF_SPOT]]


def test_preferred_affinity_adds_a_weighted_preference_and_no_requirement() -> None:
    policy = policy_text("{provider: karpenter, preferredWeight: 40}",
                         "{placement: allowed, affinity: preferred}")
    m = mutate_checked(pod(labels=FT), policy)
    assert node_terms(m.patched) == []
    na = pod_spec(m.patched)["affinity"]["nodeAffinity"]
    assert na[PREFERRED] == [{"weight": 40, "preference": {"matchExpressions": [ON_SPOT]}}]
    # It may land on either kind of node, so it is charged as on-demand.
    charge = charge_of_pod(m.patched, policy)
    assert charge is not None and charge.spot == 0


def test_an_allowed_pods_own_choice_of_on_demand_is_kept() -> None:
    mine = pod(labels=FT, nodeSelector={LABEL: "on-demand"})
    m = mutate_checked(mine, spot_policy())
    assert m.decision.allowed
    assert node_terms(m.patched) == [] and SPOT_TOLERATION not in tolerations(m.patched)


def test_a_spot_only_tenant_pins_every_gpu_pod_even_when_preferred_is_configured() -> None:
    policy = policy_text("{provider: karpenter, affinity: preferred}", "{placement: required}")
    m = mutate_checked(pod(), policy)
    assert spot_exprs(m.patched) == [[ON_SPOT]]


def test_a_spot_only_tenants_pod_that_rules_spot_out_is_refused() -> None:
    m = mutate_checked(pod(namespace="sweeps", nodeSelector={LABEL: "on-demand"}),
                       spot_policy())
    assert not m.decision.allowed
    assert [f.rule for f in m.decision.findings] == [Rule.SPOT_PLACEMENT]
    assert "rules out spot nodes" in m.decision.message


def test_a_never_tenant_keeps_even_fault_tolerant_pods_off_spot() -> None:
    m = mutate_checked(pod(namespace="serving", labels=FT), spot_policy())
    assert spot_exprs(m.patched) == [[OFF_SPOT]]
    assert SPOT_TOLERATION not in tolerations(m.patched)


def test_a_pod_already_kept_off_spot_is_left_alone() -> None:
    own = required_affinity([expr(LABEL, "on-demand")])
    m = mutate_checked(pod(affinity=own), spot_policy())
    assert spot_exprs(m.patched) == [[expr(LABEL, "on-demand")]]
    assert "spot-excluded" not in m.decision.mutations


def test_a_tolerate_everything_toleration_is_kept_and_affinity_keeps_the_pod_off() -> None:
    everything = {"operator": "Exists"}
    m = mutate_checked(pod(tolerations=[everything]), spot_policy())
    assert everything in tolerations(m.patched)
    assert spot_exprs(m.patched) == [[OFF_SPOT]]


def test_deny_refuses_a_pod_tolerating_spot_without_being_allowed() -> None:
    deny = spot_policy(("podsToleratingSpot: strip", "podsToleratingSpot: deny"))
    m = mutate_checked(pod(tolerations=[{"key": LABEL, "operator": "Exists"}]), deny)
    assert not m.decision.allowed and m.decision.patch == []
    assert "tolerates the spot nodes' taint" in m.decision.message


def test_warn_mode_warns_and_leaves_the_pods_own_choice() -> None:
    warn = spot_policy(("  tenants:\n", "  rules: {spot-placement: {mode: warn}}\n"
                        "  tenants:\n"))
    m = mutate_checked(pod(namespace="serving", nodeSelector={LABEL: "spot"}), warn)
    assert m.decision.allowed and m.decision.warnings
    assert "spot-excluded" not in m.decision.mutations


def test_non_gpu_pods_are_not_touched_by_spot_rules() -> None:
    m = mutate_checked(pod(container(limits={"cpu": "1"}),
                           tolerations=[{"key": LABEL, "operator": "Exists"}]), spot_policy())
    assert neutralized_only(m.decision.patch)


# --- workload templates ------------------------------------------------------------------

def test_deployment_and_job_templates_go_through_the_same_rules() -> None:
    d = mutate_checked(deployment(pod(labels=FT)), spot_policy())
    assert spot_exprs(d.patched) == [[ON_SPOT]]
    assert SPOT_TOLERATION in tolerations(d.patched)
    j = mutate_checked(job(pod(tolerations=[{"key": LABEL, "operator": "Exists"}])),
                       spot_policy())
    assert spot_exprs(j.patched) == [[OFF_SPOT]]
    assert all(t.get("key") != LABEL for t in tolerations(j.patched))


# --- the validating webhook re-checks the final pod ------------------------------------

@pytest.mark.parametrize(("case", "manifest", "says"), [
    ("not fault tolerant, not kept off", pod(), "may be scheduled on spot nodes"),
    ("not fault tolerant, tolerating", pod(
        tolerations=[{"key": LABEL, "operator": "Exists"}],
        affinity=required_affinity([OFF_SPOT])), "tolerates the spot nodes' taint"),
    ("never tenant, pinned to spot", pod(namespace="serving", nodeSelector={LABEL: "spot"}),
     "asks for spot nodes"),
    ("spot-only tenant, not pinned", pod(namespace="sweeps"), "other than spot ones"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_validating_refuses_a_pod_the_mutating_webhook_did_not_place(
        case: str, manifest: dict[str, Any], says: str) -> None:
    d = validated(manifest, spot_policy())
    assert not d.allowed and says in d.message
    assert [f.rule for f in d.findings] == [Rule.SPOT_PLACEMENT]


@pytest.mark.parametrize("manifest", [
    pod(labels=FT), pod(), pod(namespace="sweeps"), pod(namespace="serving", labels=FT),
    deployment(pod(labels=FT)), job(pod()),
], ids=["fault-tolerant", "other", "spot-only", "never", "deployment", "job"])
def test_what_the_mutating_webhook_makes_the_validating_webhook_admits(
        manifest: dict[str, Any]) -> None:
    m = mutate_checked(manifest, spot_policy())
    d = validated(m.patched, spot_policy())
    assert d.allowed, d.message


# --- quota ---------------------------------------------------------------------------

def test_spot_gpus_count_in_full_against_the_spot_cap_and_weighted_elsewhere() -> None:
    m = mutate_checked(pod(container(limits=gpus(4)), namespace="sweeps"), spot_policy())
    charge = charge_of_pod(m.patched, spot_policy())
    assert charge is not None
    assert (charge.gpus, charge.spot) == (2.0, 4.0)  # weight 0.5
    research = mutate_checked(pod(container(limits=gpus(2)), labels=FT), spot_policy())
    c2 = charge_of_pod(research.patched, spot_policy())
    assert c2 is not None and (c2.gpus, c2.spot) == (2.0, 2.0)
    off = mutate_checked(pod(container(limits=gpus(2))), spot_policy())
    c3 = charge_of_pod(off.patched, spot_policy())
    assert c3 is not None and c3.spot == 0


def test_a_spot_reservation_survives_the_shared_ledger() -> None:
    charge = Charge("sweeps", "sweeps", "pod/a", None, {"nvidia.com/gpu": 4.0}, 2.0, spot=4.0)
    data = encode({"uid-a": Entry(charge, time.time() + 30, "sweeps/a")})
    (entry,) = decode("sweeps", data).values()
    assert entry.charge.spot == 4.0 and entry.charge.gpus == 2.0


def test_status_and_metrics_show_the_spot_cap() -> None:
    policy = spot_policy()
    m = mutate_checked(pod(container(limits=gpus(6)), namespace="sweeps"), policy)
    running = dict(m.patched, metadata=dict(m.patched["metadata"], uid="uid-a"),
                   status={"phase": "Running"})
    r = report(policy, Cluster(pods=[running]), tenant="sweeps")
    rows = {x.cap: (x.used, x.limit, x.free) for x in r.rows}
    assert rows["spot"] == (6.0, 16.0, 10.0)
    assert rows["gpus"] == (3.0, 8.0, 5.0)

    store = MemoryStore()
    charge = charge_of_pod(running, policy)
    assert charge is not None
    asyncio.run(store.reserve("uid-a", charge, lambda _: True))
    series = {(s.name, s.labels["tenant"], s.labels["name"]): s.value
              for family in StateCollector(store, lambda: policy).collect()
              for s in family.samples
              if s.name in ("gpu_webhook_quota_used", "gpu_webhook_quota_limit")}
    assert series[("gpu_webhook_quota_used", "sweeps", "spot")] == 6.0
    assert series[("gpu_webhook_quota_limit", "sweeps", "spot")] == 16.0


# --- the policy's own checks ------------------------------------------------------------

@pytest.mark.parametrize(("text", "says"), [
    ("  spot: {values: [spot]}\n  tenants: []\n", "give `provider`"),
    ("  tenants:\n    - {name: a, namespaces: [a], spot: {placement: allowed}}\n",
     "spot settings need spec.spot"),
    ("  spot: {provider: azure}\n  tenants: []\n", "provider"),
    ("  spot: {provider: aks}\n  tenants:\n    - {name: a, namespaces: [a], "
     "spot: {weight: 0}}\n", "weight"),
    ("  spot: {provider: aks}\n  tolerations:\n    - {key: kubernetes.azure.com/scalesetpriority, "
     "operator: Exists}\n  tenants: []\n", "move it to spec.spot.tolerations"),
])
def test_a_spot_mistake_is_named(text: str, says: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_text("apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\n"
                  "metadata: {name: t}\nspec:\n" + text, "p.yaml")
    assert says in str(err.value)



@pytest.mark.parametrize(("namespace", "want"), [("sweeps", ON_SPOT), ("research", OFF_SPOT)])
def test_a_training_jobs_every_gpu_template_is_placed_as_a_pod_is(namespace: str,
                                                                  want: dict[str, Any]) -> None:
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "workloads" / \
        "pytorchjob-mnist-nccl.yaml"
    job_obj = next(d for d in yaml.safe_load_all(fixture.read_text()) if d)
    job_obj["metadata"]["namespace"] = namespace
    # A custom resource: each template is checked as a PodTemplate (the Kubernetes schema
    # has no PyTorchJob), the patch must apply and a second run must add nothing.
    decision = mutate(review(job_obj), spot_policy(), namespace_labels)
    assert decision.allowed, decision.message
    patched = jsonpatch.apply_patch(job_obj, decision.patch, in_place=False)
    assert mutate(review(patched), spot_policy(), namespace_labels).patch == []
    w = read_workload("kubeflow.org", "PyTorchJob", patched)
    assert w is not None
    for r in w.roles:
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
             "template": r.template.holder}, K8S_VERSION, strict=True)
    gpu_roles = [r for r in w.roles if "nvidia.com/gpu" in str(r.template.spec)]
    assert gpu_roles
    for r in gpu_roles:
        terms = r.template.spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert [[e for e in t["matchExpressions"] if e["key"] == LABEL] for t in terms] == [
            [want]]
    assert validated(patched, spot_policy()).allowed


def test_gpu_pods_of_no_tenant_follow_the_policys_default_placement() -> None:
    policy = compile_policy(load_text(policy_yaml("t", """\
  unassignedNamespaces: allow
  spot: {provider: eks}
  tenants: [{name: research, namespaces: [research]}]
"""), "p.yaml"))
    m = mutate_checked(pod(namespace="sandbox", nodeSelector={
        "eks.amazonaws.com/capacityType": "SPOT"}), policy)
    assert not m.decision.allowed
    assert "GPU pods of no tenant may not use spot capacity" in m.decision.message
