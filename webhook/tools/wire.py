"""``gpu-webhook admission-review``: the webhook's wire by hand, as the API server speaks it.

``-f MANIFEST`` wraps one object in the AdmissionReview (``admission.k8s.io/v1``) the API
server would send for its creation, to POST to ``/mutate`` or ``/validate`` with curl;
``--reply FILE`` reads what the webhook answered and prints it for a person: allowed or
denied with the message, the warnings, and the JSONPatch decoded from its base64, one
operation a line. Nothing here talks to a server.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.k8s.review import API_VERSION, request_review


class WireError(ValueError):
    """Input that is not one object, or not an AdmissionReview reply."""


def build(docs: list[Any], *, namespace: str | None, operation: str, dry_run: bool,
          user: str, groups: list[str]) -> bytes:
    """The AdmissionReview for the one object in ``docs``, as JSON."""
    if len(docs) != 1:
        raise WireError(f"one object per review, the file holds {len(docs)} (the API server "
                        "sends each object in its own review)")
    [doc] = docs
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        raise WireError("the document must be a Kubernetes object with apiVersion and kind")
    review = request_review(doc, uid=str(uuid.uuid4()), operation=operation,
                            namespace=namespace, username=user, groups=groups or None,
                            dry_run=dry_run)
    return orjson.dumps(review)


@dataclass(frozen=True)
class Reply:
    uid: str
    allowed: bool
    message: str
    code: int | None
    warnings: list[str]
    patch: list[dict[str, Any]] | None


def read_reply(body: bytes) -> Reply:
    """An AdmissionReview reply, its patch decoded."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"not JSON: {exc}") from None
    response = data.get("response") if isinstance(data, dict) else None
    if not isinstance(response, dict) or data.get("apiVersion") != API_VERSION:
        error = data.get("error") if isinstance(data, dict) else None
        if error:  # the webhook's answer to a malformed review (HTTP 4xx)
            raise WireError(f"the webhook refused the review itself: {error}")
        raise WireError(f"not an AdmissionReview reply ({API_VERSION} with a response)")
    patch: list[dict[str, Any]] | None = None
    if response.get("patch") is not None:
        if response.get("patchType") != "JSONPatch":
            raise WireError(f"patchType {response.get('patchType')!r}: only JSONPatch is "
                            "defined")
        try:
            decoded = orjson.loads(base64.b64decode(str(response["patch"]), validate=True))
        except (binascii.Error, orjson.JSONDecodeError) as exc:
            raise WireError(f"the patch is not base64 of a JSON list: {exc}") from None
        if not isinstance(decoded, list):
            raise WireError("the patch is not a JSON list of operations")
        patch = decoded
    raw_status = response.get("status")
    status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
    return Reply(uid=str(response.get("uid", "")), allowed=response.get("allowed") is True,
                 message=str(status.get("message", "")),
                 code=status.get("code") if isinstance(status.get("code"), int) else None,
                 warnings=[str(w) for w in response.get("warnings") or []], patch=patch)


def _value(value: Any) -> str:
    return orjson.dumps(value).decode()


def text(reply: Reply) -> str:
    """The reply as a person reads it."""
    if reply.allowed:
        lines = ["allowed"]
    else:
        lines = [f"denied{f' (HTTP {reply.code})' if reply.code else ''}: {reply.message}"]
    lines += [f"warning: {w}" for w in reply.warnings]
    if reply.patch is None:
        lines.append("no patch: the object is admitted as sent" if reply.allowed else "")
    else:
        lines.append(f"patch ({len(reply.patch)} JSONPatch operations, decoded):")
        for op in reply.patch:
            rest = {k: v for k, v in op.items() if k not in ("op", "path", "value")}
            parts = [str(op.get("op", "?")), str(op.get("path", "?"))]
            if "value" in op:
                parts.append(_value(op["value"]))
            if rest:
                parts.append(_value(rest))
            lines.append("  " + " ".join(parts))
    return "\n".join(line for line in lines if line)


def as_data(reply: Reply) -> dict[str, Any]:
    """The reply for ``-o json``: the patch decoded in place of its base64."""
    return {"uid": reply.uid, "allowed": reply.allowed, "message": reply.message or None,
            "code": reply.code, "warnings": reply.warnings, "patch": reply.patch}
