"""Builders and checks shared by the engine tests.

Manifests are plain dicts shaped like what ``kubectl apply`` sends; ``review`` wraps one
in an AdmissionReview and parses it exactly as the server does, so the engine sees the
same ``AdmissionRequest`` it sees in production. ``mutate_checked`` is the one way the
tests run the mutating webhook: besides returning the decision it proves the three
properties every mutation must have (the patch applies to the original object, the
result is a valid Kubernetes object, and a second run changes nothing).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
from kit import validating

from webhook.admission.webhooks import mutating as mutate
from webhook.engine.charge import charge_of_pod
from webhook.engine.decision import Decision
from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.routes.sights import Sights, no_sights
from webhook.engine.target import NamespaceLabels
from webhook.k8s.review import AdmissionRequest, parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_POLICY = ROOT / "policies" / "multi-tenant.yaml"
SPOT_POLICY = ROOT / "policies" / "examples" / "spot.yaml"
HOLDING_POLICY = ROOT / "policies" / "examples" / "holding.yaml"

# The newest Kubernetes schema the validation library ships: mutated objects must be
# valid for the API server a cluster runs today.
K8S_VERSION = kubernetes_validate.latest_version()

GPU = "nvidia.com/gpu"
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"
PRODUCT_LABEL = "nvidia.com/gpu.product"
RACK_LABEL = "topology.example.com/gpu-rack"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
GPU_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}

# Namespace labels the API server would report; "serving" joins the inference tenant
# through that tenant's namespaceSelector.
NAMESPACE_LABELS: dict[str, dict[str, str]] = {
    "serving": {"gpu.example.com/tenant": "inference", "kubernetes.io/metadata.name": "serving"},
    "research": {"kubernetes.io/metadata.name": "research"},
    "sandbox": {"kubernetes.io/metadata.name": "sandbox"},
}


def namespace_labels(namespace: str) -> Mapping[str, str] | None:
    return NAMESPACE_LABELS.get(namespace)


# --- policies -------------------------------------------------------------------------


def example_text() -> str:
    return EXAMPLE_POLICY.read_text()


@cache
def example_policy() -> CompiledPolicy:
    return compile_policy(load_text(example_text(), str(EXAMPLE_POLICY)))


@cache
def example_variant(*edits: tuple[str, str]) -> CompiledPolicy:
    """The example policy with text replacements; each must match exactly once, so a
    change to the example file cannot silently turn a variant into the original."""
    text = example_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} must occur once in the example policy"
        text = text.replace(old, new)
    return compile_policy(load_text(text, "example-variant"))


@cache
def spot_policy(*edits: tuple[str, str]) -> CompiledPolicy:
    """The spot example policy (``policies/examples/spot.yaml``), with text replacements
    that must each match exactly once."""
    text = SPOT_POLICY.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} must occur once in the spot example"
        text = text.replace(old, new)
    return compile_policy(load_text(text, str(SPOT_POLICY)))


@cache
def holding_policy(*edits: tuple[str, str]) -> CompiledPolicy:
    """``policies/examples/holding.yaml`` (runtime, CPU per GPU, routing, capabilities),
    with text replacements that must each match exactly once."""
    text = HOLDING_POLICY.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} must occur once in the holding example"
        text = text.replace(old, new)
    return compile_policy(load_text(text, str(HOLDING_POLICY)))


# --- manifests ------------------------------------------------------------------------


def container(name: str = "main", *, requests: Mapping[str, Any] | None = None,
              limits: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A container; ``resources`` is present only when requests or limits are given."""
    c: dict[str, Any] = {"name": name, "image": "registry.example.com/ml/train:1.4"}
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = dict(requests)
    if limits is not None:
        resources["limits"] = dict(limits)
    if resources:
        c["resources"] = resources
    c.update(extra)
    return c


def gpus(n: Any, resource: str = GPU) -> dict[str, Any]:
    return {resource: n}


