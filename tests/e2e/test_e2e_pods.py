"""GPU pods applied with kubectl through the real API server: what a developer sees.

The mutating webhook completes GPU requests and limits, adds the GPU nodes' toleration
and pins the pod to its tenant's product and racks; when it refuses, kubectl prints the
API server's own prefix followed by our message.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import (
    GPU_TOLERATION,
    MUTATED_ANNOTATION,
    Deployment,
    NamespaceFactory,
    absent,
    apply,
    assert_denied,
    assert_refused_at_create,
    assert_succeeded,
    create_namespace,
    get,
    gpu_pod,
)

pytestmark = pytest.mark.e2e

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
PRODUCT_LABEL, RACK_LABEL = "nvidia.com/gpu.product", "topology.example.com/gpu-rack"


def gpu_resources(pod: dict[str, Any]) -> dict[str, Any]:
    res = pod["spec"]["containers"][0]["resources"]
    return {k: res.get(k, {}).get("nvidia.com/gpu") for k in ("requests", "limits")}


def required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    terms: list[dict[str, Any]] = affinity["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    return terms


def requirement(term: dict[str, Any], key: str) -> dict[str, Any] | None:
    return next((e for e in term.get("matchExpressions", []) if e["key"] == key), None)


@pytest.mark.parametrize(("limits", "requests"), [("2", None), (None, "2"), (2, None)],
                         ids=["limits-only", "requests-only", "integer-limit"])
def test_gpu_request_and_limit_are_completed(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
    limits: Any, requests: Any,
) -> None:
    ns = namespace("research")
    out = apply(control_plane, ns, gpu_pod("train", limits=limits, requests=requests))
    assert_succeeded(out, "pod/train created")

    stored = get(control_plane, ns, "pod", "train")
    assert gpu_resources(stored) == {"requests": "2", "limits": "2"}


@pytest.mark.parametrize(("limits", "requests", "message"), [
    ("2", "1", 'container "train": nvidia.com/gpu request 1 differs from limit 2. GPU requests '
               "must equal limits: set both to 2, or drop the request (it defaults to the "
               "limit). [rule gpu-requests-match-limits, tenant research]"),
    # 0.5 in the manifest reaches the webhook as "500m": named as the number, as offline.
    *((half, None, "container \"train\": nvidia.com/gpu limit 0.5 is not a whole number. "
                   'GPUs are whole devices: ask for a whole number of 1 or more, e.g. "1" '
                   "(or remove it, or write 0, for no GPU). "
                   "[rule gpu-whole-number, tenant research]") for half in ("500m", 0.5)),
], ids=["request-differs-from-limit", "fractional-500m", "fractional-0.5"])
def test_unusable_gpu_quantities_are_refused_with_our_message(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
    limits: str, requests: str | None, message: str,
) -> None:
    ns = namespace("research")
    out = apply(control_plane, ns, gpu_pod("bad", limits=limits, requests=requests))

    assert_refused_at_create(out, webhook.mutating, f"pod {ns}/bad, " + message)
    assert absent(control_plane, ns, "pod", "bad")


def test_toleration_affinity_and_provenance_on_the_stored_pod(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("research")
    # Two ORed terms of the developer's own: every one must gain the tenant's
    # requirements, and no term may be appended (that would widen the placement).
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["big"]}]},
        ]}}}
    pod = gpu_pod("pinned", limits="1", affinity=own,
                  labels={"gpu.example.com/product": "h100"})
    out = apply(control_plane, ns, pod)
    assert out.returncode == 0, out.stderr

    stored = get(control_plane, ns, "pod", "pinned")
    assert GPU_TOLERATION in stored["spec"]["tolerations"]
    terms = required_terms(stored)
    assert [t["matchExpressions"][0]["key"] for t in terms] == ["zone", "pool"]
    for term in terms:
        assert requirement(term, PRODUCT_LABEL) == {
            "key": PRODUCT_LABEL, "operator": "In", "values": [H100]}
        assert requirement(term, RACK_LABEL) == {
            "key": RACK_LABEL, "operator": "In", "values": ["rack-a", "rack-b"]}
    mutated = stored["metadata"]["annotations"][MUTATED_ANNOTATION]
    # No "gpu-requests": the API server itself copies a limit into a missing request.
    assert set(mutated.split(",")) == {"gpu-tolerations", "gpu-node-affinity"}


def test_a_pod_without_affinity_is_pinned_to_the_default_product(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("research")
    assert apply(control_plane, ns, gpu_pod("plain", limits="1")).returncode == 0

    terms = required_terms(get(control_plane, ns, "pod", "plain"))
    assert len(terms) == 1
    assert requirement(terms[0], PRODUCT_LABEL) == {
        "key": PRODUCT_LABEL, "operator": "In", "values": [A100]}


def test_resubmitting_the_stored_pod_changes_nothing(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("research")
    assert apply(control_plane, ns, gpu_pod("first", limits="1")).returncode == 0
    stored = get(control_plane, ns, "pod", "first")
    provenance = stored["metadata"]["annotations"][MUTATED_ANNOTATION]

    # What the webhook produced, submitted again as a new pod: a second pass of the
    # webhook (as on reinvocation) must not add a toleration, term or annotation.
    again = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "second",
                          "annotations": {MUTATED_ANNOTATION: provenance}},
             "spec": {k: stored["spec"][k] for k in ("containers", "tolerations", "affinity")}}
    out = apply(control_plane, ns, again)
    assert out.returncode == 0, out.stderr
    second = get(control_plane, ns, "pod", "second")
    for key in ("containers", "tolerations", "affinity"):
        assert second["spec"][key] == stored["spec"][key], key
    assert second["metadata"]["annotations"][MUTATED_ANNOTATION] == provenance

    # And a server-side dry run of it shows the same.
    dry = apply(control_plane, ns, dict(again, metadata={**again["metadata"], "name": "third"}),
                dry_run=True)
    assert dry.returncode == 0, dry.stderr
    third = yaml.safe_load(dry.stdout)
    for key in ("containers", "tolerations", "affinity"):
        assert third["spec"][key] == stored["spec"][key], key


def test_a_namespace_of_no_tenant_may_not_run_gpu_pods(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("nobody")
    out = apply(control_plane, ns, gpu_pod("stray", limits="1"))
    assert_refused_at_create(
        out, webhook.mutating,
        f'pod {ns}/stray: namespace "{ns}" belongs to no GPU tenant, so it may not run GPU '
        "pods. Ask the platform team to add it to a tenant in GPU policy e2e, or remove the "
        "GPU request. [rule tenant-required, policy e2e]")


def test_a_product_outside_the_tenant_is_refused_naming_node_label_values(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("research")
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": PRODUCT_LABEL, "operator": "In", "values": ["NVIDIA-L4"]}]}]}}}
    out = apply(control_plane, ns, gpu_pod("l4", affinity=own))
    # What nodes carry, not the policy's short names (a100, h100), which no node matches.
    assert_denied(out, f"pod {ns}/l4: its node affinity allows only {PRODUCT_LABEL} in "
                  f"[NVIDIA-L4], but tenant research's GPU pods may run only on "
                  f"{PRODUCT_LABEL} in [{A100}, {H100}].")


def test_a_mig_maximum_is_told_in_gpus_and_in_slices(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("mig")
    pod = gpu_pod("nb", limits=None)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.40gb": "3"}}
    out = apply(control_plane, ns, pod)
    assert_denied(out, "asks for 3 nvidia.com/mig-3g.40gb (3 x 0.5 = 1.5 GPUs) in all "
                  "(counted as Kubernetes does: app containers and sidecars together, or the "
                  "largest init container); tenant mig allows at most 1 GPU per pod. Ask for "
                  "2 nvidia.com/mig-3g.40gb (1 GPU) or fewer, or split the work across pods. "
                  "[rule max-gpus-per-pod, tenant mig]")


def test_a_pod_over_two_quota_scopes_gets_one_denial_and_no_product_still_refused(
    control_plane: ControlPlane, webhook: Deployment,
) -> None:
    # Tenant caps: 3 a100, 8 h100, and e2e-caps-dev's own 4 GPUs. 5 a100 GPUs break the
    # a100 cap and the namespace's; h100 has room, but the namespace cap refuses 5 of
    # those too, so it is not offered.
    ns = "e2e-caps-dev"
    create_namespace(control_plane, ns, "caps")
    out = apply(control_plane, ns, gpu_pod("big", limits="5"))
    assert out.returncode != 0
    (line,) = [s for s in out.stderr.splitlines() if s.strip()]
    assert (f"pod {ns}/big: exceeded quota: tenant caps would use 5 of its 3 a100 GPUs (the "
            "tightest of the 2 caps it exceeds): 0 in use, this pod asks 5. 3 are free "
            "now. Ask for 3 or fewer") in line, out.stderr
    assert "h100" not in line
