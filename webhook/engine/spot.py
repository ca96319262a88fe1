"""Spot capacity: which GPU pods go to spot (preemptible) nodes, and keeping every other
GPU pod off them.

A GPU pod is *fault tolerant* when it says so (the policy's label or annotation
``"true"``, or one of its PriorityClasses) or its tenant says so for all its pods; a
label or annotation ``"false"`` says it is not, whatever the defaults. Its tenant's
placement then decides:

- ``never``: no GPU pod of the tenant on spot;
- ``allowed``: fault-tolerant pods on spot (by required or preferred node affinity, as
  configured), the others kept off;
- ``required``: every GPU pod on spot, by required node affinity; a pod that says it
  is not fault tolerant is refused.

A pod sent to spot gets the spot nodes' tolerations and the node affinity; a pod kept
off gets ``<label> NotIn <spot values>`` in every required term (spot nodes of some
providers carry no taint, so a missing toleration alone would not keep it off) and
loses the spot tolerations it carries (or is refused, as ``podsToleratingSpot`` says).
Every change is made only when missing, so mutating its own output adds nothing.

The validating webhook re-checks the final pod (:func:`checked`), and quota counts a pod
as spot when its spec confines it to spot nodes: what the scheduler must honour. A pod
that merely prefers spot may land elsewhere and is counted as on-demand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.engine import messages
from webhook.engine.decision import Checker
from webhook.engine.placement import Placement
from webhook.engine.tolerations import add_missing, gpu_taint_tolerations
from webhook.k8s.objects import child_list, child_map
from webhook.k8s.patch import Patch
from webhook.k8s.workloads import PodTemplate
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule
from webhook.policy.spot import SpotRules, TenantSpotRules

_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True, slots=True)
class Verdict:
    """Where one pod template may go."""

    on_spot: bool  # sent to spot (its tenant allows it and it is fault tolerant, or must)
    required: bool  # by required node affinity (else preferred)
    why_not: str  # why it may not use spot (for messages), when not on_spot
    refused: str | None = None  # a pod that says "not fault tolerant" in a spot-only tenant
    bad: str | None = None  # a label or annotation that says neither "true" nor "false"


def _said(spot: SpotRules, template: PodTemplate) -> tuple[bool | None, str, str | None]:
    """What the pod's label (then annotation) says, where it says it, and the message
    for a value that is neither ``"true"`` nor ``"false"`` (then read as unsaid)."""
    meta = template.metadata
    if meta is None:
        return None, "", None
    for key, field in ((spot.ft_label, "labels"), (spot.ft_annotation, "annotations")):
        if key is None:
            continue
        m = child_map(meta, field, template.pointer + "/metadata")
        if m is None or key not in m:
            continue
        value = m[key]
        where = f"{field[:-1]} {key}"
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true", f'{where}: "{value}"', None
        return None, "", messages.spot_unclear(where, value)
    return None, "", None


def verdict(policy: CompiledPolicy, check: Checker, template: PodTemplate) -> Verdict:
    spot = policy.spot
    assert spot is not None
    tenant = check.tenant
    rules = (tenant.spot if tenant is not None and tenant.spot is not None
             else TenantSpotRules(spot.placement, False, spot.affinity, 1.0))
    said, where, bad = _said(spot, template)
    if rules.placement == "never":
        return Verdict(False, False, messages.spot_tenant_never(
            tenant.name if tenant is not None else None), bad=bad)
    if rules.placement == "required":
        return Verdict(True, True, "", messages.spot_only(
            tenant.name if tenant is not None else None, where) if said is False else None,
            bad)
    tolerant = said
    if tolerant is None:
        pc = template.spec.get("priorityClassName")
        tolerant = (isinstance(pc, str) and pc in spot.ft_priority_classes) \
            or rules.fault_tolerant
    why = "" if tolerant else messages.spot_not_fault_tolerant(messages.spot_how_to_say(
        spot.ft_label, spot.ft_annotation, spot.ft_priority_classes))
    return Verdict(tolerant, rules.affinity == "required", why, bad=bad)


def place(check: Checker, policy: CompiledPolicy, template: PodTemplate,
          placement: Placement, patch: Patch) -> list[str]:
    """Mutating phase: send the pod to spot or keep it off; returns the changes made."""
    spot = policy.spot
    assert spot is not None
    v = verdict(policy, check, template)
    if v.bad is not None:
        check.report(Rule.SPOT_PLACEMENT, v.bad)  # then placed as if it said nothing
    if v.refused is not None:
        check.report(Rule.SPOT_PLACEMENT, v.refused)
        return []
    if v.on_spot:
        return _onto_spot(check, spot, v, template, placement, patch)
    return _off_spot(check, spot, v, template, placement, patch)


def _onto_spot(check: Checker, spot: SpotRules, v: Verdict, template: PodTemplate,
               placement: Placement, patch: Patch) -> list[str]:
    """A pod that runs on spot nodes: their tolerations, and affinity to them (required or
    preferred), unless its own placement keeps it off spot."""
    own = placement.restriction(spot.label)
    ruled_out = (own is not None and not own.values & frozenset(spot.values)) or not (
        placement.survives(spot.label, list(spot.values)))
    if ruled_out:
        if v.required and _spot_only(check):
            check.report(Rule.SPOT_PLACEMENT, messages.spot_ruled_out(
                own.source if own else "node affinity", spot.label, spot.values,
                check.tenant.name if check.tenant else "-"))
        return []  # an allowed pod's own choice to stay off spot is kept
    changes: list[str] = []
    if add_missing(template.spec, template.spec_pointer, patch, spot.tolerations):
        changes.append("spot-tolerations")
    if v.required:
        pinned = placement.pin(spot.label, list(spot.values), patch)
    else:
        pinned = _prefer(template.spec, template.spec_pointer, spot, patch)
    if pinned:
        changes.append("spot-node-affinity")
    return changes


def _off_spot(check: Checker, spot: SpotRules, v: Verdict, template: PodTemplate,
              placement: Placement, patch: Patch) -> list[str]:
    """A pod kept off spot nodes: its spot tolerations stripped (or refused) and the spot
    nodes excluded, unless it asked for spot nodes alone (then told why not)."""
    own = placement.restriction(spot.label)
    if own is not None and own.values and own.values <= frozenset(spot.values):
        # Whatever the mode, the pod's own choice is left as it is: keeping it off spot
        # now would leave it no node at all.
        check.report(Rule.SPOT_PLACEMENT, messages.spot_asked(
            own.source, spot.label, sorted(own.values), v.why_not))
        return []
    spec, sptr = template.spec, template.spec_pointer
    changes: list[str] = []
    tolerations = child_list(spec, "tolerations", sptr) or []
    hits = gpu_taint_tolerations(tolerations, spot.keys)
    if hits:
        found = sorted({str(tolerations[i]["key"]) for i in hits})
        if spot.deny_tolerations:
            check.report(Rule.SPOT_PLACEMENT, messages.spot_tolerated(found, v.why_not))
            return []
        patch.remove_indices(spec, "tolerations", sptr, hits)
        changes.append("strip-spot-tolerations")
    if placement.exclude(spot.label, list(spot.values), patch):
        changes.append("spot-excluded")
    return changes


def _spot_only(check: Checker) -> bool:
    t = check.tenant
    return t is not None and t.spot is not None and t.spot.placement == "required"


def _prefer(spec: dict[str, Any], sptr: str, spot: SpotRules, patch: Patch) -> bool:
    """Add a preferred node-affinity term for spot nodes unless one is there already."""
    aff = child_map(spec, "affinity", sptr)
    na = child_map(aff, "nodeAffinity", sptr + "/affinity") if aff else None
    terms = child_list(na, _PREFERRED, sptr + "/affinity/nodeAffinity") if na else None
    values = set(spot.values)
    for term in terms or ():
        pref = term.get("preference") if isinstance(term, dict) else None
        exprs = pref.get("matchExpressions") if isinstance(pref, dict) else None
        for e in exprs if isinstance(exprs, list) else ():
            if (isinstance(e, dict) and e.get("key") == spot.label
                    and e.get("operator") == "In" and isinstance(e.get("values"), list)
                    and set(e["values"]) <= values):
                return False
    term_new = {"weight": spot.preferred_weight, "preference": {"matchExpressions": [
        {"key": spot.label, "operator": "In", "values": list(spot.values)}]}}
    if na is None or terms is None:
        patch.put(spec, sptr, ("affinity", "nodeAffinity", _PREFERRED), [term_new])
    else:
        patch.append(na, _PREFERRED, sptr + "/affinity/nodeAffinity", term_new)
    return True


def checked(check: Checker, policy: CompiledPolicy, template: PodTemplate,
            placement: Placement) -> bool:
    """Validating phase (and quota): re-check the final pod's spot placement; returns
    whether its spec confines it to spot nodes (what quota counts as spot)."""
    spot = policy.spot
    assert spot is not None
    values = frozenset(spot.values)
    own = placement.restriction(spot.label)
    pinned = own is not None and bool(own.values) and own.values <= values
    v = verdict(policy, check, template)
    if v.bad is not None:
        check.report(Rule.SPOT_PLACEMENT, v.bad)
    if v.refused is not None:
        check.report(Rule.SPOT_PLACEMENT, v.refused)
    elif v.on_spot:
        if v.required and _spot_only(check) and not pinned:
            check.report(Rule.SPOT_PLACEMENT, messages.spot_unpinned(
                spot.label, spot.values, check.tenant.name if check.tenant else "-"))
    else:
        tolerations = child_list(template.spec, "tolerations", template.spec_pointer) or []
        hits = gpu_taint_tolerations(tolerations, spot.keys)
        if pinned:
            assert own is not None
            check.report(Rule.SPOT_PLACEMENT, messages.spot_asked(
                own.source, spot.label, sorted(own.values), v.why_not))
        elif hits:
            check.report(Rule.SPOT_PLACEMENT, messages.spot_tolerated(
                sorted({str(tolerations[i]["key"]) for i in hits}), v.why_not))
        elif not placement.excludes(spot.label, values):
            check.report(Rule.SPOT_PLACEMENT, messages.spot_unguarded(
                spot.label, spot.values, v.why_not))
    return pinned
