"""AdmissionReview replies: allow, deny, patch and warnings, echoing the request's
``uid`` and ``apiVersion`` as the API server requires.

``patchType``/``patch`` appear only when there is a patch, and never on the validating
path. Warnings are trimmed to what the API server passes on (it drops longer ones).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import orjson

from webhook.k8s.review import API_VERSION

MAX_WARNINGS = 20
MAX_WARNING_CHARS = 1024


def response(uid: str, allowed: bool, message: str = "", warnings: Sequence[str] = (),
             patch: Sequence[dict[str, Any]] = (), *, api_version: str = API_VERSION
             ) -> dict[str, Any]:
    """The reply to a decided review. A denial carries ``message`` (as a 403 status) and
    never a patch; the validating path passes no ``patch``."""
    body: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        body["status"] = {"code": 403, "reason": "Forbidden", "message": message}
    elif patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(orjson.dumps(list(patch))).decode("ascii")
    if warnings:
        body["warnings"] = [w[:MAX_WARNING_CHARS] for w in warnings[:MAX_WARNINGS]]
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": body}


def error_response(uid: str, message: str, *, api_version: str = API_VERSION,
                   code: int = 500) -> dict[str, Any]:
    """A reply for a review the webhook could not decide: denied, with the reason.
    Failing closed is the only safe answer for a policy engine."""
    return {
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "response": {
            "uid": uid,
            "allowed": False,
            "status": {"code": code, "reason": "InternalError", "message": message},
        },
    }
