"""A scope's MutatingAdmissionPolicy: GPU requests completed, the GPU tolerations added
(or stripped from pods without GPUs), the tenant's product and topology node affinity
ANDed into a GPU pod that names neither, ``NVIDIA_VISIBLE_DEVICES`` neutralized, and the
changes recorded in the ``gpu-webhook.dev/mutated`` annotation, as the mutating webhook
makes them (``webhook.engine.mutate``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.admission.native.cel import (
    NEUTRAL_VALUE,
    bind,
    completion_ops,
    covers,
    env,
    is_harmless,
    is_neutral,
    is_visible,
    quote,
    toleration_value,
)
from webhook.admission.native.scoped import API_VERSION, POD_RULES, Scoped
from webhook.engine.decision import PROVENANCE_ANNOTATION
from webhook.policy.apiserver.cel import string_list
from webhook.policy.model import TolerationPolicy

# The typed objects of a pod's required node affinity, for JSON Patch values.
_NODE = "Object.spec.affinity.nodeAffinity"
_REQ = f"{_NODE}.requiredDuringSchedulingIgnoredDuringExecution"
_TERM = f"{_REQ}.nodeSelectorTerms"
_EXPR = f"{_TERM}.matchExpressions"


class Mutating(Scoped):
    """The scope's MutatingAdmissionPolicy."""

    # ---------------------------------------------------------------- mutating
    def mutating(self) -> dict[str, Any]:
        variables = [{"name": "here", "expression": self.scope.here},
                     *self._gpu_variables()]
        groups: list[tuple[str, str]] = [
            ("gpu-requests", f"variables.gpu ? {self._completion()} : []"),
            ("gpu-tolerations", f"variables.gpu ? {self._tolerations()} : []")]
        pins = self._affinity()
        if pins is not None:
            groups.append(("gpu-node-affinity", pins))
        if self.policy.non_gpu_tolerations is TolerationPolicy.STRIP and self.keys:
            groups.append(("strip-gpu-tolerations",
                           f"variables.gpu ? [] : {self._strip()}"))
        if self.tenant is not None and self.tenant.routes.visible_devices != "allow":
            groups.append(("gpu-visible-devices", self._visible()))
        # JSONPatch values can be built only in the mutation itself, not in variables:
        # each group's operations are bound once, as one list per change.
        changes = " + ".join(f"(size(ops[{i}]) > 0 ? [{quote(c)}] : [])"
                             for i, (c, _) in enumerate(groups))
        listed = ", ".join(ops for _, ops in groups)
        mutation = ("!variables.here ? [] : " + bind(
            "ops", f"[{listed}]", "ops.flatten() + " + bind(
                "changes", changes, self._annotation("changes"))))
        return {"apiVersion": API_VERSION, "kind": "MutatingAdmissionPolicy",
                "metadata": self._meta(),
                "spec": {"failurePolicy": self.mutating_failure,
                         "matchConstraints": {"resourceRules": POD_RULES},
                         "matchConditions": self._conditions(),
                         "variables": variables,
                         "mutations": [{"patchType": "JSONPatch",
                                        "jsonPatch": {"expression": mutation}}],
                         # A webhook may add a container after this ran.
                         "reinvocationPolicy": "IfNeeded"}}

    def pinned(self) -> list[tuple[str, list[str]]]:
        """The node-label requirements the mutating webhook ANDs into every required
        node-affinity term of a GPU pod of this scope that names none of those labels
        (``webhook.engine.pinning``): the tenant's default product (else its allowed
        ones), then its topology group. None compiled where spot placement or GPU
        capabilities would add terms of their own after them."""
        t, p = self.tenant, self.policy
        if t is None or p.spot is not None or p.capabilities is not None:
            return []
        out: list[tuple[str, list[str]]] = []
        products = ([t.default_product] if t.default_product
                    else list(t.allowed_products) if t.allowed_products else [])
        if products:
            out.append((p.product_label, [p.product_value[x] for x in products]))
        if t.topology_label is not None and t.topology_values:
            out.append((t.topology_label, list(t.topology_values)))
        return out

    def _affinity(self) -> str | None:
        """A GPU pod that names no product or topology label (no nodeSelector on them,
        no required term's expression, no product asked by label or annotation) gets the
        requirements ANDed into every required term, or one term holding them; a pod
        that names them is left to the webhook (its own choice is weighed there)."""
        pins = self.pinned()
        if not pins:
            return None
        p, t = self.policy, self.tenant
        assert t is not None
        keys = string_list(sorted({p.product_label, *([t.topology_label]
                                                      if t.topology_label else [])}))
        req = "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        has_req = ("has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && "
                   f"has({req})")
        terms = f"({has_req} && has({req}.nodeSelectorTerms) ? {req}.nodeSelectorTerms : [])"
        named = [f"(has(object.spec.nodeSelector) && "
                 f"object.spec.nodeSelector.exists(k, k in {keys}))",
                 f"{terms}.exists(t, has(t.matchExpressions) && "
                 f"t.matchExpressions.exists(e, e.key in {keys}))"]
        for key, field in ((p.product_request_label, "labels"),
                           (p.product_request_annotation, "annotations")):
            if key is not None:
                named.append(f"(has(object.metadata.{field}) && "
                             f"{quote(key)} in object.metadata.{field})")
        exprs = [f"{_EXPR}{{key: {quote(k)}, operator: 'In', values: {string_list(v)}}}"
                 for k, v in pins]
        term = f"{_TERM}{{matchExpressions: [{', '.join(exprs)}]}}"
        base = "'/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution'"
        first = (
            f"!has(object.spec.affinity) ? [JSONPatch{{op: 'add', path: '/spec/affinity', "
            f"value: Object.spec.affinity{{nodeAffinity: {_NODE}{{"
            f"requiredDuringSchedulingIgnoredDuringExecution: {_REQ}{{nodeSelectorTerms: "
            f"[{term}]}}}}}}}}] : "
            f"!has(object.spec.affinity.nodeAffinity) ? [JSONPatch{{op: 'add', path: "
            f"'/spec/affinity/nodeAffinity', value: {_NODE}{{"
            f"requiredDuringSchedulingIgnoredDuringExecution: {_REQ}{{nodeSelectorTerms: "
            f"[{term}]}}}}}}] : "
            f"!has({req}) ? [JSONPatch{{op: 'add', path: {base}, value: {_REQ}{{"
            f"nodeSelectorTerms: [{term}]}}}}] : "
            f"[JSONPatch{{op: 'add', path: {base} + '/nodeSelectorTerms', value: [{term}]}}]")
        each = ("lists.range(size(ts)).map(i, has(ts[i].matchExpressions) ? ["
                + ", ".join(f"JSONPatch{{op: 'add', path: {base} + '/nodeSelectorTerms/' + "
                            f"string(i) + '/matchExpressions/-', value: {e}}}" for e in exprs)
                + f"] : [JSONPatch{{op: 'add', path: {base} + '/nodeSelectorTerms/' + "
                  f"string(i) + '/matchExpressions', value: [{', '.join(exprs)}]}}]).flatten()")
        ops = bind("ts", terms, f"size(ts) == 0 ? ({first}) : {each}")
        return f"variables.gpu && !({' || '.join(named)}) ? {ops} : []"

    def _completion(self) -> str:
        return self._each(lambda _k, c, ptr: completion_ops(c, ptr, self._gpu(c)))

    def _tolerations(self) -> str:
        missing = " + ".join(
            f"(tols.exists(h, {covers('h', w)}) ? [] : [{toleration_value(w)}])"
            for w in self.policy.tolerations) or "[]"
        missing = bind("tols", "(has(object.spec.tolerations) ? object.spec.tolerations : [])",
                       missing)
        return bind("m", missing,
                    "size(m) == 0 ? [] : has(object.spec.tolerations) ? "
                    "m.map(t, JSONPatch{op: 'add', path: '/spec/tolerations/-', value: t}) : "
                    "[JSONPatch{op: 'add', path: '/spec/tolerations', value: m}]")

    def _strip(self) -> str:
        return removals("(has(object.spec.tolerations) ? object.spec.tolerations : [])",
                        "'/spec/tolerations'", self._gpu_key)

    def _visible(self) -> str:
        assert self.tenant is not None
        deny = self.tenant.routes.visible_devices == "deny"

        def ops(_key: str, c: str, ptr: str) -> str:
            # The container's env read from the object once (see cel.gpu_names).
            return bind("ev", env(c), body(c, ptr, "ev"))

        def body(c: str, ptr: str, e: str) -> str:
            hits = f"{e}.exists(e, {is_visible('e')})"
            charged = "[]" if deny else removals(e, f"{ptr} + '/env'", is_visible)
            risky = f"{e}.exists(e, {is_visible('e')} && !{is_harmless('e')})"
            add = (f"(has({c}.env) ? [JSONPatch{{op: 'add', path: {ptr} + '/env/-', "
                   f"value: {NEUTRAL_VALUE}}}] : [JSONPatch{{op: 'add', path: {ptr} + '/env', "
                   f"value: [{NEUTRAL_VALUE}]}}])")
            # Entry by entry, as the webhook does: a list of the object's own entries
            # cannot be written back whole (a typed value JSON Patch cannot marshal).
            voided = (f"lists.range(size({e})).filter(k, {is_visible(f'{e}[k]')} && "
                      f"!{is_neutral(f'{e}[k]')}).map(k, JSONPatch{{op: 'replace', path: "
                      f"{ptr} + '/env/' + string(k), value: {NEUTRAL_VALUE}}})")
            uncharged = f"!{hits} ? {add} : {voided}"
            if deny:
                uncharged = f"{risky} ? [] : ({uncharged})"
            return f"(size({self._gpu(c)}) > 0 ? {charged} : ({uncharged}))"
        return self._each(ops)

    def _annotation(self, changes: str) -> str:
        """The changes merged into the provenance annotation (``engine.mutate._annotate``)."""
        ann = "object.metadata.annotations"
        key = quote(PROVENANCE_ANNOTATION)
        before = f"(has({ann}) && {key} in {ann} ? {ann}[{key}] : '')"
        merged = bind("old", f"{before}.split(',').filter(n, n != '')",
                      f"(old + {changes}.filter(x, !(x in old))).join(',')")
        op = (f"has({ann}) ? [JSONPatch{{op: 'add', path: '/metadata/annotations/' + "
              f"jsonpatch.escapeKey({key}), value: v}}] : [JSONPatch{{op: 'add', path: "
              f"'/metadata/annotations', value: {{{key}: v}}}}]")
        return (f"size({changes}) == 0 ? [] : "
                + bind("v", merged, f"v == {before} ? [] : ({op})"))


def removals(items: str, ptr: str, hit: Callable[[str], str]) -> str:
    """JSON Patch ``remove`` operations of the items ``hit`` picks, the last first so
    that each index is still the item's (``webhook.k8s.patch.Patch.remove_indices``)."""
    return bind("hits", f"lists.range(size({items})).filter(k, {hit(f'{items}[k]')})",
                f"lists.range(size(hits)).map(j, JSONPatch{{op: 'remove', path: {ptr} + '/' "
                f"+ string(hits[size(hits) - 1 - j])}})")
