"""The AdmissionReview wire format (``admission.k8s.io/v1``) and its parsing.

Two error channels are kept apart, as the API server expects: a review that is not a
well-formed AdmissionReview is the caller's bug and gets an HTTP 4xx (:class:`BadReview`);
a well-formed review of an object the policy refuses gets HTTP 200 with
``allowed: false``. Parsing never trusts a field's type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import orjson

from webhook.k8s.identity import ObjectId

API_VERSION = "admission.k8s.io/v1"
MAX_BODY_BYTES = 4 * 1024 * 1024  # etcd caps objects at ~1.5 MB; a review holds two + slack


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class RequestPayload(TypedDict):
    uid: str
    kind: GroupVersionKind
    resource: NotRequired[dict[str, str]]
    subResource: NotRequired[str]
    requestKind: NotRequired[GroupVersionKind]
    name: NotRequired[str]
    namespace: NotRequired[str]
    operation: str
    userInfo: NotRequired[UserInfo]
    object: NotRequired[dict[str, Any] | None]
    oldObject: NotRequired[dict[str, Any] | None]
    dryRun: NotRequired[bool]
    options: NotRequired[dict[str, Any] | None]


class ReviewPayload(TypedDict):
    apiVersion: str
    kind: str
    request: RequestPayload


class BadReview(ValueError):
    """A body that is not a usable AdmissionReview; ``status`` is the HTTP code to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        self.status = status
        super().__init__(message)


@dataclass(slots=True)
class AdmissionRequest:
    """The parts of a review the engine uses, with their types checked."""

    uid: str
    group: str
    version: str
    kind: str
    operation: str
    namespace: str
    name: str
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None = None
    sub_resource: str = ""
    # The resource the request is for (``request.resource``): for a subresource it names
    # the parent (``apps`` ``deployments`` for ``deployments/scale``), while ``kind`` is
    # the subresource's own kind (``autoscaling`` ``Scale``).
    resource_group: str = ""
    resource: str = ""
    username: str = ""
    groups: list[str] = field(default_factory=list)
    dry_run: bool = False
    api_version: str = API_VERSION
    # Who the object is (the old object's identity for a DELETE), read once here for
    # every step of the review; made again when ``dataclasses.replace`` swaps the object.
    ident: ObjectId = field(init=False)

    def __post_init__(self) -> None:
        self.ident = ObjectId.of(self.object if self.object is not None else self.old_object,
                                 self.namespace)


_OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})


def parse_review(body: bytes) -> AdmissionRequest:
    """Parse and check an AdmissionReview body; raise BadReview naming the problem."""
    if len(body) > MAX_BODY_BYTES:
        raise BadReview(f"request body is larger than {MAX_BODY_BYTES} bytes", 413)
    if not body:
        raise BadReview("empty request body: expected an AdmissionReview JSON object")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReview(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadReview("request body must be a JSON object (an AdmissionReview)")
    api_version = doc.get("apiVersion")
    if api_version != API_VERSION:
        raise BadReview(
            f"unsupported apiVersion {_short(api_version)}: this webhook speaks {API_VERSION}; "
            "set admissionReviewVersions: [v1] in the webhook configuration"
        )
    if doc.get("kind") != "AdmissionReview":
        raise BadReview(f"kind must be AdmissionReview, not {_short(doc.get('kind'))}")
    req = doc.get("request")
    if not isinstance(req, dict):
        raise BadReview("AdmissionReview has no request object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > 256:
        raise BadReview("request.uid must be a non-empty string")
    kind = req.get("kind")
    if not isinstance(kind, dict):
        raise BadReview("request.kind must be an object with group, version and kind")
    group, version, kname = kind.get("group", ""), kind.get("version"), kind.get("kind")
    if not isinstance(group, str) or not isinstance(version, str) or not isinstance(kname, str):
        raise BadReview("request.kind.group, .version and .kind must be strings")
    operation = req.get("operation")
    if not isinstance(operation, str) or operation not in _OPERATIONS:
        raise BadReview(f"request.operation must be one of {sorted(_OPERATIONS)}, "
                        f"not {_short(operation)}")
    obj = req.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise BadReview("request.object must be a JSON object")
    if obj is None and operation in ("CREATE", "UPDATE"):
        raise BadReview(f"request.object is required for {operation}")
    old = req.get("oldObject")
    if old is not None and not isinstance(old, dict):
        raise BadReview("request.oldObject must be a JSON object")
    namespace = _opt_str(req, "namespace")
    name = _opt_str(req, "name")
    sub = _opt_str(req, "subResource")
    resource_group, resource = _resource(req.get("resource"))
    user = req.get("userInfo") or {}
    if not isinstance(user, dict):
        raise BadReview("request.userInfo must be an object")
    username = user.get("username", "")
    groups = user.get("groups") or []
    if not isinstance(username, str) or not isinstance(groups, list) or not all(
        isinstance(g, str) for g in groups
    ):
        raise BadReview("request.userInfo.username must be a string and groups a list of strings")
    dry_run = req.get("dryRun", False)
    if dry_run is None:
        dry_run = False
    if not isinstance(dry_run, bool):
        raise BadReview("request.dryRun must be a boolean")
    return AdmissionRequest(
        uid=uid, group=group, version=version, kind=kname, operation=operation,
        namespace=namespace, name=name, object=obj, old_object=old, sub_resource=sub,
        resource_group=resource_group, resource=resource,
        username=username, groups=groups, dry_run=dry_run, api_version=api_version,
    )


def _opt_str(req: dict[str, Any], key: str) -> str:
    value = req.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadReview(f"request.{key} must be a string")
    return value


def _resource(value: object) -> tuple[str, str]:
    """(group, resource) of ``request.resource``; ("", "") when it is absent."""
    if value is None:
        return "", ""
    if not isinstance(value, dict):
        raise BadReview("request.resource must be an object with group, version and resource")
    group, resource = value.get("group", ""), value.get("resource", "")
    if not isinstance(group, str) or not isinstance(resource, str):
        raise BadReview("request.resource.group and .resource must be strings")
    return group, resource


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def request_review(req: dict[str, Any], *, uid: str = "00000000-0000-0000-0000-000000000000",
                   operation: str = "CREATE", namespace: str | None = None,
                   username: str = "developer", groups: list[str] | None = None,
                   dry_run: bool = False) -> ReviewPayload:
    """Wrap a manifest in an AdmissionReview as the API server would send it (used by
    ``review`` and the tests)."""
    api = str(req.get("apiVersion", "v1"))
    group, _, version = api.rpartition("/")
    meta_raw = req.get("metadata")
    meta: dict[str, Any] = meta_raw if isinstance(meta_raw, dict) else {}
    ns = namespace or str(meta.get("namespace") or "default")
    plural = str(req.get("kind", "")).lower() + "s"
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": str(req.get("kind", ""))},
            "resource": {"group": group, "version": version, "resource": plural},
            "requestKind": {"group": group, "version": version, "kind": str(req.get("kind", ""))},
            "name": str(meta.get("name") or ""),
            "namespace": ns,
            "operation": operation,
            "userInfo": {"username": username, "groups": groups or ["system:authenticated"]},
            "object": req,
            "oldObject": None,
            "dryRun": dry_run,
            "options": None,
        },
    }
