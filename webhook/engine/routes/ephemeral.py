"""The ephemeral-container route: ``pods/ephemeralcontainers`` (``kubectl debug``), the
containers added checked as a Pod's containers are."""

from __future__ import annotations

from webhook.engine.decision import Checker, Decision, malformed, subject_of
from webhook.engine.routes.containers import describe, report_privileged, visible_devices
from webhook.engine.routes.rules import RULES
from webhook.engine.routes.sights import Sights
from webhook.engine.target import NamespaceLabels
from webhook.k8s.objects import MalformedObject, child_list, child_map
from webhook.k8s.patch import Patch
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy

SUBRESOURCE = "ephemeralcontainers"


def ephemeral(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels,
              sights: Sights) -> Decision:
    """``pods/ephemeralcontainers`` (``kubectl debug``): the containers added (the API
    server accepts no change to those already there) get ``void`` unless the tenant
    allows the variable, and are refused when privileged on a GPU node. An ephemeral
    container has no resources, so it is never given a GPU."""
    obj = req.object
    if req.operation != "UPDATE" or obj is None:
        return Decision.skip("operation")
    if policy.is_exempt(req.namespace, req.username, req.groups):
        return Decision.skip("exempt")
    tenant = policy.tenant_for(req.namespace, labels(req.namespace))
    if tenant is None:
        return Decision.skip("no-tenant")
    subject = subject_of("Pod", req.namespace, obj, req.name)
    rules = tenant.routes
    check = Checker(policy, tenant, subject, RULES)
    patch = Patch()
    try:
        spec = child_map(obj, "spec", "")
        if spec is None:
            return Decision.skip("operation")
        old_spec = (req.old_object or {}).get("spec")
        old = {e.get("name") for e in (old_spec.get("ephemeralContainers") or ())
               if isinstance(e, dict)} if isinstance(old_spec, dict) else set()
        node = spec.get("nodeName")
        has = sights.node_gpus(node) if isinstance(node, str) and node else None
        reach = None if has is False else (
            f'its node "{node}" carries GPUs' if has else
            f'its node "{node}" is not known to be without GPUs' if node else
            "it may be scheduled to a GPU node")
        added = [(i, c) for i, c in enumerate(child_list(spec, "ephemeralContainers", "/spec")
                                               or [])
                 if isinstance(c, dict) and c.get("name") not in old]
        for i, c in added:
            where = describe("ephemeralContainers", c, i)
            if rules.visible_devices != "allow":
                visible_devices(check, rules, c, f"/spec/ephemeralContainers/{i}", where,
                                False, patch)
        if reach is not None:
            report_privileged(check, rules,
                              [("ephemeralContainers", i, c) for i, c in added], reach)
    except MalformedObject as exc:
        return malformed(subject, exc)
    return check.decide(patch.ops, ["gpu-visible-devices"] if patch.ops else [])


def is_ephemeral(req: AdmissionRequest) -> bool:
    return req.kind == "Pod" and req.group == "" and req.sub_resource == SUBRESOURCE
