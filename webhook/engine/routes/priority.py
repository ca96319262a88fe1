"""The PriorityClass route: the classes a tenant's pod may name and a ceiling on their
value, so that no tenant's pod outranks (and preempts) another tenant's in-quota pod;
a pod that names none is given its tenant's default class."""

from __future__ import annotations

from typing import Any

from webhook.engine import messages
from webhook.engine.decision import Checker
from webhook.engine.routes.sights import Sights
from webhook.k8s.patch import Patch
from webhook.policy.model import Rule
from webhook.policy.tenantrules import TenantRules


def priority(check: Checker, tenant: TenantRules, spec: dict[str, Any], sptr: str,
             patch: Patch | None, sights: Sights) -> bool:
    """The pod's PriorityClass: one the tenant may name, at most its ceiling; a pod that
    names none gets the tenant's default. Whether the default was given.

    The API server's Priority plugin has resolved the class before the mutating webhooks
    run, so ``spec.priority`` is the class's value; offline the watch's value is used.
    A default class is written by name with the resolved fields removed, so the plugin,
    run again after a webhook changed the pod, resolves it."""
    rules = tenant.priority
    name = spec.get("priorityClassName")
    if not isinstance(name, str) or not name:
        if rules.default is None or patch is None:
            _ceiling(check, tenant, None, spec, sights)
            return False
        patch.set(spec, "priorityClassName", sptr, rules.default)
        for key in ("priority", "preemptionPolicy"):
            if key in spec:
                del spec[key]
                patch.ops.append({"op": "remove", "path": f"{sptr}/{key}"})
        return True
    if rules.allowed is not None and name not in rules.allowed:
        check.report(Rule.PRIORITY_CLASS, messages.priority_class_not_allowed(
            name, tenant.name, sorted(rules.allowed)))
        return False
    _ceiling(check, tenant, name, spec, sights)
    return False


def _ceiling(check: Checker, tenant: TenantRules, name: str | None, spec: dict[str, Any],
             sights: Sights) -> None:
    value = spec.get("priority")
    if isinstance(value, bool) or not isinstance(value, int):
        known = sights.priority_class(name) if name else None
        if known is None:
            return
        value = known[0]
    if value > tenant.priority.ceiling:
        allowed = sorted(tenant.priority.allowed) if tenant.priority.allowed else None
        check.report(Rule.PRIORITY_CLASS, messages.priority_above_ceiling(
            name, value, tenant.priority.ceiling, tenant.name, allowed))
