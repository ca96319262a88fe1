"""Node placement: pinning a GPU pod to products and topology groups by node affinity.

Kubernetes ORs ``nodeSelectorTerms`` and ANDs the ``matchExpressions`` inside a term,
so a requirement is added to every term (appending a new term would widen placement,
not narrow it) except one that already complies: confined to the pinned values, or to
values the caller lets a term keep (ANDing the pinned values into a term that names
other allowed ones would leave that term no node and quietly take the pod's choice
away). ``nodeSelector`` ANDs with node affinity, so an allowed nodeSelector value already
satisfies the requirement on its own.

One review asks about a pod's placement many times: where it confines the product
label and the topology label, what it rules out, whether a pin leaves it a node, and
then the pins themselves. :class:`Placement` therefore reads the nodeSelector and walks
and validates the required terms once per pod spec, on first use (so a malformed term
is reported at the same point of the flow as when every question re-read the spec),
and keeps a per-key summary of each term that :meth:`Placement.pin` updates as it
appends to the term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.k8s.objects import MalformedObject, child_list, child_map
from webhook.k8s.patch import Patch

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_OPERATORS = ("In", "NotIn", "DoesNotExist")  # the operators that confine a key's values


@dataclass(slots=True)
class Restriction:
    """What a pod's own spec says about one node label."""

    source: str  # "nodeSelector" or "node affinity"
    values: frozenset[str]  # the values the pod can land on


@dataclass(slots=True)
class _KeyRule:
    """What the expressions of one term say about one label key."""

    within: frozenset[str] | None = None  # In: the intersection of its values (None: no In)
    banned: frozenset[str] = frozenset()  # NotIn: the union of its values
    absent: bool = False  # DoesNotExist: the term admits no value at all

    def admitted(self) -> frozenset[str] | None:
        """The values the term admits (None: the term does not restrict the key)."""
        if self.absent:
            return frozenset()
        if self.within is None:
            return None
        return self.within - self.banned


def _note(keys: dict[str, _KeyRule], expr: Any) -> None:
    """Fold one match expression into a term's per-key summary. Expressions that are
    not mappings, have no string key or use another operator (Exists, Gt, ...) are
    skipped: placement reasons only about the values In, NotIn and DoesNotExist name."""
    if not isinstance(expr, dict):
        return
    key, op = expr.get("key"), expr.get("operator")
    if not isinstance(key, str) or op not in _OPERATORS:
        return
    vals = expr.get("values")
    named = frozenset(v for v in vals if isinstance(v, str)) if isinstance(vals, list) else \
        frozenset()
    rule = keys.get(key)
    if rule is None:
        rule = keys[key] = _KeyRule()
    if op == "In":
        _narrow(rule, named)
    elif op == "NotIn":
        rule.banned |= named
    else:
        rule.absent = True


def _narrow(rule: _KeyRule, values: frozenset[str]) -> None:
    """Fold ``In values`` into a key's summary."""
    rule.within = values if rule.within is None else rule.within & values


@dataclass(slots=True)
class _Term:
    """One required node-selector term: the mapping in the spec (which a pin appends
    to) and the summary of its expressions by label key."""

    raw: dict[str, Any]
    keys: dict[str, _KeyRule]

    def admitted(self, key: str) -> frozenset[str] | None:
        rule = self.keys.get(key)
        return None if rule is None else rule.admitted()


