"""The hostile AdmissionReview corpus: each case is a body and the outcome it must get.

An outcome is either an HTTP 4xx with a JSON ``error`` (the body is not a usable
review), or an admission decision per webhook (``mutate`` / ``validate``): allowed,
allowed with a patch, or denied with a message containing a given text. Whatever the
body, the answer is never a 5xx, never a hang and never ``allowed: true`` for an object
the policy (``policies/multi-tenant.yaml``) refuses.

Raw bodies that Python would not produce (duplicate keys, NaN, truncation, bad UTF-8)
live as files in ``corpus/``; the rest are built here from one valid pod review.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

CORPUS = Path(__file__).resolve().parent / "corpus"
UID = "5b7e2c10-hostile-0000-000000000001"


@dataclass(frozen=True)
class Error:
    """HTTP ``status`` with a JSON ``{"error": ...}`` containing ``text``."""

    status: int
    text: str


@dataclass(frozen=True)
class Allow:
    patch: bool | None = None  # True: must patch; False: must not; None: either


@dataclass(frozen=True)
class Deny:
    text: str  # alternatives separated by "|"


Outcome = Error | Allow | Deny


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    mutate: Outcome
    validate: Outcome
    uid: str = UID


def gpu_pod(gpus: object = 2, namespace: str = "research", **extra: Any) -> dict[str, Any]:
    """A pod asking ``gpus`` by limit; ``gpus=None``: a CPU-only pod."""
    limits = {"cpu": "1"} if gpus is None else {"nvidia.com/gpu": gpus}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "pytorch:2",
                                 "resources": {"limits": limits}}],
                 **extra},
    }


def review(obj: Any = None, **request: Any) -> dict[str, Any]:
    req: dict[str, Any] = {
        "uid": UID,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "trainer", "namespace": "research", "operation": "CREATE",
        "userInfo": {"username": "developer", "groups": ["system:authenticated"]},
        "object": gpu_pod() if obj is None else obj, "oldObject": None, "dryRun": False,
    }
    req.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def edited(edit: Callable[[dict[str, Any]], object]) -> bytes:
    """The valid review with ``edit`` applied to it (the return value is ignored)."""
    doc = review()
    edit(doc)
    return orjson.dumps(doc)


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["request"]["object"]["spec"]
    return spec


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit that sets the dotted ``path`` (integers index lists) to ``value``."""
    keys: list[str | int] = [int(k) if k.isdigit() else k for k in path.split(".")]

    def edit(doc: dict[str, Any]) -> None:
        cur: Any = doc
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = copy.deepcopy(value)

    return edit


def _del(path: str) -> Callable[[dict[str, Any]], None]:
    keys = path.split(".")

    def edit(doc: dict[str, Any]) -> None:
        cur: Any = doc
        for k in keys[:-1]:
            cur = cur[k]
        del cur[keys[-1]]

    return edit


def both(outcome: Outcome) -> tuple[Outcome, Outcome]:
    return outcome, outcome


# A tenant's pod without GPUs: the mutating webhook gives its containers
# NVIDIA_VISIBLE_DEVICES=void (engine.routes), the validating one never patches.
NEUTRALIZED = (Allow(patch=True), Allow(patch=False))


def _bad(status: int, text: str) -> tuple[Outcome, Outcome]:
    return both(Error(status, text))


# The validating webhook may refuse an unmutated malformed pod for being unpinned first.
MALFORMED = Deny("malformed|GPU pods must be pinned")
QUANTITY = Deny("GPUs are whole devices")
FAR_TOO_MANY = Deny("far more devices than any node has")
MEBI = 1024 * 1024


