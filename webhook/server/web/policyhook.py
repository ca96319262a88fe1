"""``POST /validate-policy``: the validating webhook for GPUPolicy objects.

The API server sends every CREATE and UPDATE of a GPUPolicy (rendered by
``webhook.policy.apiserver.webhooks``); the answer allows it when the policy loader accepts it and
denies it with the loader's located messages otherwise (``webhook.policy.review``). It
neither reads nor changes the policy the replica serves: a GPUPolicy becomes the served
policy through the watch that reloads it, not through admission. Off the hot path, so
plain and synchronous: a policy check is a pydantic validation, well under the API
server's timeout.
"""

from __future__ import annotations

from typing import Any

from webhook.k8s.reply import response
from webhook.k8s.review import BadReview, parse_review
from webhook.policy.model import KIND
from webhook.policy.review import check_document

PATH = "/validate-policy"


def answer(body: bytes) -> tuple[int, dict[str, Any]]:
    """HTTP status and JSON reply for one AdmissionReview of a GPUPolicy object."""
    try:
        req = parse_review(body)
    except BadReview as exc:
        return exc.status, {"error": str(exc)}
    if req.kind != KIND or req.object is None:
        # DELETE (no object), or a kind sent here by a misconfigured rule: nothing to check.
        return 200, response(req.uid, True, api_version=req.api_version)
    problems = check_document(req.object)
    if not problems:
        return 200, response(req.uid, True, api_version=req.api_version)
    message = ("the policy does not load, so the webhook would refuse to serve it:\n"
               + "\n".join(problems))
    return 200, response(req.uid, False, message, api_version=req.api_version)
