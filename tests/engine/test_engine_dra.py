"""GPUs asked through Dynamic Resource Allocation (resource.k8s.io/v1) are governed like
device-plugin GPUs: counted, confined to the tenant's products, kept on the GPU nodes,
and charged once against the same quota.

Before this, a pod whose GPU came from a ResourceClaimTemplate was charged nothing (any
tenant could skip every quota by asking through DRA), and one that carried the GPU
toleration, as NVIDIA's own demo pods do, had it stripped as a "non-GPU pod".
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import yaml
from enginekit import (
    A100,
    GPU_TOLERATION,
    PRODUCT_LABEL,
    RACK_LABEL,
    REQUIRED,
    ROOT,
    admitted,
    claim,
    claims_of,
    container,
    device_request,
    example_policy,
    example_variant,
    gpus_charged,
    mutate_checked,
    pod,
    validated,
)
from kit import validating

from webhook.admission.offline import as_stored
from webhook.engine.decision import Checker
from webhook.engine.devices import cost
from webhook.k8s.claims import device_requests
from webhook.k8s.review import parse_review, request_review
from webhook.quota.store import MemoryStore

TEMPLATE = "ResourceClaimTemplate"
A100_SELECTOR = ("device.attributes['gpu.nvidia.com'].productName.replace(' ', '-') "
                 f"in ['{A100}']")
MIG_1G = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"


def dra_pod(*entries: dict[str, Any], namespace: str = "research", name: str = "trainer",
            **spec: Any) -> dict[str, Any]:
    """A pod without GPU resources in its containers, asking through ``entries``."""
    return pod(container(limits={"cpu": "1"}), namespace=namespace, name=name,
               resourceClaims=list(entries), **spec)


def uses_template(name: str = "one-gpu") -> dict[str, Any]:
    return {"name": "gpu", "resourceClaimTemplateName": name}


def uses_claim(name: str = "shared") -> dict[str, Any]:
    return {"name": "gpu", "resourceClaimName": name}


# --- counting -------------------------------------------------------------------------

@pytest.mark.parametrize(("requests", "gpus", "devices"), [
    ([device_request()], 1.0, {"gpu.nvidia.com": 1}),
    ([device_request(count=3)], 3.0, {"gpu.nvidia.com": 3}),
    # allocationMode All: charged at the most one request can get, as ResourceQuota does.
    ([device_request(allocationMode="All")], 32.0, {"gpu.nvidia.com": 32}),
    ([device_request(count=2), device_request(name="b")], 3.0, {"gpu.nvidia.com": 3}),
    # A MIG request weighs by the profile its selector names, else as a whole GPU.
    ([device_request("mig.nvidia.com", count=4, selectors=[{"cel": {"expression": MIG_1G}}])],
     0.5, {"mig.nvidia.com": 4}),
    ([device_request("mig.nvidia.com")], 1.0, {"mig.nvidia.com": 1}),
    # Not a GPU class: not counted.
    ([device_request("nic.example.com", count=2)], 0.0, {}),
    # firstAvailable: the largest alternative, since the scheduler may pick any.
    ([{"name": "g", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2},
        {"name": "small", "deviceClassName": "mig.nvidia.com", "count": 1,
         "selectors": [{"cel": {"expression": MIG_1G}}]}]}], 2.0, {"gpu.nvidia.com": 2}),
])
def test_device_requests_are_counted_in_gpu_equivalents(
        requests: list[dict[str, Any]], gpus: float, devices: dict[str, int]) -> None:
    policy = example_policy()
    check = Checker(policy, None, "x", frozenset())
    got = cost(check, policy, device_requests({"devices": {"requests": requests}}, "/spec"))
    assert got.gpus == gpus
    assert got.resources == {f"deviceclass.resource.kubernetes.io/{k}": v
                             for k, v in devices.items()}


IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


def test_the_implicit_extended_resource_of_a_gpu_class_is_a_gpu() -> None:
    # KEP-5004: every DeviceClass is requestable as deviceclass.resource.kubernetes.io/<c>.
    p = pod(container(limits={IMPLICIT: 2}))
    refused = mutate_checked(p)  # research may use nvidia.com/gpu alone
    assert not refused.decision.allowed and "allowed-resources" in refused.decision.message
    allowing = example_variant(("allowedResources: [nvidia.com/gpu]\n",
                                f"allowedResources: [nvidia.com/gpu, {IMPLICIT}]\n"))
    m = mutate_checked(p, allowing)
    assert m.decision.allowed, m.decision.message
    assert GPU_TOLERATION in m.patched["spec"]["tolerations"]
    assert gpus_charged(m.patched, allowing) == 2


# --- pods using claims ------------------------------------------------------------------

def test_a_pod_using_a_gpu_template_is_charged_its_devices() -> None:
    # Failed before: the pod was charged nothing.
    template = claim(device_request(count=2), kind=TEMPLATE, name="one-gpu")
    m, v = admitted(dra_pod(uses_template()), claims=claims_of(template))
    assert v.allowed, v.message
    assert gpus_charged_with(m.patched, template) == 2


def gpus_charged_with(p: dict[str, Any], *objects: dict[str, Any]) -> float:
    from webhook.engine.charge import charge_of_pod
    charge = charge_of_pod(p, example_policy(), None, claims_of(*objects))
    return charge.gpus if charge is not None else 0.0


def test_a_dra_gpu_pod_keeps_its_gpu_toleration_and_gets_the_rack() -> None:
    # Failed before: classified as a non-GPU pod, its toleration was stripped
    # (nonGpuPodsToleratingGpuTaints: strip) and it could not reach the GPU nodes.
    template = claim(kind=TEMPLATE, name="one-gpu")
    m = mutate_checked(dra_pod(uses_template(), tolerations=[GPU_TOLERATION]),
                       claims=claims_of(template))
    assert m.decision.allowed, m.decision.message
    assert m.patched["spec"]["tolerations"] == [GPU_TOLERATION]
    terms = m.patched["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    # The rack is a node's; the product is the device's, pinned on the claim instead.
    assert keys == {RACK_LABEL}
    assert PRODUCT_LABEL not in keys


def test_a_pod_naming_a_claim_the_webhook_has_not_seen_keeps_its_tolerations() -> None:
    m = mutate_checked(dra_pod(uses_claim("elsewhere"), tolerations=[GPU_TOLERATION]))
    assert m.decision.allowed and m.patched["spec"]["tolerations"] == [GPU_TOLERATION]


def test_a_tenant_pod_naming_an_unseen_template_is_refused_saying_why() -> None:
    v = validated(dra_pod(uses_template("later")))
    assert not v.allowed
    assert "ResourceClaimTemplate later, which the webhook has not seen" in v.message


def test_a_pod_over_the_per_pod_maximum_through_a_template_is_refused() -> None:
    template = claim(device_request(count=6), kind=TEMPLATE, name="one-gpu")
    p = dra_pod(uses_template(), )
    p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 3}}
    p["spec"]["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{
        "matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In", "values": [A100]},
                             {"key": RACK_LABEL, "operator": "In", "values": ["rack-a"]}]}]}}}
    v = validated(p, claims=claims_of(template))
    assert not v.allowed
    assert "asks for 9 GPUs in all" in v.message and "max-gpus-per-pod" in v.message


# --- claims and templates ---------------------------------------------------------------

@pytest.mark.parametrize("kind", ["ResourceClaim", TEMPLATE])
def test_a_claim_is_pinned_to_the_tenants_product_by_a_selector(kind: str) -> None:
    m = mutate_checked(claim(kind=kind))
    assert m.decision.allowed, m.decision.message
    spec = m.patched["spec"] if kind == "ResourceClaim" else m.patched["spec"]["spec"]
    exactly = spec["devices"]["requests"][0]["exactly"]
    assert exactly["selectors"] == [{"cel": {"expression": A100_SELECTOR}}]
    # check_mutation already proved a second run adds nothing; the validating webhook
    # accepts the result.
    assert validated(m.patched).allowed


# The GPUs NVIDIA's DRA driver publishes on the simulated cluster's nodes
# (tests/e2e/gpucluster): productName is the NVML name, with spaces where the node's
# nvidia.com/gpu.product label has dashes. Read from the cluster, not from the policy:
# a selector must find the devices themselves, not what the policy calls them.
SIMULATED_MODELS: dict[str, dict[str, Any]] = yaml.safe_load(
    (ROOT / "tests" / "e2e" / "gpucluster" / "gpu-cluster.yaml").read_text())["spec"]["gpuModels"]


def nvidia_device(model: str, **attributes: Any) -> dict[str, Any]:
    """A device of a ResourceSlice of NVIDIA's driver, as the scheduler's CEL sees it."""
    return {"driver": "gpu.nvidia.com", "attributes": {"gpu.nvidia.com": {
        "productName": SIMULATED_MODELS[model]["nvmlName"], **attributes}}}


def selects(selectors: list[dict[str, Any]], device: dict[str, Any]) -> bool:
    """Whether the scheduler could allocate ``device`` to a request with these selectors
    (all must be true; the Kubernetes CEL environment has the strings library)."""
    import cel  # a dev dependency, as in tests/deploy: missing, it fails only these tests
    from cel.stdlib import add_stdlib_to_context

    context = cel.Context({"device": device})
    add_stdlib_to_context(context, ["strings"])
    return all(cel.evaluate(s["cel"]["expression"], context) is True for s in selectors)


@pytest.mark.parametrize(("namespace", "edits", "request_", "device", "allowed", "others"), [
    # notebooks: allowedProducts [a100], no defaultProduct; MIG slices through DRA.
    ("notebooks", (), device_request("mig.nvidia.com", selectors=[
        {"cel": {"expression": MIG_1G}}]), {"type": "mig", "profile": "1g.10gb"},
     ["a100"], ["h100", "l4"]),
    # research, its defaultProduct (and so its per-product caps) removed: any of its
    # allowed A100s and H100s.
    ("research", (("      defaultProduct: a100\n", ""),
                  ("        products: {a100: 24, h100: 8}\n", "")),
     device_request(), {"type": "gpu"},
     ["a100", "h100"], ["l4"]),
])
def test_a_tenant_without_a_default_product_gets_the_devices_of_its_allowed_products(
        namespace: str, edits: tuple[tuple[str, str], ...], request_: dict[str, Any],
        device: dict[str, Any], allowed: list[str], others: list[str]) -> None:
    # The claim's selector names the products' node labels, not the policy's aliases:
    # one listing 'a100' matches no device, and the pod waits Pending forever.
    compiled = example_variant(*edits) if edits else example_policy()
    m = mutate_checked(claim(request_, namespace=namespace), compiled)
    assert m.decision.allowed, m.decision.message
    selectors = m.patched["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    for model in allowed:
        assert selects(selectors, nvidia_device(model, **device)), (model, selectors)
    for model in others:
        assert not selects(selectors, nvidia_device(model, **device)), (model, selectors)
    v = validated(m.patched, compiled)
    assert v.allowed and not v.warnings, v.message or v.warnings


def test_a_users_own_selector_is_kept_and_the_product_anded_to_it() -> None:
    mine = {"cel": {"expression": "device.attributes['gpu.nvidia.com'].architecture == "
                                  "'Ampere'"}}
    m = mutate_checked(claim(device_request(selectors=[mine])))
    exactly = m.patched["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["selectors"] == [mine, {"cel": {"expression": A100_SELECTOR}}]


def test_an_unpinned_claim_is_refused_by_the_validating_webhook() -> None:
    v = validated(claim())
    assert not v.allowed and "allowed-products" in v.message


@pytest.mark.parametrize(("requests", "rule"), [
    ([device_request("mig.nvidia.com")], "allowed-device-classes"),
    ([device_request(adminAccess=True)], "device-admin-access"),
    ([device_request(count=9)], "max-gpus-per-pod"),
])
def test_claims_breaking_a_rule_are_refused(requests: list[dict[str, Any]], rule: str) -> None:
    m = mutate_checked(claim(*requests))
    decisions = [m.decision] if not m.decision.allowed else [validated(m.patched)]
    assert not decisions[0].allowed
    assert f"[rule {rule}," in decisions[0].message


def test_a_claim_of_no_gpu_class_is_not_the_webhooks_business() -> None:
    m = mutate_checked(claim(device_request("nic.example.com")))
    assert m.decision.skipped == "no-gpu" and m.decision.patch == []


# --- charging once --------------------------------------------------------------------

def admit(store: MemoryStore, obj: dict[str, Any], uid: str, username: str = "developer",
          **lookup: Any) -> Any:
    """Both webhooks' effect on ``obj`` as the API server stores it, quota included."""
    m = mutate_checked(obj, username=username, **lookup)
    if not m.decision.allowed:
        return m.decision
    stored = m.patched
    as_stored(stored, uid)
    req = parse_review(orjson.dumps(request_review(stored, uid=uid, username=username)))
    return validating(req, example_policy(), store=store, **lookup)


