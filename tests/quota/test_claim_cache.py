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
