"""The validating webhook's look at the routes to a GPU in the final object (a Pod at
creation, a DRA claim), to enforce only: what would be refused, or should have been
changed, had the mutating webhook run."""

from __future__ import annotations

from webhook.engine.claims import is_claim
from webhook.engine.decision import Checker, Decision, Finding
from webhook.engine.devices import ClaimLookup
from webhook.engine.routes.containers import charged_containers, describe, visible_devices_set
from webhook.engine.routes.devicetaints import claim_tolerations
from webhook.engine.routes.pods import pod
from webhook.engine.routes.rules import applies
from webhook.engine.routes.sights import Sights
from webhook.engine.target import NamespaceLabels, Targets, prepare
from webhook.k8s.objects import MalformedObject, child_list
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode


def recheck(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels,
            claims: ClaimLookup, sights: Sights, controller_users: frozenset[str],
            prepared: Targets | Decision | None = None) -> list[Finding]:
    """The validating webhook's look at the final object, to enforce only (as it does
    for every rule of the mutating phase): what would be refused, or should have been
    changed, had the mutating webhook run. A container given no GPU that sets the
    variable, one given GPUs that sets it at all, and the refusals. Nothing is changed
    and no warning is repeated. ``prepared``: the request's targets, when the caller
    has read them already (:func:`~webhook.engine.target.prepare`)."""
    if is_claim(req):
        return [f for f in claim_tolerations(req, policy, labels, controller_users).findings
                if f.mode is Mode.ENFORCE]
    if not (req.kind == "Pod" and req.group == "" and req.operation == "CREATE"):
        return []
    targets = prepared if prepared is not None else prepare(req, policy, labels, claims)
    if isinstance(targets, Decision):
        return []
    out: list[Finding] = []
    for rt in targets.roles:
        target = rt.target
        rules = applies(target)
        if rules is None or target.tenant is None:
            continue
        check = Checker(policy, target.tenant, target.subject, frozenset())
        spec, sptr = target.template.spec, target.template.spec_pointer
        try:
            charged = charged_containers(target)
            if rules.visible_devices != "allow":
                for key in ("initContainers", "containers"):
                    for i, c in enumerate(child_list(spec, key, sptr) or []):
                        if isinstance(c, dict):
                            visible_devices_set(check, c, f"{sptr}/{key}/{i}",
                                                describe(key, c, i),
                                                f"{key}/{i}" in charged)
            pod(check, policy, target, None, [], sights, req.username)
        except MalformedObject:
            continue  # the validating webhook's own rules say so
        out.extend(check.findings)
    return out
