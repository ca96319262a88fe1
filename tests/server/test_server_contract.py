"""The HTTPS contract the API server relies on, checked against a real ``gpu-webhook serve``.

Each test speaks to the running server over TLS (verifying its CA) as kube-apiserver
does: the reply echoes uid/apiVersion/kind, carries a JSON Patch only when there is
something to change and never from /validate, a policy denial is HTTP 200 with
``allowed: false``, and a body that is not an AdmissionReview is a 4xx with a JSON
``error`` after which the server keeps answering.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import httpx
import jsonpatch
import orjson
import pytest
from kit import Server
from serverkit import pod, review

RESEARCH_PINNED = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                   "topology.example.com/gpu-rack": "rack-a"}


def _answer(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    return dict(body["response"])


def _mutated(client: httpx.Client, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the API server would store it after the mutating webhook."""
    resp = _answer(client.post("/mutate", json=review(obj)))
    assert resp["allowed"], resp
    if "patch" not in resp:
        return obj
    ops = orjson.loads(base64.b64decode(resp["patch"]))
    return dict(jsonpatch.apply_patch(copy.deepcopy(obj), ops))


# ---------------------------------------------------------------- the reply envelope

def test_a_forwarded_address_is_not_trusted_and_no_server_header_is_sent(
        server: Server, client: httpx.Client) -> None:
    # A caller on the webhook's own host cannot write another address into its log
    # lines, and a scanner is not told what serves the webhook.
    r = client.post("/mutate", content=b"not an AdmissionReview",
                    headers={"content-type": "application/json",
                             "x-forwarded-for": "203.0.113.9"})
    assert r.status_code == 400
    assert "server" not in r.headers
    lines = [json.loads(line) for line in server.log_path.read_text().splitlines()
             if '"bad review"' in line]
    assert lines and lines[-1]["client"].startswith("127.0.0.1:"), lines[-1:]



@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize("obj", [pod(), pod(gpus=None), pod(namespace="no-tenant-here")],
                         ids=["gpu-pod", "cpu-pod", "denied-pod"])
def test_reply_echoes_uid_api_version_and_kind(client: httpx.Client, path: str,
                                               obj: dict[str, Any]) -> None:
    uid = "0d6a1f0e-9f4e-4a57-bb2e-5f0c2d9b7a11"
    r = client.post(path, json=review(obj, uid=uid))
    assert r.status_code == 200
    body = r.json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == uid
    assert isinstance(body["response"]["allowed"], bool)


# ---------------------------------------------------------------- patches

def test_gpu_pod_needing_mutation_gets_a_base64_json_patch(client: httpx.Client) -> None:
    obj = pod(gpus=2)
    resp = _answer(client.post("/mutate", json=review(obj)))
    assert resp["allowed"] is True
    assert resp["patchType"] == "JSONPatch"
    ops = orjson.loads(base64.b64decode(resp["patch"], validate=True))
    assert isinstance(ops, list) and ops
    patched = jsonpatch.apply_patch(copy.deepcopy(obj), ops)
    main = patched["spec"]["containers"][0]
    assert main["resources"]["requests"] == {"nvidia.com/gpu": 2}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        patched["spec"]["tolerations"]
    terms = patched["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "nvidia.com/gpu.product", "operator": "In",
            "values": ["NVIDIA-A100-SXM4-80GB"]} in terms[0]["matchExpressions"]


