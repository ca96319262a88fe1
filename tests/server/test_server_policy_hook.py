"""``POST /validate-policy`` on a real ``gpu-webhook serve``: a GPUPolicy the loader
accepts is allowed, one it refuses is denied (HTTP 200, ``allowed: false``) with the
loader's located messages, and a body that is not an AdmissionReview is a 400."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml
from serverkit import review

ROOT = Path(__file__).resolve().parents[2]


def _policy() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "policies" / "multi-tenant.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _response(client: httpx.Client, obj: dict[str, Any]) -> dict[str, Any]:
    body = review(obj, uid="7d1c0f2a-5b7e-4a51-8f36-0c9b2d4e6a01")
    body["request"].pop("namespace", None)  # cluster-scoped
    r = client.post("/validate-policy", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "7d1c0f2a-5b7e-4a51-8f36-0c9b2d4e6a01"
    assert "patch" not in answer["response"]
    return dict(answer["response"])


def test_a_policy_that_loads_is_allowed(client: httpx.Client) -> None:
    assert _response(client, _policy())["allowed"] is True


def test_a_policy_that_does_not_load_is_denied_with_the_located_message(
        client: httpx.Client) -> None:
    doc = _policy()
    doc["spec"]["tenants"][0]["defaultProduct"] = "b200"
    resp = _response(client, doc)
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 403
    assert ("GPUPolicy shared-gpu-cluster: spec.tenants[0].defaultProduct: "
            "defaultProduct 'b200' is not in allowedProducts") in resp["status"]["message"]


def test_a_body_that_is_not_a_review_is_a_400(client: httpx.Client) -> None:
    r = client.post("/validate-policy", content=b"{}")
    assert r.status_code == 400
    assert "apiVersion" in r.json()["error"]


def _configmap(text: str | None) -> dict[str, Any]:
    cm: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "gpu-webhook-policy", "namespace": "gpu-webhook"}}
    if text is not None:
        cm["data"] = {"policy.yaml": text}
    return cm


def test_the_policy_configmap_is_checked_by_line_as_policy_check_says_of_a_file(
        client: httpx.Client) -> None:
    text = (ROOT / "policies" / "multi-tenant.yaml").read_text()
    assert _response(client, _configmap(text))["allowed"] is True
    bad = text.replace("gpus: 32", "gpus: lots", 1)
    line = bad[:bad.index("gpus: lots")].count("\n") + 1
    resp = _response(client, _configmap(bad))
    assert resp["allowed"] is False
    message = resp["status"]["message"]
    assert message.startswith("the policy does not load, so no replica would serve it")
    assert f"configmap gpu-webhook/gpu-webhook-policy:{line}: spec.tenants[" in message
    assert "must be a number (got 'lots')" in message
    empty = _response(client, _configmap(None))
    assert empty["allowed"] is False
    assert "holds no policy: the replicas read its key policy.yaml" in \
        empty["status"]["message"]
