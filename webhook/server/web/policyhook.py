"""``POST /validate-policy``: the validating webhook for GPUPolicy objects and the policy
ConfigMap.

The API server sends every CREATE and UPDATE of a GPUPolicy, and of the ConfigMap
``gpu-webhook-policy`` in the webhook's namespace (rendered by
``webhook.policy.apiserver.webhooks``); the answer allows it when the policy loader
accepts it and denies it with the loader's located messages otherwise
(``webhook.policy.review`` for an object, by field path; the ConfigMap's text by line,
as ``gpu-webhook policy check`` says of a file). It neither reads nor changes the policy
the replica serves: that follows the watch or the mounted file, not admission. Off the hot path, so
plain and synchronous: a policy check is a pydantic validation, well under the API
server's timeout.
"""

from __future__ import annotations

from typing import Any

from webhook.k8s.reply import response
from webhook.k8s.review import BadReview, parse_review
from webhook.policy.load import PolicyError, load_text
from webhook.policy.model import KIND
from webhook.policy.review import check_document

PATH = "/validate-policy"


def answer(body: bytes) -> tuple[int, dict[str, Any]]:
    """HTTP status and JSON reply for one AdmissionReview of a GPUPolicy object."""
    try:
        req = parse_review(body)
    except BadReview as exc:
        return exc.status, {"error": str(exc)}
    if req.kind == "ConfigMap" and req.object is not None:
        return 200, _configmap(req.uid, req.api_version, req.object)
    if req.kind != KIND or req.object is None:
        # DELETE (no object), or a kind sent here by a misconfigured rule: nothing to check.
        return 200, response(req.uid, True, api_version=req.api_version)
    problems = check_document(req.object)
    if not problems:
        return 200, response(req.uid, True, api_version=req.api_version)
    message = ("the policy does not load, so the webhook would refuse to serve it:\n"
               + "\n".join(problems))
    return 200, response(req.uid, False, message, api_version=req.api_version)


def _configmap(uid: str, api_version: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The policy ConfigMap: its policy file (the one ``*.yaml`` key) through the loader."""
    meta, data = obj.get("metadata"), obj.get("data")
    meta = meta if isinstance(meta, dict) else {}
    data = data if isinstance(data, dict) else {}
    where = f"configmap {meta.get('namespace', '')}/{meta.get('name', '')}"
    texts = [v for k, v in sorted(data.items()) if k.endswith((".yaml", ".yml"))
             and isinstance(v, str)]
    if not texts:
        return response(uid, False, f"{where} holds no policy: the replicas read its key "
                        "policy.yaml (a GPUPolicy document)", api_version=api_version)
    try:
        load_text(texts[0], where)
    except PolicyError as exc:
        return response(uid, False, "the policy does not load, so no replica would serve "
                        f"it (they keep the last good one):\n{exc}", api_version=api_version)
    return response(uid, True, api_version=api_version)
