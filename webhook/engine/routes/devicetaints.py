"""The DRA device-taint route: a tenant's ResourceClaim or ResourceClaimTemplate may not
tolerate device taints in its GPU requests (the driver taints GPUs it finds unhealthy)
unless the tenant allows it."""

from __future__ import annotations

from typing import Any

from webhook.engine import messages
from webhook.engine.decision import Checker, Decision, malformed
from webhook.engine.routes.rules import RULES
from webhook.engine.target import NamespaceLabels
from webhook.k8s import claims
from webhook.k8s.objects import MalformedObject, child_list, child_map
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule


def claim_tolerations(req: AdmissionRequest, policy: CompiledPolicy,
                      labels: NamespaceLabels, controller_users: frozenset[str]) -> Decision:
    """A ResourceClaim or template of a tenant: its GPU requests (``exactly`` and every
    ``firstAvailable`` subrequest) may not tolerate device taints unless the tenant
    allows it. A claim the resourceclaim controller makes from a template is not checked
    again: the template was."""
    obj = req.object
    if (req.operation != "CREATE" or obj is None or req.username in controller_users
            or policy.is_exempt(req.namespace, req.username, req.groups)):
        return Decision.skip("operation")
    tenant = policy.tenant_for(req.namespace, labels(req.namespace))
    if tenant is None or not tenant.routes.device_taint_tolerations:
        return Decision.skip("no-tenant")
    subject = f"{req.kind.lower()} {req.namespace}/{req.ident.shown(req.name) or '(unnamed)'}"
    check = Checker(policy, tenant, subject, RULES)
    try:
        found = claims.claim_spec(req.kind, obj)
        if found is None:
            return Decision.skip("operation")
        spec, ptr = found
        devices = child_map(spec, "devices", ptr)
        for i, r in enumerate(child_list(devices, "requests", ptr + "/devices") or []
                              if devices is not None else []):
            if not isinstance(r, dict):
                continue
            rname = r.get("name") if isinstance(r.get("name"), str) else str(i)
            parts: list[tuple[str, Any]] = []
            if isinstance(r.get("exactly"), dict):
                parts.append((f'device request "{rname}"', r["exactly"]))
            for j, sub in enumerate(r.get("firstAvailable") or ()):
                if isinstance(sub, dict):
                    sname = sub.get("name") if isinstance(sub.get("name"), str) else str(j)
                    parts.append((f'device request "{rname}/{sname}"', sub))
            for where, alt in parts:
                if alt.get("deviceClassName") not in policy.device_classes:
                    continue
                tols = [t for t in alt.get("tolerations") or () if isinstance(t, dict)]
                if tols:
                    check.report(Rule.DEVICE_TAINT_TOLERATIONS,
                                 messages.device_taint_tolerated(_toleration(tols[0])), where)
    except MalformedObject as exc:
        return malformed(subject, exc)
    return check.decide()


def _toleration(t: dict[str, Any]) -> str:
    key = t.get("key") or ""
    op = t.get("operator") or "Equal"
    if not key:
        return "operator Exists with no key: every taint"
    effect = t.get("effect") or "every effect"
    return f"key {key}, operator {op}, {effect}"
