"""What one scope's native admission policies share (:mod:`.policies` says what a scope
is): its names and labels, the requests they leave to the webhook, each container's GPU
resources computed once per review, the weights, the subject and tag of a finding.
:mod:`.mutating` and :mod:`.validating` build the two policies on it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from webhook.admission.native.cel import CONTAINER_LISTS, bind, gpu_names, quote
from webhook.engine import messages
from webhook.policy.apiserver.cel import exemption_expression, kai_expression, string_list
from webhook.policy.apiserver.rules import GROUP
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule
from webhook.policy.tenantrules import TenantRules

API_VERSION = "admissionregistration.k8s.io/v1"

# The labels every object carries: how the leader and ``status`` find those held.
LABELS = {"app.kubernetes.io/name": "gpu-webhook",
          "app.kubernetes.io/component": "admission-policy"}
SELECTOR = ",".join(f"{k}={v}" for k, v in LABELS.items())

POD_RULES = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
               "resources": ["pods"], "scope": "Namespaced"}]



@dataclass(frozen=True)
class Scope:
    """The namespaces one set of native policies serves: a tenant's, or no tenant's."""

    name: str
    tenant: TenantRules | None
    selector: dict[str, Any]
    """The bindings' namespaceSelector."""
    here: str
    """CEL over ``namespaceObject``: the namespace is this scope's (``true`` when the
    selector says it all)."""


_HOLE = "\x00"



def words(text: Callable[..., str], *args: str) -> str:
    """CEL that builds the webhook's message ``text(...)`` from CEL ``args``: the
    function is called with markers, so its words are written once, in
    :mod:`webhook.engine.messages`."""
    marked = text(*(f"{_HOLE}{i}{_HOLE}" for i in range(len(args))))
    parts = []
    for i, piece in enumerate(marked.split(_HOLE)):
        if i % 2 == 0:
            if piece:
                parts.append(quote(piece))
        else:
            parts.append(f"({args[int(piece)]})")
    return " + ".join(parts) or "''"


def var(name: str) -> str:
    """A CEL identifier for a rule or change name."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


class Scoped:
    """One scope: what both of its policies are made from."""

    def __init__(self, policy: CompiledPolicy, scope: Scope, name: str,
                 mutating: str, validating: str) -> None:
        self.policy = policy
        self.scope = scope
        self.tenant = scope.tenant
        self.prefix = f"{name}.{scope.name}"
        self.mutating_failure, self.validating_failure = mutating, validating
        assert policy.model is not None  # compile_policy keeps the document it compiled
        spec = self.spec = policy.model.spec
        self.names = sorted({*spec.gpu_resources.names, *spec.gpu_resources.time_slicing})
        self.patterns = [*spec.gpu_resources.patterns, *(
            f"deviceclass.resource.kubernetes.io/{c}" for c in sorted(spec.device_classes))]
        self.keys = sorted({str(t["key"]) for t in policy.tolerations if t.get("key")})
        self.subject = "'pod ' + request.namespace + '/' + object.metadata.name"
        # The resources one unit of which is not one GPU (CompiledPolicy.weight: every
        # resource the policy weighs or names; any other counts 1), as a CEL map.
        known = {*spec.gpu_resources.weights, *spec.gpu_resources.time_slicing,
                 *spec.gpu_resources.names,
                 *(f"deviceclass.resource.kubernetes.io/{c}" for c in spec.device_classes)}
        weights = {k: policy.weight(k) for k in sorted(known) if policy.weight(k) != 1.0}
        self.weights = ("{" + ", ".join(f"{quote(k)}: {w!r}" for k, w in weights.items())
                        + "}") if weights else None

    # ------------------------------------------------------------------ shared
    def _gpu(self, c: str) -> str:
        """The GPU resources of the container ``c`` bound by :meth:`_each` or
        :meth:`_per_container`: their variable, computed once per review (the API
        server's CPU per pod was twice what it is when each rule computed them)."""
        assert c == "c"
        return "g"

    def _gpu_variables(self) -> list[dict[str, str]]:
        out = [{"name": f"{key}_gpu",
                "expression": f"{lst}.map(c, {gpu_names('c', self.names, self.patterns)})"}
               for key, lst in CONTAINER_LISTS]
        has = " || ".join(f"variables.{key}_gpu.exists(g, size(g) > 0)"
                          for key, _ in CONTAINER_LISTS)
        return [*out, {"name": "gpu", "expression": has}]

    def _weight(self, r: str) -> str:
        """CEL: the GPU-equivalents one unit of resource ``r`` counts for."""
        if self.weights is None:
            return "1.0"
        return f"({r} in {self.weights} ? {self.weights}[{r}] : 1.0)"

    def _bound(self, key: str, lst: str, expr: str) -> str:
        """``expr`` with ``c`` the container at index ``ci`` of ``lst`` and ``g`` its
        GPU resources (``ci``: a name no comprehension inside uses; CEL scopes shadow)."""
        return bind("c", f"{lst}[ci]", bind("g", f"variables.{key}_gpu[ci]", expr))

    def _tag(self, rule: Rule) -> str:
        return quote(" " + messages.tag(rule, self.policy.name,
                                        self.tenant.name if self.tenant else None))

    def _conditions(self) -> list[dict[str, str]]:
        spec = self.spec
        out = [{"name": "no-dra-claims", "expression":
                "!(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)"}]
        if spec.gpu_resources.kai is not None:
            out.append({"name": "no-kai-fractions", "expression": f"!({kai_expression()})"})
        exempt = exemption_expression(
            spec.exemptions.users, spec.exemptions.groups,
            [f"system:serviceaccount:{sa.replace('/', ':')}"
             for sa in spec.exemptions.service_accounts])
        if exempt:
            out.append({"name": "not-exempt", "expression": exempt})
        return out

    def _meta(self, suffix: str = "") -> dict[str, Any]:
        return {"name": self.prefix + suffix,
                "labels": {**LABELS, f"{GROUP}/scope": self.scope.name}}

    def binding(self, kind: str, suffix: str, action: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"policyName": self.prefix + suffix,
                                "matchResources": {"namespaceSelector": self.scope.selector}}
        if action is not None:
            spec["validationActions"] = [action]
        return {"apiVersion": API_VERSION, "kind": kind, "metadata": self._meta(suffix),
                "spec": spec}

    def _each(self, ops: Callable[[str, str, str], str]) -> str:
        """``ops(key, c, pointer)`` for every init and app container, flattened."""
        parts = []
        for key, lst in CONTAINER_LISTS:
            ptr = f"'/spec/{key}/' + string(ci)"
            parts.append(f"lists.range(size({lst})).map(ci, "
                         f"{self._bound(key, lst, ops(key, 'c', ptr))}).flatten()")
        return "(" + " + ".join(parts) + ")"

    def _per_container(self, make: Callable[[str, str], str]) -> str:
        """``make(key, c)`` (a list of findings) for every container, flattened."""
        return self._each(lambda key, c, _ptr: make(key, c))

    def _finding(self, rule: Rule, text: str, where: str | None = None) -> str:
        at = "variables.subject" + (f" + ', ' + {where}" if where else "")
        return f"{at} + ': ' + {text} + {self._tag(rule)}"

    def _gpu_key(self, t: str) -> str:
        return f"(has({t}.key) && {t}.key in {string_list(self.keys)})"
