"""Node placement: pinning a GPU pod to products and topology groups by node affinity.

Kubernetes ORs ``nodeSelectorTerms`` and ANDs the ``matchExpressions`` inside a term,
so a requirement is added to *every* term (appending a new term would widen placement,
not narrow it). ``nodeSelector`` ANDs with node affinity, so an allowed nodeSelector
value already satisfies the requirement on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.patch import MalformedObject, Patch, child_list, child_map

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass(slots=True)
class Restriction:
    """What a pod's own spec says about one node label."""

    source: str  # "nodeSelector" or "node affinity"
    values: frozenset[str]  # the values the pod can land on


def _terms(spec: dict[str, Any], ptr: str) -> list[dict[str, Any]]:
    aff = child_map(spec, "affinity", ptr)
    na = child_map(aff, "nodeAffinity", ptr + "/affinity") if aff else None
    req = child_map(na, _REQUIRED, ptr + "/affinity/nodeAffinity") if na else None
    if not req:
        return []
    tptr = f"{ptr}/affinity/nodeAffinity/{_REQUIRED}"
    terms = child_list(req, "nodeSelectorTerms", tptr) or []
    for i, t in enumerate(terms):
        if not isinstance(t, dict):
            raise MalformedObject(f"{tptr}/nodeSelectorTerms/{i}", "a mapping")
        # Checked here so that _term_values and pin can iterate it as a list.
        child_list(t, "matchExpressions", f"{tptr}/nodeSelectorTerms/{i}")
    return terms


def _term_values(term: dict[str, Any], key: str) -> frozenset[str] | None:
    """The values of ``key`` a term admits (None: the term does not restrict ``key``)."""
    allowed: frozenset[str] | None = None
    excluded: set[str] = set()
    for expr in term.get("matchExpressions") or ():
        if not isinstance(expr, dict) or expr.get("key") != key:
            continue
        op, vals = expr.get("operator"), expr.get("values") or []
        vals = frozenset(v for v in vals if isinstance(v, str)) if isinstance(vals, list) else \
            frozenset()
        if op == "In":
            allowed = vals if allowed is None else allowed & vals
        elif op == "NotIn":
            excluded |= vals
        elif op == "DoesNotExist":
            return frozenset()
    if allowed is None:
        return None
    return allowed - excluded


def restriction(spec: dict[str, Any], ptr: str, key: str) -> Restriction | None:
    """Where the pod itself confines ``key``: its nodeSelector value, or the union of the
    values its affinity terms allow when every term restricts ``key``."""
    sel = child_map(spec, "nodeSelector", ptr)
    if sel is not None and isinstance(sel.get(key), str):
        return Restriction("nodeSelector", frozenset([sel[key]]))
    terms = _terms(spec, ptr)
    if not terms:
        return None
    union: set[str] = set()
    for t in terms:
        vals = _term_values(t, key)
        if vals is None:
            return None
        union |= vals
    return Restriction("node affinity", frozenset(union))


def excluded(spec: dict[str, Any], ptr: str, key: str) -> frozenset[str]:
    """Values of ``key`` that every required term rules out with ``NotIn``: pinning the
    pod to one of them would leave it no node at all."""
    out: frozenset[str] | None = None
    for term in _terms(spec, ptr):
        banned: set[str] = set()
        for expr in term.get("matchExpressions") or ():
            if (isinstance(expr, dict) and expr.get("key") == key
                    and expr.get("operator") == "NotIn" and isinstance(expr.get("values"), list)):
                banned |= {v for v in expr["values"] if isinstance(v, str)}
        out = frozenset(banned) if out is None else out & banned
    return out or frozenset()


def survives(spec: dict[str, Any], ptr: str, key: str, values: list[str]) -> bool:
    """Whether pinning ``key In values`` (ANDed into every term, as :func:`pin` does)
    leaves the pod at least one term some node can satisfy."""
    terms = _terms(spec, ptr)
    if not terms:
        return True
    for term in terms:
        admitted: set[str] = set(values)
        for expr in term.get("matchExpressions") or ():
            if not isinstance(expr, dict) or expr.get("key") != key:
                continue
            op, vals = expr.get("operator"), expr.get("values")
            named = {v for v in vals if isinstance(v, str)} if isinstance(vals, list) else set()
            if op == "In":
                admitted &= named
            elif op == "NotIn":
                admitted -= named
            elif op == "DoesNotExist":
                admitted = set()
        if admitted:
            return True
    return False


def pin(spec: dict[str, Any], ptr: str, key: str, values: list[str], patch: Patch) -> bool:
    """AND ``key In values`` into every required node-affinity term that does not already
    confine ``key`` to a subset of ``values``. Returns True if anything changed.

    The caller has checked for conflicts (:func:`restriction`), so the pod can still
    land somewhere after this.
    """
    sel = child_map(spec, "nodeSelector", ptr)
    if sel is not None and sel.get(key) in values:
        return False
    wanted = frozenset(values)
    expr = {"key": key, "operator": "In", "values": list(values)}
    terms = _terms(spec, ptr)
    if not terms:
        patch.put(spec, ptr, ("affinity", "nodeAffinity", _REQUIRED, "nodeSelectorTerms"),
                  [{"matchExpressions": [expr]}])
        return True
    changed = False
    base = f"{ptr}/affinity/nodeAffinity/{_REQUIRED}/nodeSelectorTerms"
    for i, term in enumerate(terms):
        have = _term_values(term, key)
        if have is not None and (have <= wanted):
            continue  # already narrow enough (or unsatisfiable, which adding cannot fix)
        patch.append(term, "matchExpressions", f"{base}/{i}", dict(expr, values=list(values)))
        changed = True
    return changed