def used(store: MemoryStore) -> float:
    return store.view().tenant("research").gpus


def test_a_shared_claim_is_charged_once_however_many_pods_use_it() -> None:
    store = MemoryStore()
    shared = claim(device_request(count=2), name="shared")
    assert admit(store, shared, "claim-1").allowed
    assert used(store) == 2
    pinned = mutate_checked(shared).patched
    for i in range(3):
        d = admit(store, dra_pod(uses_claim(), name=f"p{i}"), f"pod-{i}",
                  claims=claims_of(pinned))
        assert d.allowed, d.message
    assert used(store) == 2  # the three pods add nothing: the claim holds the devices


def test_a_template_pod_is_charged_and_its_generated_claim_is_not() -> None:
    store = MemoryStore()
    template = mutate_checked(claim(device_request(count=2), kind=TEMPLATE,
                                    name="one-gpu")).patched
    d = admit(store, dra_pod(uses_template()), "pod-1", claims=claims_of(template))
    assert d.allowed, d.message
    assert used(store) == 2
    generated = claim(device_request(count=2), name="trainer-gpu-x7k2p", annotations={
        "resource.kubernetes.io/pod-claim-name": "gpu"})
    generated["spec"] = template["spec"]["spec"]
    by_controller = admit(store, generated, "claim-2", username="system:kube-controller-manager")
    assert by_controller.allowed and used(store) == 2
    # The same annotation written by a user buys nothing: that claim is charged.
    assert admit(store, generated, "claim-3").allowed
    assert used(store) == 4


