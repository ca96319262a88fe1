"""A scope's MutatingAdmissionPolicy: GPU requests completed, the GPU tolerations added
(or stripped from pods without GPUs), ``NVIDIA_VISIBLE_DEVICES`` neutralized, and the
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
from webhook.policy.model import TolerationPolicy


class Mutating(Scoped):
    """The scope's MutatingAdmissionPolicy."""

    # ---------------------------------------------------------------- mutating
    def mutating(self) -> dict[str, Any]:
        variables = [{"name": "here", "expression": self.scope.here},
                     *self._gpu_variables()]
        groups: list[tuple[str, str]] = [
            ("gpu-requests", f"variables.gpu ? {self._completion()} : []"),
            ("gpu-tolerations", f"variables.gpu ? {self._tolerations()} : []")]
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