def pod(*containers: dict[str, Any], namespace: str = "research", name: str = "trainer",
        init: list[dict[str, Any]] | None = None, labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A Pod; with no containers given, one container asking for one GPU by its limit."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    body: dict[str, Any] = {
        "containers": list(containers) or [container(limits=gpus(1))],
    }
    if init:
        body["initContainers"] = list(init)
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def device_request(device_class: str = "gpu.nvidia.com", count: int | None = None,
                   name: str = "gpu", **exactly: Any) -> dict[str, Any]:
    """One request of a ResourceClaimSpec (resource.k8s.io/v1): ``exactly`` a class."""
    body: dict[str, Any] = {"deviceClassName": device_class, **exactly}
    if count is not None:
        body["count"] = count
    return {"name": name, "exactly": body}


def claim(*requests: dict[str, Any], namespace: str = "research", name: str = "gpus",
          kind: str = "ResourceClaim", annotations: Mapping[str, str] | None = None
          ) -> dict[str, Any]:
    """A ResourceClaim (or, with ``kind="ResourceClaimTemplate"``, a template) asking for
    ``requests`` (default: one gpu.nvidia.com device)."""
    spec: dict[str, Any] = {"devices": {"requests": list(requests) or [device_request()]}}
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    body = spec if kind == "ResourceClaim" else {"spec": spec}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta, "spec": body}


def claims_of(*objects: Mapping[str, Any]) -> ClaimLookup:
    """A claim lookup that knows ``objects`` (what the watch cache holds online)."""
    known = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o
             for o in objects}
    return lambda kind, namespace, name: known.get((kind, namespace, name))


def _template(p: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in p["metadata"].items() if k not in ("name", "namespace")}
    meta.setdefault("labels", {})["app"] = p["metadata"]["name"]
    return {"metadata": meta, "spec": copy.deepcopy(p["spec"])}


def deployment(p: Mapping[str, Any], replicas: int = 2) -> dict[str, Any]:
    """A Deployment running ``p`` as its template."""
    name = p["metadata"]["name"]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": p["metadata"]["namespace"]},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": _template(p)},
    }


def job(p: Mapping[str, Any], parallelism: int = 1) -> dict[str, Any]:
    tpl = _template(p)
    tpl["spec"].setdefault("restartPolicy", "Never")
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": p["metadata"]["name"], "namespace": p["metadata"]["namespace"]},
        "spec": {"parallelism": parallelism, "completions": parallelism, "template": tpl},
    }


def cronjob(p: Mapping[str, Any]) -> dict[str, Any]:
    inner = job(p)
    return {
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": inner["metadata"],
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": inner["spec"]}},
    }


def pod_spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The pod spec inside a Pod, Deployment, Job or CronJob."""
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    if obj["kind"] != "Pod":
        spec = spec["template"]["spec"]
    return dict(spec)


def node_terms(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The required node-affinity terms of a pod spec ([] when there are none)."""
    spec = pod_spec(obj)
    try:
        return list(spec["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"])
    except KeyError:
        return []