def _cases() -> list[Case]:
    out: list[Case] = []

    def add(name: str, body: bytes, outcome: tuple[Outcome, Outcome], uid: str = UID) -> None:
        out.append(Case(name, body, outcome[0], outcome[1], uid))

    # --- not an AdmissionReview at all: 4xx with a JSON error
    add("empty-body", b"", _bad(400, "empty request body"))
    add("json-null", b"null", _bad(400, "must be a JSON object"))
    add("json-array", b"[]", _bad(400, "must be a JSON object"))
    add("json-string", b'"AdmissionReview"', _bad(400, "must be a JSON object"))
    add("json-number", b"1e400", _bad(400, "not valid JSON"))
    add("deeply-nested-array-100k", b"[" * 100_000 + b"]" * 100_000, _bad(400, "not valid JSON"))
    add("deeply-nested-object-100k",
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'
        + b'{"a":' * 100_000 + b"1" + b"}" * 100_001, _bad(400, "not valid JSON"))
    add("api-version-v1beta1", edited(_set("apiVersion", "admission.k8s.io/v1beta1")),
        _bad(400, "unsupported apiVersion"))
    add("api-version-missing", edited(_del("apiVersion")), _bad(400, "unsupported apiVersion"))
    add("api-version-number", edited(_set("apiVersion", 1)), _bad(400, "unsupported apiVersion"))
    add("kind-not-review", edited(_set("kind", "AdmissionResponse")),
        _bad(400, "kind must be AdmissionReview"))
    add("request-missing", edited(_del("request")), _bad(400, "no request object"))
    add("request-null", edited(_set("request", None)), _bad(400, "no request object"))
    add("request-as-list", edited(_set("request", [review()["request"]])),
        _bad(400, "no request object"))
    add("request-as-string", edited(_set("request", "{}")), _bad(400, "no request object"))
    add("uid-missing", edited(_del("request.uid")), _bad(400, "request.uid"))
    add("uid-int", edited(_set("request.uid", 12345)), _bad(400, "request.uid"))
    add("uid-empty", edited(_set("request.uid", "")), _bad(400, "request.uid"))
    add("uid-1mb", edited(_set("request.uid", "u" * MEBI)), _bad(400, "request.uid"))
    add("uid-object", edited(_set("request.uid", {"a": 1})), _bad(400, "request.uid"))
    add("kind-as-string", edited(_set("request.kind", "Pod")), _bad(400, "request.kind"))
    add("kind-kind-int", edited(_set("request.kind.kind", 7)), _bad(400, "request.kind"))
    add("operation-missing", edited(_del("request.operation")), _bad(400, "request.operation"))
    add("operation-lowercase", edited(_set("request.operation", "create")),
        _bad(400, "request.operation"))
    add("operation-as-list", edited(_set("request.operation", ["CREATE"])),
        _bad(400, "request.operation"))
    add("operation-as-object", edited(_set("request.operation", {"CREATE": 1})),
        _bad(400, "request.operation"))
    add("object-missing-on-create", edited(_del("request.object")), _bad(400, "request.object"))
    add("object-as-array", edited(_set("request.object", [gpu_pod()])),
        _bad(400, "request.object"))
    add("object-as-string", edited(_set("request.object", "pod")), _bad(400, "request.object"))
    add("old-object-as-number", edited(_set("request.oldObject", 3)),
        _bad(400, "request.oldObject"))
    add("namespace-as-number", edited(_set("request.namespace", 42)),
        _bad(400, "request.namespace"))
    add("name-as-list", edited(_set("request.name", ["a"])), _bad(400, "request.name"))
    add("user-info-as-list", edited(_set("request.userInfo", ["dev"])),
        _bad(400, "request.userInfo"))
    add("groups-as-string", edited(_set("request.userInfo.groups", "system:masters")),
        _bad(400, "request.userInfo"))
    add("groups-with-number", edited(_set("request.userInfo.groups", ["a", 1])),
        _bad(400, "request.userInfo"))
    add("dry-run-as-string", edited(_set("request.dryRun", "false")),
        _bad(400, "request.dryRun"))
    add("body-over-4mib", edited(_set("request.object.metadata.annotations",
                                      {"big": "x" * (4 * MEBI)})),
        _bad(413, "larger than"))

    # --- a review of a malformed object: denied with the path that is wrong
    add("spec-as-string", edited(_set("request.object.spec", "gpu please")), both(MALFORMED))
    add("containers-as-dict", edited(_set("request.object.spec.containers",
                                          {"main": {"image": "x"}})), both(MALFORMED))
    add("container-as-string", edited(_set("request.object.spec.containers", ["main"])),
        both(MALFORMED))
    add("resources-as-list", edited(_set("request.object.spec.containers.0.resources", [1])),
        both(MALFORMED))
    add("limits-as-list", edited(_set("request.object.spec.containers.0.resources.limits",
                                      [{"nvidia.com/gpu": 1}])), both(MALFORMED))
    add("requests-as-string", edited(_set(
        "request.object.spec.containers.0.resources.requests", "nvidia.com/gpu=1")),
        both(MALFORMED))
    add("metadata-as-list", edited(_set("request.object.metadata", ["trainer"])),
        both(MALFORMED))
    add("labels-as-list", edited(_set("request.object.metadata.labels", ["a=b"])),
        both(MALFORMED))
    add("tolerations-as-dict", edited(_set("request.object.spec.tolerations",
                                           {"key": "nvidia.com/gpu"})), both(MALFORMED))
    add("node-selector-as-list", edited(_set("request.object.spec.nodeSelector", ["a"])),
        both(MALFORMED))
    add("affinity-terms-as-string", edited(_set("request.object.spec.affinity", {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": "zone=a"}}})), both(MALFORMED))
    add("match-expressions-as-number", edited(_set("request.object.spec.affinity", {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": 5}]}}})), both(MALFORMED))
    add("init-containers-as-dict", edited(_set("request.object.spec.initContainers", {"a": 1})),
        both(MALFORMED))
    add("deployment-template-spec-as-list", orjson.dumps(review(
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "d", "namespace": "research"},
         "spec": {"replicas": 2, "template": {"spec": [gpu_pod()["spec"]]}}},
        kind={"group": "apps", "version": "v1", "kind": "Deployment"})), both(MALFORMED))

    # --- GPU quantities that are no whole, positive, sane count: denied by both webhooks
    for label, value, outcome in [
        ("string-1e400", "1e400", FAR_TOO_MANY), ("string-minus-1", "-1", QUANTITY),
        ("string-hex", "0x10", QUANTITY), ("string-nan", "NaN", QUANTITY),
        ("string-infinity", "Infinity", QUANTITY), ("string-inf", "inf", QUANTITY),
        ("number-1e308", 1e308, FAR_TOO_MANY), ("number-minus-1", -1, QUANTITY),
        ("number-half", 0.5, QUANTITY),
        ("string-milli", "500m", QUANTITY), ("string-empty", "", QUANTITY),
        ("string-spaces", " 2 ", QUANTITY), ("string-arabic-digit", "\u0662", QUANTITY),
        ("string-1e16", "1e16", FAR_TOO_MANY), ("string-64-digits", "9" * 64, FAR_TOO_MANY),
        ("string-1mb", "1" * MEBI, QUANTITY), ("object", {"value": 2}, QUANTITY),
        ("list", [2], QUANTITY), ("boolean", True, QUANTITY),
    ]:
        add(f"gpu-quantity-{label}", orjson.dumps(review(gpu_pod(value))), both(outcome))
    # Zero asks for no GPU (as Kubernetes reads it): a plain pod, neutralized.
    for label, value in [("number-zero", 0), ("string-zero", "0"), ("string-zero-milli", "0m")]:
        add(f"gpu-quantity-{label}", orjson.dumps(review(gpu_pod(value))), NEUTRALIZED)
    add("gpu-request-nan-limit-ok", edited(_set(
        "request.object.spec.containers.0.resources.requests", {"nvidia.com/gpu": "NaN"})),
        both(QUANTITY))
    # 10^15 parses; the mutating webhook completes it, the validating one holds the cap.
    add("gpu-quantity-1e15", orjson.dumps(review(gpu_pod("1e15"))),
        (Allow(patch=True), Deny("at most 8")))

    # --- sizes and shapes that are legal JSON: a correct decision, promptly
    many = gpu_pod(1)
    many["spec"]["containers"] = [
        {"name": f"c{i}", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
        for i in range(5000)]
    add("5000-gpu-containers", orjson.dumps(review(many)),
        (Allow(patch=True), Deny("at most 8")))
    cpu_many = gpu_pod(None)
    cpu_many["spec"]["containers"] = [{"name": f"c{i}", "image": "x"} for i in range(5000)]
    add("5000-cpu-containers", orjson.dumps(review(cpu_many)), NEUTRALIZED)
    add("pod-name-1mb", edited(_set("request.object.metadata.name", "n" * MEBI)),
        (Allow(patch=True), Deny("tenant research's GPU pods must")))
    add("request-name-1mb", edited(_set("request.name", "n" * MEBI)),
        (Allow(patch=True), Deny("tenant research's GPU pods must")))
    add("unicode-names", orjson.dumps(review(
        {**gpu_pod(2), "metadata": {"name": "тренер-ü-🚀", "namespace": "research",
                                    "labels": {"ключ": "значение"}}})),
        (Allow(patch=True), Deny("tenant research's GPU pods must")))
    add("unicode-namespace-no-tenant", orjson.dumps(review(gpu_pod(2, "研究"),
                                                          namespace="研究")),
        both(Deny("tenant")))
    add("unicode-resource-is-not-a-gpu", orjson.dumps(review({
        **gpu_pod(None), "spec": {"containers": [{"name": "c", "resources": {
            "limits": {"nvidia.com/gpü": "2"}}}]}})), NEUTRALIZED)
    add("numbers-where-strings-belong", edited(lambda d: d["request"]["object"].update(
        metadata={"name": 7, "namespace": 8, "labels": {"gpu.example.com/product": 100},
                  "annotations": {"a": 1}},
        spec={"containers": [{"name": 9, "image": 10, "resources": {
            "limits": {"nvidia.com/gpu": 2}}}], "nodeSelector": {"zone": 1}})),
        (Allow(patch=True), Deny("tenant research's GPU pods must")))
    add("product-label-unknown", orjson.dumps(review({**gpu_pod(2), "metadata": {
        "name": "p", "labels": {"gpu.example.com/product": "tpu-v9"}}})),
        (Deny("tpu-v9"), Deny("tenant research's GPU pods must")))
    add("delete-without-object", edited(lambda d: d["request"].update(
        operation="DELETE", object=None)), both(Allow(patch=False)))
    add("unknown-kind", orjson.dumps(review({"apiVersion": "v1", "kind": "Secret",
                                            "data": {"a": "b"}},
                                           kind={"group": "", "version": "v1",
                                                 "kind": "Secret"})),
        both(Allow(patch=False)))
    add("non-gpu-pod-toleration-key-list", orjson.dumps(review(gpu_pod(
        None, tolerations=[{"key": ["nvidia.com/gpu"], "operator": "Exists"}]))),
        NEUTRALIZED)

    # --- raw bodies from corpus/
    for name, outcome in [
        ("not-json.txt", _bad(400, "not valid JSON")),
        ("binary.bin", _bad(400, "not valid JSON")),
        ("truncated.json", _bad(400, "not valid JSON")),
        ("trailing-garbage.json", _bad(400, "not valid JSON")),
        ("utf8-bom.json", _bad(400, "not valid JSON")),
        ("invalid-utf8.json", _bad(400, "not valid JSON")),
        ("lone-surrogate.json", _bad(400, "not valid JSON")),
        ("nan-literal.json", _bad(400, "not valid JSON")),
        ("number-1e400.json", _bad(400, "not valid JSON")),
    ]:
        add(f"corpus-{name}", (CORPUS / name).read_bytes(), outcome)
    # Duplicate keys: the last one wins, as in Go's encoding/json (the API server's own
    # decoder), so the webhook and the cluster read the same object.
    add("corpus-duplicate-uid.json", (CORPUS / "duplicate-uid.json").read_bytes(),
        NEUTRALIZED, uid="b")
    add("corpus-duplicate-gpu-limit.json", (CORPUS / "duplicate-gpu-limit.json").read_bytes(),
        (Allow(patch=True), Deny("asks for 100 GPUs")), uid="dup-gpu")
    add("corpus-number-bigint.json", (CORPUS / "number-bigint.json").read_bytes(),
        both(FAR_TOO_MANY), uid="bigint")
    return out


CASES = _cases()