def _parse(spec: dict[str, Any], ptr: str) -> list[_Term]:
    """The required node-affinity terms of ``spec``; raises MalformedObject for a level
    of the wrong JSON type (a term that is not a mapping, say)."""
    aff = child_map(spec, "affinity", ptr)
    na = child_map(aff, "nodeAffinity", ptr + "/affinity") if aff else None
    req = child_map(na, _REQUIRED, ptr + "/affinity/nodeAffinity") if na else None
    if not req:
        return []
    tptr = f"{ptr}/affinity/nodeAffinity/{_REQUIRED}"
    out: list[_Term] = []
    # Parsed JSON never shares an object between two places, but a Python caller could
    # list one term (or one expression list) twice; both entries then share a summary,
    # so a pin appended through one shows through the other, as it does in the spec.
    shared: dict[int, dict[str, _KeyRule]] = {}
    for i, t in enumerate(child_list(req, "nodeSelectorTerms", tptr) or ()):
        if not isinstance(t, dict):
            raise MalformedObject(f"{tptr}/nodeSelectorTerms/{i}", "a mapping")
        exprs = child_list(t, "matchExpressions", f"{tptr}/nodeSelectorTerms/{i}")
        ident = id(t) if exprs is None else id(exprs)
        keys = shared.get(ident)
        if keys is None:
            keys = shared[ident] = {}
            for expr in exprs or ():
                _note(keys, expr)
        out.append(_Term(t, keys))
    return out


