"""The watch-fed cache of DRA claims and templates: what a pod names is found without an
API call, and a claim its pod was not charged for is charged once, until deleted."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.k8s.claims import CLAIM, TEMPLATE
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_file
from webhook.quota.claims import ClaimCache

POLICY = compile_policy(load_file("policies/multi-tenant.yaml"))
A100 = ("device.attributes['gpu.nvidia.com'].productName.replace(' ', '-') "
        "in ['NVIDIA-A100-SXM4-80GB']")


def claim(name: str, uid: str, count: int = 2, *, kind: str = CLAIM,
          annotations: dict[str, str] | None = None, managers: tuple[str, ...] = ("kubectl",)
          ) -> dict[str, Any]:
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": count,
        "selectors": [{"cel": {"expression": A100}}]}}]}}
    meta: dict[str, Any] = {"name": name, "namespace": "research", "uid": uid,
                            "managedFields": [{"manager": m, "operation": "Update"}
                                              for m in managers]}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta,
            "spec": spec if kind == CLAIM else {"spec": spec}}


def cache() -> ClaimCache:
    return ClaimCache(lambda: POLICY, lambda ns: None)


def test_a_shared_claim_is_charged_under_its_uid_until_deleted() -> None:
    c = cache()
    [(uid, charge)] = c.event(CLAIM, "ADDED", claim("shared", "u1"))
    assert uid == "u1" and charge is not None
    assert (charge.tenant, charge.gpus, charge.product, charge.pods) == ("research", 2.0,
                                                                         "a100", 0)
    assert c.lookup(CLAIM, "research", "shared") is not None
    assert c.event(CLAIM, "DELETED", claim("shared", "u1")) == [("u1", None)]
    assert c.lookup(CLAIM, "research", "shared") is None


def test_templates_are_found_and_never_charged() -> None:
    c = cache()
    assert c.event(TEMPLATE, "ADDED", claim("one-gpu", "t1", kind=TEMPLATE)) == []
    assert c.lookup(TEMPLATE, "research", "one-gpu") is not None


@pytest.mark.parametrize(("annotation", "managers", "charged"), [
    # Made from a template for one pod by the resourceclaim controller; the scheduler
    # writes its allocation: the pod holds the charge.
    ("resource.kubernetes.io/pod-claim-name", ("kube-controller-manager", "kube-scheduler"),
     False),
    # The scheduler's claim for a plain nvidia.com/gpu request.
    ("resource.kubernetes.io/extended-resource-claim", ("kube-scheduler",), False),
    # The same annotations written by a user: charged.
    ("resource.kubernetes.io/pod-claim-name", ("kubectl-client-side-apply",), True),
    ("resource.kubernetes.io/extended-resource-claim", ("kubectl", "kube-scheduler"), True),
    (None, ("kube-controller-manager",), True),
])
def test_claims_made_for_a_pod_are_told_by_annotation_and_writer(
        annotation: str | None, managers: tuple[str, ...], charged: bool) -> None:
    c = cache()
    obj = claim("c", "u1", annotations={annotation: "x"} if annotation else None,
                managers=managers)
    assert bool(c.event(CLAIM, "ADDED", obj)) is charged


def test_a_relist_drops_the_kinds_objects_and_their_charges() -> None:
    c = cache()
    c.event(CLAIM, "ADDED", claim("a", "u1"))
    c.event(TEMPLATE, "ADDED", claim("t", "t1", kind=TEMPLATE))
    c.event(CLAIM, "SYNCED", {})
    assert not c.ready()
    c.event(TEMPLATE, "SYNCED", {})
    assert c.ready()
    assert c.event(CLAIM, "RESET", {}) == [("u1", None)]
    assert c.lookup(CLAIM, "research", "a") is None
    assert c.lookup(TEMPLATE, "research", "t") is not None


# --- in the cluster's usage (ClusterState), beside the pods --------------------------

from webhook.quota.cache import ClusterState  # noqa: E402


def gpu_pod(name: str, uid: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "research", "uid": uid},
            "spec": {"containers": [{"name": "main", "image": "x",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "affinity": {"nodeAffinity": {
                         "requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [{
                                 "key": "topology.example.com/gpu-rack", "operator": "In",
                                 "values": ["rack-a"]}]}]}}}}}


def state() -> ClusterState:
    s = ClusterState(lambda: POLICY)
    s.watch_claims()
    return s


def test_claims_and_template_pods_count_in_the_clusters_usage() -> None:
    s = state()
    s.claim_event(TEMPLATE)("ADDED", claim("two", "t1", kind=TEMPLATE))
    s.claim_event(CLAIM)("ADDED", claim("shared", "c1", count=3))
    s.pod_event("ADDED", gpu_pod("p", "p1", "two"))
    assert s.pods.tenant("research").gpus == 5  # 3 (the claim) + 2 (the pod's template)
    assert s.pods.tenant("research").pods == 1  # the claim is not a pod
    assert s.seen("c1")  # a reservation for the claim resolves once it is seen
    s.claim_event(CLAIM)("DELETED", claim("shared", "c1", count=3))
    assert s.pods.tenant("research").gpus == 2


def test_a_pods_relist_keeps_the_claims_charges() -> None:
    s = state()
    s.claim_event(CLAIM)("ADDED", claim("shared", "c1", count=3))
    s.pod_event("SYNCED", {})
    s.pod_event("RESET", {})
    s.pod_event("SYNCED", {})
    assert s.pods.tenant("research").gpus == 3


def test_a_kind_the_api_server_does_not_serve_leaves_the_replica_ready() -> None:
    now = [0.0]
    s = ClusterState(lambda: POLICY, clock=lambda: now[0])
    s.watch_claims()
    for handler in (s.pod_event, s.namespace_event):
        handler("SYNCED", {})
    s.claim_event(CLAIM)("ABSENT", {})
    s.claim_event(TEMPLATE)("ABSENT", {})
    assert s.synced()
    now[0] += 1000  # long after: the pods' watch has shown nothing, the absent ones never will
    for handler in (s.pod_event, s.namespace_event):
        handler("PROGRESS", {})
    assert s.synced()


def test_pods_listed_before_their_templates_are_counted_again() -> None:
    s = state()
    resyncs: list[int] = []
    s.on_templates_synced = lambda: resyncs.append(1)
    s.pod_event("ADDED", gpu_pod("p", "p1", "two"))
    s.pod_event("SYNCED", {})
    s.claim_event(TEMPLATE)("ADDED", claim("two", "t1", kind=TEMPLATE))
    s.claim_event(TEMPLATE)("SYNCED", {})
    assert resyncs == [1]


# --- PodGroup claims (the core gang API, gate DRAWorkloadResourceClaims) -------------

from webhook.k8s import podgroups  # noqa: E402

GROUP_OWNER = [{"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                "name": "train", "uid": "g1", "controller": True}]


def group(claims: list[dict[str, str]]) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": "research", "uid": "g1"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 2}},
                     "resourceClaims": claims}}


def member(name: str, uid: str, template: str) -> dict[str, Any]:
    obj = gpu_pod(name, uid, template)
    obj["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    return obj


def test_the_claim_made_for_a_podgroup_is_charged_once_as_a_shared_claim() -> None:
    # The resourceclaim controller makes one claim for the whole group from the template,
    # with the annotation it puts on a pod's claim, owned by the PodGroup.
    obj = claim("train-gpu-x", "c1", annotations={
        "resource.kubernetes.io/pod-claim-name": "gpu"},
        managers=("kube-controller-manager", "kube-scheduler"))
    obj["metadata"]["ownerReferences"] = GROUP_OWNER
    [(uid, charge)] = cache().event(CLAIM, "ADDED", obj)
    assert uid == "c1" and charge is not None and charge.gpus == 2


def test_pods_sharing_their_podgroups_claim_are_not_charged_its_devices_each() -> None:
    s = state()
    s.watch_claims(groups=True)
    s.claim_event(TEMPLATE)("ADDED", claim("two", "t1", kind=TEMPLATE))
    s.claim_event(podgroups.KIND)("ADDED", group([
        {"name": "gpu", "resourceClaimTemplateName": "two"}]))
    for i in range(2):
        s.pod_event("ADDED", member(f"p{i}", f"p{i}", "two"))
    assert s.pods.tenant("research").gpus == 0  # the group's claim holds the GPUs
    assert s.pods.tenant("research").pods == 0  # pods without GPUs of their own
    made = claim("train-gpu-x", "c1", annotations={
        "resource.kubernetes.io/pod-claim-name": "gpu"}, managers=("kube-controller-manager",))
    made["metadata"]["ownerReferences"] = GROUP_OWNER
    s.claim_event(CLAIM)("ADDED", made)
    assert s.pods.tenant("research").gpus == 2  # once, for the two pods


@pytest.mark.parametrize("entry", [
    {"name": "other", "resourceClaimTemplateName": "two"},  # another name
    {"name": "gpu", "resourceClaimTemplateName": "one"},  # another template
])
def test_a_pods_own_template_claim_is_charged_even_in_a_podgroup_with_claims(
        entry: dict[str, str]) -> None:
    s = state()
    s.watch_claims(groups=True)
    s.claim_event(TEMPLATE)("ADDED", claim("two", "t1", kind=TEMPLATE))
    s.claim_event(podgroups.KIND)("ADDED", group([entry]))
    s.pod_event("ADDED", member("p0", "p0", "two"))
    assert s.pods.tenant("research").gpus == 2


def test_pods_seen_before_their_podgroup_are_counted_again_when_it_arrives() -> None:
    s = state()
    s.watch_claims(groups=True)
    recounts: list[int] = []
    s.on_relabel = lambda: recounts.append(1)
    s.claim_event(TEMPLATE)("ADDED", claim("two", "t1", kind=TEMPLATE))
    s.pod_event("ADDED", member("p0", "p0", "two"))
    assert s.pods.tenant("research").gpus == 2  # its template's claim, as far as known
    s.claim_event(podgroups.KIND)("ADDED", group([
        {"name": "gpu", "resourceClaimTemplateName": "two"}]))
    assert recounts == [1]