def _neutralized_cpu_pod() -> dict[str, Any]:
    p = pod(gpus=None)
    p["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    return p


@pytest.mark.parametrize("obj", [
    _neutralized_cpu_pod(),  # a tenant's pod without GPUs that already shows none
    pod(gpus=None, namespace="no-tenant-here"),
    pod(namespace="kube-system"),  # exempt namespace
], ids=["cpu-pod", "cpu-pod-outside-tenants", "exempt-namespace"])
def test_nothing_to_change_means_no_patch_fields(client: httpx.Client,
                                                obj: dict[str, Any]) -> None:
    resp = _answer(client.post("/mutate", json=review(obj)))
    assert resp["allowed"] is True
    assert "patch" not in resp
    assert "patchType" not in resp


@pytest.mark.parametrize("obj", [
    pod(gpus=1),
    pod("dev", "research-dev", gpus="1"),
    pod("nb", "notebooks", gpus=None) | {"spec": {"containers": [
        {"name": "nb", "image": "jupyter",
         "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]}},
], ids=["research", "research-dev", "notebook-mig"])
def test_already_mutated_pod_gets_no_patch(client: httpx.Client, obj: dict[str, Any]) -> None:
    once = _mutated(client, obj)
    assert once != obj, "the first pass should have changed the pod"
    resp = _answer(client.post("/mutate", json=review(once)))
    assert resp["allowed"] is True
    assert "patch" not in resp and "patchType" not in resp


@pytest.mark.parametrize("obj", [
    pod(gpus=2),  # needs mutation: /validate judges it but never patches it
    pod(gpus=None),
    pod(gpus=2, nodeSelector=RESEARCH_PINNED),
    pod(gpus=9, nodeSelector=RESEARCH_PINNED),
], ids=["unmutated-gpu-pod", "cpu-pod", "pinned-gpu-pod", "over-max-pod"])
def test_validate_never_patches(client: httpx.Client, obj: dict[str, Any]) -> None:
    resp = _answer(client.post("/validate", json=review(obj)))
    assert "patch" not in resp
    assert "patchType" not in resp


# ---------------------------------------------------------------- verdicts

@pytest.mark.parametrize(("path", "obj", "message"), [
    ("/mutate", pod(namespace="no-tenant-here"),
     # In memory (no cluster), a namespace's labels are unknown: the example policy's
     # tenant chosen by labels could not be tried, and the message says so.
     r'namespace "no-tenant-here" is in no tenant\'s namespaces, and the webhook does not '
     r'know its labels, so the tenants chosen by namespace labels \(inference\) cannot '
     r'match it.*\[rule tenant-required'),
    ("/mutate", pod() | {"spec": {"containers": [{"name": "main", "image": "x", "resources": {
        "requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}}]}},
     r"request 1 differs from limit 2.*\[rule gpu-requests-match-limits, tenant research\]"),
    ("/mutate", pod(gpus="1.5"), r"\[rule gpu-whole-number"),
    ("/mutate", pod() | {"metadata": {"name": "t", "namespace": "research",
                                      "labels": {"gpu.example.com/product": "l4"}}},
     r'GPU product "l4".*tenant research may not use'),
    ("/validate", pod(gpus=9, nodeSelector=RESEARCH_PINNED),
     r"asks for 9 GPUs; tenant research allows at most 8 GPUs per container"),
    ("/validate", pod(gpus=2), r"must be pinned.*\[rule allowed-products, tenant research\]"),
], ids=["no-tenant", "request-differs", "fractional", "product-not-allowed", "over-max",
        "unpinned"])
def test_denial_is_http_200_with_403_status_and_message(
        client: httpx.Client, path: str, obj: dict[str, Any], message: str) -> None:
    resp = _answer(client.post(path, json=review(obj)))
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 403
    assert re.search(message, resp["status"]["message"], re.S), resp["status"]["message"]
    assert "patch" not in resp and "patchType" not in resp


def test_warn_mode_allows_with_a_warning_kubectl_prints(client: httpx.Client) -> None:
    # notebooks is in warn mode and allows 1 GPU per pod: 4 x 3g.40gb weigh 2 GPUs.
    obj = pod("big-notebook", "notebooks", gpus=None,
              nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    obj["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/mig-3g.40gb": 4}, "requests": {"nvidia.com/mig-3g.40gb": 4}}
    resp = _answer(client.post("/validate", json=review(obj)))
    assert resp["allowed"] is True
    assert any("tenant notebooks allows at most 1 GPU per pod" in w for w in resp["warnings"])


# ---------------------------------------------------------------- malformed input

def _valid() -> dict[str, Any]:
    return review(pod())


def _without(*path: str) -> bytes:
    doc = _valid()
    holder: Any = doc
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    return orjson.dumps(doc)


def _with(value: object, *path: str) -> bytes:
    doc = _valid()
    holder: Any = doc
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return orjson.dumps(doc)


MALFORMED = [
    ("not-json", b"this is not json", 400, "not valid JSON"),
    ("truncated-json", orjson.dumps(_valid())[:-40], 400, "not valid JSON"),
    ("json-array", orjson.dumps([_valid()]), 400, "must be a JSON object"),
    ("json-string", b'"AdmissionReview"', 400, "must be a JSON object"),
    ("missing-request", _without("request"), 400, "no request object"),
    ("request-null", _with(None, "request"), 400, "no request object"),
    ("missing-uid", _without("request", "uid"), 400, "request.uid"),
    ("uid-not-string", _with(12345, "request", "uid"), 400, "request.uid"),
    ("uid-empty", _with("", "request", "uid"), 400, "request.uid"),
    ("v1beta1", _with("admission.k8s.io/v1beta1", "apiVersion"), 400,
     "unsupported apiVersion 'admission.k8s.io/v1beta1'"),
    ("wrong-kind", _with("Pod", "kind"), 400, "kind must be AdmissionReview"),
    ("object-not-object", _with(["a", "pod"], "request", "object"), 400,
     "request.object must be a JSON object"),
    ("object-string", _with("pod", "request", "object"), 400,
     "request.object must be a JSON object"),
    ("create-without-object", _without("request", "object"), 400,
     "request.object is required for CREATE"),
    ("bad-operation", _with("PATCH", "request", "operation"), 400, "request.operation"),
    ("groups-not-list", _with({"username": "u", "groups": "admins"}, "request", "userInfo"),
     400, "groups a list of strings"),
    ("empty-body", b"", 400, "empty request body"),
    ("oversized", b"{" + b" " * (4 * 1024 * 1024) + b"}", 413, "larger than"),
]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(("body", "status", "error"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_review_is_4xx_with_json_error_and_server_keeps_serving(
        server: Server, path: str, body: bytes, status: int, error: str) -> None:
    c = server.client()
    r = c.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert error in r.json()["error"]
    # The next review, on a fresh connection and on the same one if it survived, works.
    fresh = server.client()
    assert _answer(fresh.post(path, json=_valid()))["uid"] == _valid()["request"]["uid"]
    assert c.get("/healthz").status_code == 200


# ---------------------------------------------------------------- control endpoints

def test_healthz(client: httpx.Client) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_readyz_names_the_policy_and_generation(client: httpx.Client) -> None:
    r = client.get("/readyz")
    assert r.status_code == 200
    body = r.json()
    assert body["ready"] is True
    assert body["policy"] == "shared-gpu-cluster"
    assert body["generation"] == 1
    assert body["lastReloadError"] is None


def _admissions(client: httpx.Client, webhook: str) -> float:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    total = 0.0
    for line in r.text.splitlines():
        if line.startswith("gpu_webhook_admission_requests_total{") and \
                f'webhook="{webhook}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_metrics_count_admission_requests(client: httpx.Client, path: str) -> None:
    before = _admissions(client, path[1:])
    for obj in (pod(), pod(gpus=None), pod(namespace="no-tenant-here")):
        _answer(client.post(path, json=review(obj)))
    assert _admissions(client, path[1:]) == before + 3


def test_metrics_name_the_policy_generation(client: httpx.Client) -> None:
    text = client.get("/metrics").text
    assert re.search(r"^gpu_webhook_policy_generation 1(\.0)?$", text, re.M)


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/mutate"), ("GET", "/validate"), ("PUT", "/mutate"), ("POST", "/nothing"),
    ("GET", "/"),
])
def test_other_methods_and_paths_are_not_admission(client: httpx.Client, method: str,
                                                   path: str) -> None:
    r = client.request(method, path)
    assert r.status_code in (404, 405)


def test_keep_alive_reuses_one_connection(server: Server) -> None:
    c = server.client()
    peers = set()
    for _ in range(5):
        with c.stream("POST", "/mutate", json=review(pod())) as r:
            assert r.status_code == 200
            stream = r.extensions["network_stream"]
            peers.add(stream.get_extra_info("client_addr"))
            r.read()
    assert len(peers) == 1


def test_plain_http_is_refused(server: Server) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"http://127.0.0.1:{server.port}/mutate", json=review(pod()), timeout=5)


def test_start_up_says_that_tenants_chosen_by_labels_cannot_match_without_a_cluster(
        server: Server) -> None:
    # The example policy chooses the inference tenant by namespace labels; this server
    # has no cluster to read them from, and its first log lines say so.
    line = next(json.loads(ln) for ln in server.log().splitlines()
                if "tenants chosen by namespace labels cannot match" in ln)
    assert line["level"] == "warning" and line["tenants"] == ["inference"]


def gc_collected(client: httpx.Client) -> float:
    return sum(float(ln.split()[1]) for ln in client.get("/metrics").text.splitlines()
               if ln.startswith("python_gc_objects_collected_total{"))


def test_reviews_leave_nothing_for_the_garbage_collector(server: Server) -> None:
    # Every collection pass stops the event loop: a review that left a reference cycle
    # (a response's transport and its request cycle pointing at each other did) puts a
    # pass every few dozen reviews into the latency tail.
    with server.client() as client:
        before = gc_collected(client)
        for _ in range(1000):
            assert client.post("/mutate", json=review(pod())).status_code == 200
        assert gc_collected(client) - before < 1000  # one object a review at most


def test_start_up_moves_its_long_lived_objects_out_of_garbage_collection(
        client: httpx.Client) -> None:
    # Full collections walk only what was made since (webhook.server.heap): the metric
    # says how much was frozen.
    metrics = client.get("/metrics").text
    [line] = [ln for ln in metrics.splitlines()
              if ln.startswith("gpu_webhook_heap_frozen_objects ")]
    assert float(line.split()[1]) > 10_000  # modules, the client library, the policy