def test_the_schedulers_extended_resource_claim_is_not_charged_again() -> None:
    store = MemoryStore()
    mapped = claim(annotations={"resource.kubernetes.io/extended-resource-claim": "true"})
    d = admit(store, mapped, "claim-1", username="system:kube-scheduler")
    assert d.allowed and d.skipped is None and used(store) == 0
    faked = admit(store, mapped, "claim-2")
    assert not faked.allowed and "extended-resource-claim" in faked.message
    assert used(store) == 0


def test_dra_and_device_plugin_gpus_share_one_cap() -> None:
    store = MemoryStore()
    big = claim(device_request(count=8), name="big")
    for i in range(3):  # 3 x 8 = the research tenant's 24 a100 GPUs (pinned: its default)
        assert admit(store, dict(big, metadata={**big["metadata"], "name": f"big-{i}"}),
                     f"claim-{i}").allowed
    assert store.view().tenant("research").products == {"a100": 24}
    d = admit(store, pod(), "pod-1")  # a device-plugin GPU pod, pinned to a100 too
    assert not d.allowed
    assert "tenant research would use 25 of its 24 a100 GPUs" in d.message
    refused = admit(store, dict(big, metadata={**big["metadata"], "name": "big-3"}), "claim-3")
    assert not refused.allowed and "this ResourceClaim asks 8" in refused.message
