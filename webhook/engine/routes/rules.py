"""The rules the GPU routes' checks report, and the route rules that apply to a pod (or
pod template): its tenant's ``gpuRoutes``."""

from __future__ import annotations

from webhook.engine.target import Target
from webhook.policy.model import Rule
from webhook.policy.tenantrules import RouteRules

# The rules these checks report; the mutating webhook owns them.
RULES = frozenset({Rule.VISIBLE_DEVICES, Rule.PRIVILEGED, Rule.DEVICE_HOST_PATHS,
                   Rule.NODE_NAME, Rule.PRIORITY_CLASS, Rule.DEVICE_TAINT_TOLERATIONS})


def applies(target: Target) -> RouteRules | None:
    """The route rules of a pod's (or pod template's) tenant; None outside tenants'
    namespaces."""
    if target.tenant is None:
        return None
    return target.tenant.routes