class Placement:
    """The node placement of one pod spec: its nodeSelector and its required
    node-affinity terms, each read (and validated) once, when first needed.

    Only :meth:`pin` may change the terms while a Placement is in use; it keeps the
    summary in step, so a second pin (the topology label after the product label, which
    a policy could make the same key) sees what the first one appended.
    """

    __slots__ = ("_selector", "_selector_read", "_terms", "ptr", "spec")

    def __init__(self, spec: dict[str, Any], ptr: str) -> None:
        self.spec = spec
        self.ptr = ptr
        self._selector: dict[str, Any] | None = None
        self._selector_read = False
        self._terms: list[_Term] | None = None

    def selector(self) -> dict[str, Any] | None:
        """The pod's nodeSelector (raises MalformedObject if it is not a mapping)."""
        if not self._selector_read:
            self._selector = child_map(self.spec, "nodeSelector", self.ptr)
            self._selector_read = True
        return self._selector

    def _required(self) -> list[_Term]:
        if self._terms is None:
            self._terms = _parse(self.spec, self.ptr)
        return self._terms

    def restriction(self, key: str) -> Restriction | None:
        """Where the pod itself confines ``key``: its nodeSelector value, or the union of
        the values its affinity terms allow when every term restricts ``key``."""
        sel = self.selector()
        if sel is not None and isinstance(sel.get(key), str):
            return Restriction("nodeSelector", frozenset([sel[key]]))
        terms = self._required()
        if not terms:
            return None
        union: set[str] = set()
        for t in terms:
            vals = t.admitted(key)
            if vals is None:
                return None
            union |= vals
        return Restriction("node affinity", frozenset(union))

    def excluded(self, key: str) -> frozenset[str]:
        """Values of ``key`` that every required term rules out with ``NotIn``: pinning
        the pod to one of them would leave it no node at all."""
        out: frozenset[str] | None = None
        for term in self._required():
            rule = term.keys.get(key)
            banned = rule.banned if rule is not None else frozenset()
            out = banned if out is None else out & banned
        return out or frozenset()

    def survives(self, key: str, values: list[str]) -> bool:
        """Whether ANDing ``key In values`` into every term leaves the pod at least one
        term some node can satisfy. :meth:`pin` leaves some terms as they are, which can
        only keep more terms satisfiable, so True here holds after the pin too."""
        terms = self._required()
        if not terms:
            return True
        for term in terms:
            admitted = set(values)
            rule = term.keys.get(key)
            if rule is not None:
                if rule.absent:
                    continue
                if rule.within is not None:
                    admitted &= rule.within
                admitted -= rule.banned
            if admitted:
                return True
        return False

    def pin(self, key: str, values: list[str], patch: Patch,
            keep: frozenset[str] = frozenset()) -> bool:
        """AND ``key In values`` into every required node-affinity term that does not
        already confine ``key`` to a subset of ``values`` or of ``keep`` (values a term
        may name and still comply, though the pin would narrow a term left open to
        ``values``). A term that names some ``keep`` values and no ``values`` among
        others is narrowed to its ``keep`` values instead. Returns True if anything
        changed.

        The caller has checked for conflicts (:meth:`restriction`), so the pod can still
        land somewhere after this.
        """
        sel = self.selector()
        if sel is not None and (sel.get(key) in values or sel.get(key) in keep):
            return False
        wanted = frozenset(values)
        expr = {"key": key, "operator": "In", "values": list(values)}
        terms = self._required()
        if not terms:
            self._first_term(expr, _KeyRule(within=wanted), patch)
            return True
        changed = False
        for i, term in enumerate(terms):
            have = term.admitted(key)
            if have is not None and (have <= wanted or have <= keep):
                continue  # already compliant (or unsatisfiable, which adding cannot fix)
            narrow, here = wanted, list(values)
            if have is not None and not have & wanted and have & keep:
                # A term that names allowed values among others, none of them pinned
                # ones: keep its own allowed choice rather than AND in values it rules
                # out, which would leave it no node.
                narrow = have & keep
                here = sorted(narrow)
            # What _note would make of the expression appended (values are str).
            _narrow(self._and_in(i, term, dict(expr, values=here), patch), narrow)
            changed = True
        return changed

    def excludes(self, key: str, values: frozenset[str]) -> bool:
        """Whether the pod can land on no node whose ``key`` is one of ``values``: its
        nodeSelector names another value, or every required term rules them all out."""
        sel = self.selector()
        if sel is not None and isinstance(sel.get(key), str):
            return sel[key] not in values
        terms = self._required()
        return bool(terms) and all(_keeps_off(t, key, values) for t in terms)

    def exclude(self, key: str, values: list[str], patch: Patch) -> bool:
        """AND ``key NotIn values`` into every required node-affinity term that does not
        already keep the pod off those values (a new term when the pod has none).
        Returns True if anything changed."""
        banned = frozenset(values)
        if self.excludes(key, banned):
            return False
        sel = self.selector()
        if sel is not None and isinstance(sel.get(key), str):
            return False  # a nodeSelector on one of the values: the caller reports it
        expr = {"key": key, "operator": "NotIn", "values": list(values)}
        terms = self._required()
        if not terms:
            self._first_term(expr, _KeyRule(banned=banned), patch)
            return True
        for i, term in enumerate(terms):
            if not _keeps_off(term, key, banned):
                self._and_in(i, term, dict(expr), patch).banned |= banned
        return True

    def _first_term(self, expr: dict[str, Any], rule: _KeyRule, patch: Patch) -> None:
        """Give a pod without required node affinity one term holding ``expr``."""
        new: dict[str, Any] = {"matchExpressions": [expr]}
        patch.put(self.spec, self.ptr,
                  ("affinity", "nodeAffinity", _REQUIRED, "nodeSelectorTerms"), [new])
        # The new term is now the pod's only one (put stores it, not a copy).
        self._terms = [_Term(new, {expr["key"]: rule})]

    def _and_in(self, i: int, term: _Term, expr: dict[str, Any], patch: Patch) -> _KeyRule:
        """Append ``expr`` to required term ``i``; the term's rule for its key, to narrow
        as the expression does."""
        base = f"{self.ptr}/affinity/nodeAffinity/{_REQUIRED}/nodeSelectorTerms"
        patch.append(term.raw, "matchExpressions", f"{base}/{i}", expr)
        rule = term.keys.get(expr["key"])
        if rule is None:
            rule = term.keys[expr["key"]] = _KeyRule()
        return rule


def _keeps_off(term: _Term, key: str, values: frozenset[str]) -> bool:
    """Whether a term admits no node whose ``key`` is one of ``values``."""
    rule = term.keys.get(key)
    if rule is None:
        return False
    if rule.absent or values <= rule.banned:
        return True
    return rule.within is not None and not (rule.within - rule.banned) & values


def restriction(spec: dict[str, Any], ptr: str, key: str) -> Restriction | None:
    """:meth:`Placement.restriction` for a caller that asks about one key only."""
    return Placement(spec, ptr).restriction(key)
