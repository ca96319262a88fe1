"""Who a GPU pod is charged to within its tenant (``tenants[].userQuota``).

Pods are created by controllers, so by the time a pod is admitted the user behind it is
lost. The mutating webhook therefore records the requesting user (the review's
``userInfo.username``) on a workload at its CREATE, on the workload's metadata and on
each of its pod templates, in :data:`~webhook.policy.model.USER_ANNOTATION`,
overwriting whatever the object says; an UPDATE keeps what the CREATE recorded, so no
one moves a workload's pods onto someone else's account by editing it. The controller
copies the template's annotation onto every pod it makes.

On a pod the recorded user is believed only when the pod's creator is a controller
(:meth:`~webhook.policy.users.UserLimits.trusts`); a user who creates a bare pod is
charged as themselves, and the annotation is overwritten to say so, so the cluster
cache, which reads the annotation back, charges the pod as admission did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.engine.target import Target
from webhook.k8s.identity import ObjectId
from webhook.k8s.objects import child_map
from webhook.k8s.patch import Patch
from webhook.k8s.review import AdmissionRequest
from webhook.policy.model import USER_ANNOTATION
from webhook.policy.tenantrules import TenantRules


def recorded(meta: object) -> str | None:
    """The user recorded in an object's (or a template's) metadata, if any."""
    if not isinstance(meta, Mapping):
        return None
    ann = meta.get("annotations")
    return _user(ann.get(USER_ANNOTATION) if isinstance(ann, Mapping) else None)


def recorded_on(obj: ObjectId) -> str | None:
    """The user recorded on an object seen in the cluster (a pod, for the cache)."""
    return _user(obj.annotations.get(USER_ANNOTATION))


def _user(value: object) -> str | None:
    return value if isinstance(value, str) and value and len(value) <= 512 else None


def _earlier(req: AdmissionRequest) -> str | None:
    """What the workload's CREATE recorded, for an UPDATE."""
    if req.operation != "UPDATE" or req.old_object is None:
        return None
    return recorded(req.old_object.get("metadata"))


def charged_user(req: AdmissionRequest, tenant: TenantRules | None, target: Target
                 ) -> str | None:
    """The user the target's pods are charged to; None when the tenant caps no user, or
    a controller created the object and its template records no one."""
    if tenant is None or tenant.user_quota is None:
        return None
    if tenant.user_quota.trusts(req.username):
        return recorded(target.template.metadata)
    if not target.template.is_pod:
        earlier = _earlier(req)
        if earlier is not None:
            return earlier
    return req.username or None


def record(req: AdmissionRequest, target: Target, patch: Patch) -> bool:
    """Write the charged user on the object and its template (mutating webhook); True
    when something was written. Nothing is written for a controller's object: it keeps
    the user its template carries."""
    tenant = target.tenant
    if (tenant is None or tenant.user_quota is None or req.object is None
            or tenant.user_quota.trusts(req.username)):
        return False
    user = charged_user(req, tenant, target)
    if user is None:
        return False
    changed = _put(patch, target.template.holder, target.template.pointer, user)
    if not target.template.is_pod:
        changed |= _put(patch, req.object, "", user)
    return changed


def _put(patch: Patch, holder: dict[str, Any], ptr: str, user: str) -> bool:
    meta = child_map(holder, "metadata", ptr)
    if recorded(meta) == user:
        return False
    patch.put(holder, ptr, ("metadata", "annotations", USER_ANNOTATION), user)
    return True
