"""Strategies and properties for fuzzing the engine with hypothesis.

The strategies build Pods, Deployments, Jobs and CronJobs the way developers write
them (and the ways they get them wrong): app, init and sidecar containers asking GPUs
by request and/or limit with valid and invalid quantities as strings and numbers,
tolerations, nodeSelectors, multi-term node affinity, product labels and annotations,
in namespaces inside and outside the tenants of ``policies/multi-tenant.yaml``.

:func:`check_review` holds the engine's invariants; the tests run it a few hundred
times in CI and ``run_long.py`` runs it a hundred thousand times.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
from hypothesis import event
from hypothesis import strategies as st
from kit import validating

from webhook.admission.webhooks import Phase, reply
from webhook.admission.webhooks import mutating as mutate
from webhook.engine.mutate import OWNED as MUTATE_OWNED
from webhook.k8s.review import AdmissionRequest, parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_file
from webhook.policy.model import Mode

POLICY_FILE = Path(__file__).resolve().parents[2] / "policies" / "multi-tenant.yaml"
POLICY: CompiledPolicy = compile_policy(load_file(POLICY_FILE))

PRODUCT_LABEL = "nvidia.com/gpu.product"
RACK_LABEL = "topology.example.com/gpu-rack"
REQUEST_LABEL = "gpu.example.com/product"
GPU_RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
                 "nvidia.com/mig-3g.40gb"]
NAMESPACES = ["research", "research", "research", "research-dev", "notebooks", "notebooks",
              "inference", "default", "kube-system", "gpu-operator"]

valid_counts = st.integers(min_value=1, max_value=16)
quantities = st.one_of(
    valid_counts,
    valid_counts.map(str),
    st.sampled_from(["1000m", "2000m", "1k", "1e0", "2.0", "+3", "1e400", "-1", "0x10",
                     "NaN", "Infinity", "500m", "0", "", " 1", "1.5", "1Ki", "1e15",
                     "abc"]),
    st.sampled_from([0, -2, 0.5, 2.0, 1e308, True]),
    st.just({"value": 1}),
)
# Valid counts far more often: most fuzzed pods should get past the quantity rules.
gpu_quantities = st.one_of(valid_counts, valid_counts.map(str), st.just(1), st.just("2"),
                           quantities)


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = draw(st.lists(st.sampled_from([*GPU_RESOURCES, "nvidia.com/gpu", "nvidia.com/gpu",
                                           "cpu", "memory"]), max_size=2, unique=True))
    for name in names:
        gpu = name not in ("cpu", "memory")
        value = draw(gpu_quantities) if gpu else draw(st.sampled_from(["1", "100m", "2Gi"]))
        shape = draw(st.sampled_from(["limit", "limit", "limit", "request", "both", "both",
                                      "both-differ"]))
        if shape in ("limit", "both", "both-differ"):
            out.setdefault("limits", {})[name] = value
        if shape in ("request", "both"):
            out.setdefault("requests", {})[name] = value
        if shape == "both-differ":
            out.setdefault("requests", {})[name] = draw(gpu_quantities) if gpu else value
    return out


@st.composite
def containers(draw: st.DrawFn, prefix: str, sidecars: bool = False) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(0 if prefix == "init" else 1, 3))):
        c: dict[str, Any] = {"name": f"{prefix}-{i}", "image": "img"}
        res = draw(resources())
        if res:
            c["resources"] = res
        if sidecars and draw(st.booleans()):
            c["restartPolicy"] = "Always"
        out.append(c)
    return out


products = st.sampled_from(["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-L4",
                            "a100", "h100", "TPU-v9"])
racks = st.sampled_from(["rack-a", "rack-b", "rack-z"])
expressions = st.one_of(
    st.builds(lambda v: {"key": PRODUCT_LABEL, "operator": "In", "values": v},
              st.lists(products, min_size=1, max_size=2, unique=True)),
    st.builds(lambda v: {"key": PRODUCT_LABEL, "operator": "NotIn", "values": v},
              st.lists(products, min_size=1, max_size=2, unique=True)),
    st.builds(lambda v: {"key": RACK_LABEL, "operator": "In", "values": v},
              st.lists(racks, min_size=1, max_size=2, unique=True)),
    st.just({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}),
    st.just({"key": PRODUCT_LABEL, "operator": "Exists"}),
)
tolerations = st.sampled_from([
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
    {"operator": "Exists"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 300},
])


@st.composite
def pod_templates(draw: st.DrawFn) -> dict[str, Any]:
    """``{"metadata": ..., "spec": ...}`` of a pod."""
    spec: dict[str, Any] = {"containers": draw(containers("app"))}
    init = draw(containers("init", sidecars=True))
    if init:
        spec["initContainers"] = init
    if draw(st.booleans()):
        spec["tolerations"] = draw(st.lists(tolerations, max_size=3))
    if draw(st.integers(0, 3)) == 0:
        spec["nodeSelector"] = draw(st.dictionaries(
            st.sampled_from([PRODUCT_LABEL, RACK_LABEL, "disk"]), st.one_of(products, racks),
            max_size=2))
    if draw(st.integers(0, 2)) == 0:
        terms = draw(st.lists(st.builds(lambda e: {"matchExpressions": e},
                                        st.lists(expressions, max_size=3)),
                              min_size=1, max_size=3))
        spec["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    meta: dict[str, Any] = {"name": "p"}
    if draw(st.integers(0, 3)) == 0:
        meta["labels"] = {REQUEST_LABEL: draw(products)}
    if draw(st.integers(0, 4)) == 0:
        meta["annotations"] = {REQUEST_LABEL: draw(products)}
    return {"metadata": meta, "spec": spec}


@st.composite
def objects(draw: st.DrawFn, templates: st.SearchStrategy[dict[str, Any]] | None = None
            ) -> dict[str, Any]:
    """A Pod, Deployment, Job or CronJob around a fuzzed pod template."""
    template = draw(templates if templates is not None else pod_templates())
    namespace = draw(st.sampled_from(NAMESPACES))
    kind = draw(st.sampled_from(["Pod", "Pod", "Deployment", "Job", "CronJob"]))
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {**template["metadata"], "namespace": namespace},
                "spec": template["spec"]}
    meta = {"name": "w", "namespace": namespace}
    n = draw(st.integers(0, 6))
    if kind == "Deployment":
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta,
                "spec": {"replicas": n, "template": template}}
    job = {"parallelism": n, "template": template}
    if kind == "Job":
        return {"apiVersion": "batch/v1", "kind": kind, "metadata": meta, "spec": job}
    return {"apiVersion": "batch/v1", "kind": kind, "metadata": meta,
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": job}}}


@st.composite
def reviews(draw: st.DrawFn, templates: st.SearchStrategy[dict[str, Any]] | None = None
            ) -> dict[str, Any]:
    obj = draw(objects(templates))
    uid = draw(st.uuids()).hex
    groups = draw(st.sampled_from([None, ["system:authenticated"]]))
    return dict(request_review(obj, uid=uid, groups=groups,
                               dry_run=draw(st.booleans())))


def _request(review: dict[str, Any]) -> AdmissionRequest:
    """A fresh parse (the engine edits the request's object in place)."""
    return parse_review(orjson.dumps(review))


def _well_formed(reply: dict[str, Any], uid: str, webhook: str) -> list[dict[str, Any]]:
    """Check the reply's shape; return its patch (empty when there is none)."""
    assert reply["apiVersion"] == "admission.k8s.io/v1" and reply["kind"] == "AdmissionReview"
    resp = reply["response"]
    assert resp["uid"] == uid
    assert isinstance(resp["allowed"], bool)
    assert ("patch" in resp) == ("patchType" in resp)
    if not resp["allowed"]:
        assert resp["status"]["code"] == 403 and resp["status"]["message"]
        assert "patch" not in resp
    if webhook == "validate":
        assert "patch" not in resp
    if "patch" not in resp:
        return []
    assert resp["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = orjson.loads(base64.b64decode(resp["patch"]))
    assert ops
    return ops


def check_review(review: dict[str, Any], policy: CompiledPolicy | None = None) -> None:
    """The engine invariants for one review (raises AssertionError on a violation),
    under ``policy`` (default: the example policy)."""
    policy = policy or POLICY
    uid = review["request"]["uid"]
    original = copy.deepcopy(review["request"]["object"])

    m = mutate(_request(review), policy)
    ops = _well_formed(reply(Phase.MUTATE, uid, m), uid, "mutate")
    # Same input, same state: the same verdict (a denied pod is never allowed later).
    again = mutate(_request(review), policy)
    assert (again.allowed, again.message, again.patch) == (m.allowed, m.message, m.patch)

    patched = jsonpatch.apply_patch(original, ops) if ops else original
    if m.allowed:
        # Idempotent: mutate of its own output changes nothing and still allows.
        second = copy.deepcopy(review)
        second["request"]["object"] = patched
        m2 = mutate(_request(second), policy)
        assert m2.allowed, m2.message
        assert m2.patch == [], m2.patch
    v = validating(_request({**review, "request": {**review["request"], "object": patched}}),
                 policy)
    _well_formed(reply(Phase.VALIDATE, uid, v), uid, "validate")
    v_again = validating(_request({**review, "request": {**review["request"],
                                                       "object": patched}}), policy)
    assert (v_again.allowed, v_again.message) == (v.allowed, v.message)
    if m.allowed and not m.findings:
        # What the mutating webhook passed cleanly, the validating one must not refuse
        # for a rule the mutating webhook owns.
        owned = [f for f in v.findings if f.rule in MUTATE_OWNED and f.mode is Mode.ENFORCE]
        assert not owned, [f.message for f in owned]
    if not m.allowed:
        assert not m.patch
    event(f"mutate {m.outcome}{' +patch' if ops else ''}, validate {v.outcome}")