def required_affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod ``affinity`` with the given terms (each a list of match expressions)."""
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
        {"matchExpressions": list(t)} for t in terms]}}}


def expr(key: str, *values: str, op: str = "In") -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


# --- running the engine ---------------------------------------------------------------


def review(manifest: Mapping[str, Any], **kw: Any) -> AdmissionRequest:
    """``manifest`` as the API server would send it (a private deep copy: the mutating
    webhook edits the request's object in place)."""
    body = orjson.dumps(request_review(copy.deepcopy(dict(manifest)), **kw))
    return parse_review(body)


@dataclass
class Mutation:
    decision: Decision
    original: dict[str, Any]
    patched: dict[str, Any]  # the original with the patch applied (== original if none)

    @property
    def paths(self) -> list[str]:
        return [op["path"] for op in self.decision.patch]


def mutate_checked(manifest: Mapping[str, Any], policy: CompiledPolicy | None = None,
                   labels: NamespaceLabels = namespace_labels,
                   claims: ClaimLookup = no_claims, sights: Sights = no_sights,
                   **kw: Any) -> Mutation:
    """Run the mutating webhook on ``manifest`` (see :func:`check_mutation`)."""
    return check_mutation(request_review(copy.deepcopy(dict(manifest)), **kw), policy, labels,
                          claims, sights)


VOID_ENTRY = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def neutralized_only(patch: list[dict[str, Any]]) -> bool:
    """Whether a patch does nothing but give containers ``NVIDIA_VISIBLE_DEVICES=void``
    (and record it in the provenance annotation): what a tenant's pod without GPUs gets."""
    for op in patch:
        value = op.get("value")
        if op["path"].endswith("/env") and value == [VOID_ENTRY]:
            continue
        if op["path"].endswith("/env/-") and value == VOID_ENTRY:
            continue
        if op["path"] == "/metadata/annotations" and value == {
                "gpu-webhook.dev/mutated": "gpu-visible-devices"}:
            continue
        if op["path"] == "/metadata/annotations/gpu-webhook.dev~1mutated" and \
                value == "gpu-visible-devices":
            continue
        return False
    return bool(patch)


def check_mutation(payload: Mapping[str, Any], policy: CompiledPolicy | None = None,
                   labels: NamespaceLabels = namespace_labels,
                   claims: ClaimLookup = no_claims, sights: Sights = no_sights) -> Mutation:
    """Run the mutating webhook on an AdmissionReview and check what every mutation
    must satisfy:

    1. the patch applies (``jsonpatch``) to the object as the user sent it, and gives
       exactly the object the engine ended up with;
    2. the patched object is valid against the Kubernetes OpenAPI schema (strict, so a
       misspelled or misplaced field is caught too);
    3. running the webhook again on the patched object yields no patch and the same
       verdict (idempotence: reinvocation must not stack tolerations or terms).
    """
    policy = policy or example_policy()
    original = copy.deepcopy(payload["request"]["object"])
    req = parse_review(orjson.dumps(payload))
    decision = mutate(req, policy, labels, claims, sights=sights)
    patched = jsonpatch.apply_patch(original, decision.patch, in_place=False)
    if decision.allowed:
        assert patched == req.object, "the patch and the mutated object disagree"
    else:
        assert decision.patch == [], "a denial must carry no patch"
    kubernetes_validate.validate(patched, K8S_VERSION, strict=True)
    again_payload = copy.deepcopy(dict(payload))
    again_payload["request"] = dict(again_payload["request"], object=copy.deepcopy(patched))
    again = mutate(parse_review(orjson.dumps(again_payload)), policy, labels, claims,
                   sights=sights)
    assert again.patch == [], f"mutate is not idempotent: second run patched {again.patch}"
    assert again.allowed == decision.allowed
    return Mutation(decision, original, patched)


def validated(manifest: Mapping[str, Any], policy: CompiledPolicy | None = None,
              labels: NamespaceLabels = namespace_labels, claims: ClaimLookup = no_claims,
              **kw: Any) -> Decision:
    """Run the validating webhook; it must never return a patch or touch the object."""
    req = review(manifest, **kw)
    before = copy.deepcopy(req.object)
    decision = validating(req, policy or example_policy(), labels, claims=claims)
    assert decision.patch == [], "the validating webhook returned a patch"
    assert req.object == before, "the validating webhook changed the object"
    return decision


def gpus_charged(manifest: Mapping[str, Any], policy: CompiledPolicy | None = None,
                 labels: NamespaceLabels = namespace_labels) -> float:
    """The GPU-equivalents the pod is charged: the one pod cost (``engine.charge``) that
    admission and the cluster cache both count."""
    namespace = str(manifest.get("metadata", {}).get("namespace", ""))
    charge = charge_of_pod(manifest, policy or example_policy(), labels(namespace))
    return charge.gpus if charge is not None else 0.0


def admitted(manifest: Mapping[str, Any], policy: CompiledPolicy | None = None,
             labels: NamespaceLabels = namespace_labels, claims: ClaimLookup = no_claims,
             **kw: Any) -> tuple[Mutation, Decision]:
    """Both webhooks in API-server order: mutate, then validate the mutated object."""
    m = mutate_checked(manifest, policy, labels, claims, **kw)
    return m, validated(m.patched, policy, labels, claims, **kw)
