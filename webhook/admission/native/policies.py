"""The policy's stateless rules compiled into the API server's own admission policies.

Since 1.36 the API server runs admission rules written in CEL itself
(MutatingAdmissionPolicy, ValidatingAdmissionPolicy, ``admissionregistration.k8s.io/v1``):
no network hop, no replica of ours that must answer. :func:`render` compiles the rules
whose decision depends only on the Pod, its namespace (name and labels) and the policy
into those objects; the webhook keeps the rest (:data:`KEPT`, with why). Both executors
run the same rules to the same result: ``tests/e2e/test_e2e_native_equivalence.py``
creates the same fuzzed pods through the real API server with the native policies alone
and with the webhook alone, and compares verdicts, stored objects and the facts of the
messages.

One scope per tenant (and one for the namespaces of no tenant): a MutatingAdmissionPolicy
that completes GPU requests, adds the GPU tolerations, strips them from pods without GPUs
and gives containers without GPUs ``NVIDIA_VISIBLE_DEVICES=void``, recording the changes
in the ``gpu-webhook.dev/mutated`` annotation as the webhook does; and a
ValidatingAdmissionPolicy per mode of its rules (enforce: Deny, warn: Warn, audit: Audit)
whose one validation joins every finding, in the webhook's words (an API server reports
only a policy's first failing validation, and a message may not hold line breaks: the
findings are joined by a space, each ending in its ``[rule ..., tenant ...]`` tag).

A namespace belongs to the first scope that selects it, as the webhook resolves tenants:
by name first, then by the tenants' selectors in policy order. A binding's
namespaceSelector cannot say "and no earlier selector", so a scope after a selector
tenant also tests ``namespaceObject``'s labels in CEL.

Pods that ask through DRA claims, carry KAI-Scheduler fraction annotations or are bound
to a node by ``spec.nodeName`` need what only the webhook knows (the claim's class, the
node's GPUs): the native policies leave them (``matchConditions``), so the webhook
decides them whole, as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from webhook.admission.native.cel import (
    CONTAINER_LISTS,
    NEUTRAL_VALUE,
    bind,
    completion_ops,
    covers,
    device_path,
    devices,
    env,
    gpu_label,
    gpu_names,
    is_harmless,
    is_neutral,
    is_visible,
    label,
    privileged_how,
    quote,
    shown_entry,
    toleration_value,
    within,
)
from webhook.engine import messages
from webhook.engine.decision import PROVENANCE_ANNOTATION
from webhook.policy.apiserver.cel import exemption_expression, kai_expression, string_list
from webhook.policy.apiserver.rules import GROUP, NAMESPACE_LABEL
from webhook.policy.apiserver.webhooks import Options, options_of
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.model import GPUPolicy, Mode, Rule, TolerationPolicy
from webhook.policy.model.resources import LabelSelector
from webhook.policy.tenantrules import TenantRules

API_VERSION = "admissionregistration.k8s.io/v1"
OTHER = "other-namespaces"  # the scope of the namespaces of no tenant
# The labels every object carries: how the leader and ``status`` find those held.
LABELS = {"app.kubernetes.io/name": "gpu-webhook",
          "app.kubernetes.io/component": "admission-policy"}
SELECTOR = ",".join(f"{k}={v}" for k, v in LABELS.items())

# What the native policies do, by rule (and the changes they make, by the webhook's
# name for them in the provenance annotation).
COMPILED: dict[str, str] = {
    "gpu-requests": "the missing half of a GPU request/limit pair written (mutating)",
    "gpu-tolerations": "the policy's tolerations added to GPU pods (mutating)",
    "strip-gpu-tolerations": "GPU taint tolerations removed from pods without GPUs "
                             "(nonGpuPodsToleratingGpuTaints: strip; mutating)",
    Rule.VISIBLE_DEVICES.value: "NVIDIA_VISIBLE_DEVICES=void for containers given no GPU, "
                                "their own entries removed from GPU containers (mutating), "
                                "or refused (gpuRoutes.visibleDevices: deny)",
    Rule.ALLOWED_RESOURCES.value: "a GPU resource the tenant may not use refused",
    Rule.GPU_QUANTITY.value: "a GPU count of 1e16 or more refused (fractional and negative "
                             "ones are core validation's: see KEPT)",
    Rule.MAX_PER_CONTAINER.value: "a container over the tenant's GPUs per container "
                                  "refused, in GPU-equivalents",
    Rule.MAX_PER_POD.value: "a pod over the tenant's GPUs per pod (as Kubernetes counts "
                            "a pod's request) refused",
    Rule.TENANT_REQUIRED.value: "a GPU pod in a namespace of no tenant refused "
                                "(unassignedNamespaces: deny)",
    Rule.PRIVILEGED.value: "privileged containers in pods that can reach GPU nodes refused",
    Rule.DEVICE_HOST_PATHS.value: "hostPath /dev mounts in pods that can reach GPU nodes "
                                  "refused",
    Rule.NON_GPU_TOLERATIONS.value: "pods without GPUs tolerating the GPU taint refused "
                                    "(nonGpuPodsToleratingGpuTaints: deny)",
}

# What stays in the webhook, and why. The first group needs state only the webhook
# holds; the second is stateless but not compiled yet: the webhook still decides it.
KEPT: dict[str, str] = {
    Rule.QUOTA.value: "usage across pods and replicas, in the ledger",
    "overQuota: wait": "the waiting line and its release, by the leader",
    "cohort borrowing": "the cohort's usage",
    "userQuota": "usage per user, and the user recorded on workloads",
    "quotaSchedule": "the clock: which window is open",
    Rule.NODE_NAME.value: "whether the named node carries GPUs (the node watch)",
    Rule.PRIORITY_CLASS.value: "the PriorityClasses' values (the PriorityClass watch)",
    Rule.ALLOWED_DEVICE_CLASSES.value: "a pod's claims and their classes (the claim watch)",
    Rule.DEVICE_TAINT_TOLERATIONS.value: "the claims' device requests",
    Rule.MAX_RUNTIME.value: "the running pods' start times",
    "gang reservations": "workloads' reservations in the ledger",
    Rule.GPU_QUANTITY.value: "a fractional or negative count: stateless, but core "
                             "validation refuses it before any validating policy runs, in "
                             "the API server's words (must be an integer)",
    Rule.REQUESTS_MATCH_LIMITS.value: "stateless, but core validation runs before any "
                                      "validating policy: the API server's own message",
    "hami": "the maximums where HAMi shares GPUs (a vGPU's share is read from its memory "
            "and cores resources)",
    Rule.ALLOWED_PRODUCTS.value: "stateless, not compiled yet (product node affinity)",
    Rule.TOPOLOGY.value: "stateless, not compiled yet (topology node affinity)",
    Rule.SPOT_PLACEMENT.value: "stateless, not compiled yet",
    "workload templates": "Deployments, Jobs and training kinds are checked at apply by "
                          "the webhook; their pods meet the native policies",
}

_MUTATE_RULES = (Rule.TENANT_REQUIRED, Rule.GPU_QUANTITY, Rule.VISIBLE_DEVICES,
                 Rule.ALLOWED_RESOURCES, Rule.PRIVILEGED, Rule.DEVICE_HOST_PATHS,
                 Rule.NON_GPU_TOLERATIONS)
# The validating phase's rules: the webhook checks them on the mutated pod.
_VALIDATE_RULES = (Rule.MAX_PER_CONTAINER, Rule.MAX_PER_POD)
_ACTIONS = {Mode.ENFORCE: "Deny", Mode.WARN: "Warn", Mode.AUDIT: "Audit"}
_DEFAULT = Options()
_POD_RULES = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
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


def render(policy: GPUPolicy, options: Options = _DEFAULT) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicies, ValidatingAdmissionPolicies and their bindings, for
    the namespaces the webhook configurations would send (the same ones left out)."""
    compiled = compile_policy(policy)
    excluded = sorted({"kube-system", options.namespace, *policy.spec.exemptions.namespaces,
                       *options.exempt_namespaces})
    out: list[dict[str, Any]] = []
    for scope in scopes(policy, compiled, excluded):
        out.extend(_Scoped(compiled, scope, options.name,
                           options.mutating_failure_policy,
                           options.validating_failure_policy).objects())
    return out


def kept(policy: GPUPolicy) -> list[str]:
    """What of this policy the native policies leave to the webhook, one line per rule:
    the tenants (or the policy) it applies to, and why (:data:`KEPT`). Printed by
    ``gpu-webhook manifests --admission-mode``, so a platform team sees which of its rules
    still need a replica up."""
    spec = policy.spec
    by_rule: dict[str, list[str]] = {}

    def note(rule: str, who: str) -> None:
        by_rule.setdefault(rule, []).append(who)

    for t in spec.tenants:
        if t.allowed_products or t.default_product:
            note(Rule.ALLOWED_PRODUCTS.value, t.name)
        if t.topology:
            note(Rule.TOPOLOGY.value, t.name)
        if t.quota or t.user_quota or t.quota_schedule:
            note(Rule.QUOTA.value, t.name)
        if t.over_quota.value == "wait":
            note("overQuota: wait", t.name)
        if t.cohort:
            note("cohort borrowing", t.name)
        if t.user_quota:
            note("userQuota", t.name)
        if t.quota_schedule:
            note("quotaSchedule", t.name)
        if t.max_runtime:
            note(Rule.MAX_RUNTIME.value, t.name)
        if t.priority is not None:
            note(Rule.PRIORITY_CLASS.value, t.name)
        if (t.max_gpus_per_container is not None or t.max_gpus_per_pod is not None) and \
                spec.gpu_resources.hami is not None:
            note("hami", t.name)
    if spec.spot is not None:
        note(Rule.SPOT_PLACEMENT.value, "the policy")
    if spec.products.aliases and Rule.ALLOWED_PRODUCTS.value not in by_rule:
        note(Rule.ALLOWED_PRODUCTS.value, "the policy (a pod's own product affinity)")
    return [f"{rule} ({', '.join(who)}): {KEPT[rule]}" for rule, who in by_rule.items()]


def wanted(policy: GPUPolicy, mutating: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The native admission policies the install needs, by the options it recorded on
    its MutatingWebhookConfiguration ``mutating`` (its ``gpu-webhook.dev/install``
    annotation, with the admission mode): none in mode ``webhook``, or when that
    configuration cannot be read (its drift is reported on its own)."""
    if mutating is None:
        return []
    try:
        options = options_of(mutating)
    except ValueError:
        return []
    name = str((mutating.get("metadata") or {}).get("name") or options.name)
    options = Options(**{**options.__dict__, "name": name})
    return render(policy, options) if options.admission_mode != "webhook" else []


def scopes(policy: GPUPolicy, compiled: CompiledPolicy, excluded: list[str]) -> list[Scope]:
    """One scope per tenant, in policy order, and the namespaces of no tenant last."""
    spec = policy.spec
    named = sorted({ns for t in spec.tenants for ns in t.namespaces} - set(excluded))
    out: list[Scope] = []
    earlier: list[LabelSelector] = []
    not_named = {"key": NAMESPACE_LABEL, "operator": "NotIn",
                 "values": sorted({*excluded, *named})}
    for t in spec.tenants:
        rules = compiled.by_name[t.name]
        own = sorted(set(t.namespaces) - set(excluded))
        if own:
            # A tenant's named namespaces are its own: nothing comes before a name.
            out.append(Scope(t.name, rules, {"matchExpressions": [
                {"key": NAMESPACE_LABEL, "operator": "In", "values": own}]}, "true"))
        if t.namespace_selector is not None:
            sel = t.namespace_selector
            selector: dict[str, Any] = {"matchExpressions": [not_named, *(
                e.model_dump(by_alias=True, exclude_defaults=True)
                for e in sel.match_expressions)]}
            if sel.match_labels:
                selector = {"matchLabels": dict(sel.match_labels), **selector}
            here = " && ".join(f"!({_selects(e)})" for e in earlier) or "true"
            out.append(Scope(t.name if not own else f"{t.name}-selected", rules, selector,
                             here))
            earlier.append(sel)
    here = " && ".join(f"!({_selects(e)})" for e in earlier) or "true"
    out.append(Scope(OTHER, None, {"matchExpressions": [not_named]}, here))
    return out


def _selects(sel: LabelSelector) -> str:
    """CEL: ``namespaceObject``'s labels match the selector."""
    labels = "namespaceObject.metadata.labels"
    has = f"has({labels})"
    terms = [f"({has} && {quote(k)} in {labels} && {labels}[{quote(k)}] == {quote(v)})"
             for k, v in sorted(sel.match_labels.items())]
    for e in sel.match_expressions:
        key = quote(e.key)
        there = f"({has} && {key} in {labels})"
        if e.operator == "In":
            terms.append(f"({there} && {labels}[{key}] in {string_list(e.values)})")
        elif e.operator == "NotIn":
            terms.append(f"(!{there} || !({labels}[{key}] in {string_list(e.values)}))")
        elif e.operator == "Exists":
            terms.append(there)
        else:
            terms.append(f"!{there}")
    return " && ".join(terms)


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


class _Scoped:
    """One scope's policies and bindings."""

    def __init__(self, policy: CompiledPolicy, scope: Scope, name: str,
                 mutating: str, validating: str) -> None:
        self.policy = policy
        self.scope = scope
        self.tenant = scope.tenant
        self.prefix = f"{name}.{scope.name}"
        self.mutating_failure, self.validating_failure = mutating, validating
        spec = policy.model.spec if policy.model is not None else None
        assert spec is not None
        self.names = sorted({*spec.gpu_resources.names, *spec.gpu_resources.time_slicing})
        self.patterns = [*spec.gpu_resources.patterns, *(
            f"deviceclass.resource.kubernetes.io/{c}" for c in sorted(spec.device_classes))]
        self.keys = sorted({str(t["key"]) for t in policy.tolerations if t.get("key")})
        self.subject = "'pod ' + request.namespace + '/' + object.metadata.name"

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
        """CEL: the GPU-equivalents one unit of resource ``r`` counts for
        (``CompiledPolicy.weight``: every resource the policy weighs or names, 1 else)."""
        spec = self.policy.model.spec if self.policy.model is not None else None
        assert spec is not None
        known = {*spec.gpu_resources.weights, *spec.gpu_resources.time_slicing,
                 *spec.gpu_resources.names,
                 *(f"deviceclass.resource.kubernetes.io/{c}" for c in spec.device_classes)}
        weights = {k: self.policy.weight(k) for k in sorted(known)}
        weights = {k: w for k, w in weights.items() if w != 1.0}
        if not weights:
            return "1.0"
        table = "{" + ", ".join(f"{quote(k)}: {w!r}" for k, w in weights.items()) + "}"
        return f"({r} in {table} ? {table}[{r}] : 1.0)"

    def _ask_variables(self) -> list[dict[str, str]]:
        """Each container's GPU counts (parallel to its GPU resources: the limit, else the
        request) and GPU-equivalents, and the pod's: its effective request per resource,
        as Kubernetes computes it (``webhook.k8s.resources.effective_request``)."""
        out = []
        for key, lst in CONTAINER_LISTS:
            lim = "(has(c.resources) && has(c.resources.limits) ? c.resources.limits : {})"
            req = "(has(c.resources) && has(c.resources.requests) ? c.resources.requests : {})"
            # A count refused as too large (gpu-whole-number) counts for nothing here,
            # as the webhook leaves it out of the maximums.
            counts = (f"g.map(r, {_huge_field('c')} != '' ? 0.0 : quantity(r in {lim} ? "
                      f"{lim}[r] : {req}[r]).asApproximateFloat())")
            out.append({"name": f"{key}_counts", "expression":
                        f"lists.range(size({lst})).map(ci, {self._bound(key, lst, counts)})"})
            out.append({"name": f"{key}_asks", "expression": (
                f"lists.range(size({lst})).map(ci, ([0.0] + lists.range(size("
                f"variables.{key}_gpu[ci])).map(j, variables.{key}_counts[ci][j] * "
                f"{self._weight(f'variables.{key}_gpu[ci][j]')})).sum())")})
        sidecar = "(has({l}[k].restartPolicy) && {l}[k].restartPolicy == 'Always')"
        inits = CONTAINER_LISTS[0][1]
        side = sidecar.format(l=inits)

        def amount(key: str, k: str, r: str) -> str:
            return (f"(variables.{key}_gpu[{k}].exists(x, x == {r}) ? variables.{key}_counts"
                    f"[{k}][variables.{key}_gpu[{k}].indexOf({r})] : 0.0)")
        apps = CONTAINER_LISTS[1][1]
        steady = (f"([0.0] + lists.range(size({apps})).map(k, {amount('containers', 'k', 'r')})"
                  f").sum() + ([0.0] + lists.range(size({inits})).filter(k, {side})"
                  f".map(k, {amount('initContainers', 'k', 'r')})).sum()")
        peak = (f"([0.0] + lists.range(size({inits})).filter(k, !{side}).map(k, "
                f"{amount('initContainers', 'k', 'r')} + ([0.0] + lists.range(k).filter("
                f"q, {sidecar.format(l=inits).replace('[k]', '[q]')}).map(q, "
                f"{amount('initContainers', 'q', 'r')})).sum())).max()")
        # The resources in the order the webhook's effective request holds them: the app
        # containers', the sidecars', the plain init containers'.
        order = (f"lists.range(size({apps})).map(k, variables.containers_gpu[k]).flatten() + "
                 f"lists.range(size({inits})).filter(k, {side}).map(k, "
                 f"variables.initContainers_gpu[k]).flatten() + "
                 f"lists.range(size({inits})).filter(k, !{side}).map(k, "
                 f"variables.initContainers_gpu[k]).flatten()")
        out.append({"name": "pod_resources", "expression": bind(
            "all", order, "lists.range(size(all)).filter(i, all.indexOf(all[i]) == i)"
            ".map(i, all[i])")})
        larger = bind("st", steady, bind("pk", peak, "st > pk ? st : pk"))
        out.append({"name": "pod_counts",
                    "expression": f"variables.pod_resources.map(r, {larger})"})
        out.append({"name": "pod_asked", "expression": (
            "lists.range(size(variables.pod_resources)).filter(i, variables.pod_counts[i] "
            "!= 0.0).map(i, variables.pod_resources[i])")})
        out.append({"name": "pod_asked_counts", "expression": (
            "variables.pod_counts.filter(n, n != 0.0)")})
        out.append({"name": "pod_ask", "expression": (
            f"([0.0] + lists.range(size(variables.pod_asked)).map(i, "
            f"variables.pod_asked_counts[i] * {self._weight('variables.pod_asked[i]')})).sum()")})
        holders = ("(variables.initContainers_asks + variables.containers_asks)"
                   ".filter(a, a > 0.0)")
        t = self.tenant
        if t is not None and t.max_per_container is not None and t.max_per_pod is not None:
            top = max(t.max_per_container, t.max_per_pod)
            out.append({"name": "one_holder", "expression": bind(
                "hs", holders, f"size(hs) == 1 && hs[0] == variables.pod_ask && "
                f"variables.pod_ask > {float(top)!r}")})
        return out

    def _skipped(self, rule: Rule) -> str:
        """CEL: the finding of ``rule`` says nothing the other maximum's does not (one
        container holds the whole ask, over both caps: the tighter one is said;
        ``webhook.engine.gpu.check_maximums``)."""
        t = self.tenant
        if t is None or t.max_per_container is None or t.max_per_pod is None:
            return "false"
        tighter, looser = ((Rule.MAX_PER_POD, Rule.MAX_PER_CONTAINER)
                           if t.max_per_pod < t.max_per_container
                           else (Rule.MAX_PER_CONTAINER, Rule.MAX_PER_POD))
        severity = {Mode.AUDIT: 0, Mode.WARN: 1, Mode.ENFORCE: 2}
        if rule is looser and severity[self.policy.mode_for(looser, t)] <= \
                severity[self.policy.mode_for(tighter, t)]:
            return "variables.one_holder"
        return "false"

    def _bound(self, key: str, lst: str, expr: str) -> str:
        """``expr`` with ``c`` the container at index ``ci`` of ``lst`` and ``g`` its
        GPU resources (``ci``: a name no comprehension inside uses; CEL scopes shadow)."""
        return bind("c", f"{lst}[ci]", bind("g", f"variables.{key}_gpu[ci]", expr))

    def _tag(self, rule: Rule) -> str:
        return quote(" " + messages.tag(rule, self.policy.name,
                                        self.tenant.name if self.tenant else None))

    def _conditions(self) -> list[dict[str, str]]:
        spec = self.policy.model.spec if self.policy.model is not None else None
        assert spec is not None
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

    def objects(self) -> list[dict[str, Any]]:
        out = [self.mutating(), self.binding("MutatingAdmissionPolicyBinding", "")]
        rules = [r for r in (*_MUTATE_RULES, *_VALIDATE_RULES) if self._findings(r) is not None]
        modes = {self.policy.mode_for(r, self.tenant) for r in rules}
        for mode in (m for m in (Mode.ENFORCE, Mode.WARN, Mode.AUDIT) if m in modes):
            suffix = "" if mode is Mode.ENFORCE else f".{mode.value}"
            out.append(self.validating(suffix, mode, rules))
            out.append(self.binding("ValidatingAdmissionPolicyBinding", suffix,
                                    _ACTIONS[mode]))
        return out

    def binding(self, kind: str, suffix: str, action: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"policyName": self.prefix + suffix,
                                "matchResources": {"namespaceSelector": self.scope.selector}}
        if action is not None:
            spec["validationActions"] = [action]
        return {"apiVersion": API_VERSION, "kind": kind, "metadata": self._meta(suffix),
                "spec": spec}

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
                         "matchConstraints": {"resourceRules": _POD_RULES},
                         "matchConditions": self._conditions(),
                         "variables": variables,
                         "mutations": [{"patchType": "JSONPatch",
                                        "jsonPatch": {"expression": mutation}}],
                         # A webhook may add a container after this ran.
                         "reinvocationPolicy": "IfNeeded"}}

    def _each(self, ops: Callable[[str, str, str], str]) -> str:
        """``ops(key, c, pointer)`` for every init and app container, flattened."""
        parts = []
        for key, lst in CONTAINER_LISTS:
            ptr = f"'/spec/{key}/' + string(ci)"
            parts.append(f"lists.range(size({lst})).map(ci, "
                         f"{self._bound(key, lst, ops(key, 'c', ptr))}).flatten()")
        return "(" + " + ".join(parts) + ")"

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

    def _gpu_key(self, t: str) -> str:
        return f"(has({t}.key) && {t}.key in {string_list(self.keys)})"

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

    # -------------------------------------------------------------- validating
    def validating(self, suffix: str, mode: Mode, rules: list[Rule]) -> dict[str, Any]:
        """The policy of ``mode``'s findings. As through the webhook: the mutating phase's
        rules first, and the validating phase's (the maximums) only when no finding of
        the first refused the pod (the webhook then never reaches its second phase)."""
        variables = [{"name": "here", "expression": self.scope.here},
                     *self._gpu_variables(),
                     {"name": "subject", "expression": self.subject}]
        if Rule.PRIVILEGED in rules or Rule.DEVICE_HOST_PATHS in rules:
            variables.append({"name": "reach", "expression": self._reach()})
        if any(r in _VALIDATE_RULES for r in rules):
            variables += self._ask_variables()
        for rule in rules:
            expr = self._findings(rule)
            assert expr is not None
            variables.append({"name": _var(rule.value), "expression": expr})

        def joined(phase: tuple[Rule, ...], of: Mode) -> str:
            found = [f"variables.{_var(r.value)}" for r in rules
                     if r in phase and self.policy.mode_for(r, self.tenant) is of]
            return " + ".join(found) if found else "[]"

        refused = joined(_MUTATE_RULES, Mode.ENFORCE)
        second = joined(_VALIDATE_RULES, mode)
        findings = (f"{joined(_MUTATE_RULES, mode)} + "
                    f"(size({refused}) > 0 ? [] : {second})") if second != "[]" else \
            joined(_MUTATE_RULES, mode)
        variables.append({"name": "findings",
                          "expression": f"!variables.here ? [] : {findings}"})
        return {"apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy",
                "metadata": self._meta(suffix),
                "spec": {"failurePolicy": self.validating_failure,
                         "matchConstraints": {"resourceRules": _POD_RULES},
                         "matchConditions": self._conditions(),
                         "variables": variables,
                         "validations": [{
                             "expression": "size(variables.findings) == 0",
                             "messageExpression": "variables.findings.join(' ')",
                             "reason": "Forbidden"}]}}

    def _finding(self, rule: Rule, text: str, where: str | None = None) -> str:
        at = "variables.subject" + (f" + ', ' + {where}" if where else "")
        return f"{at} + ': ' + {text} + {self._tag(rule)}"

    def _per_container(self, make: Callable[[str, str], str]) -> str:
        """``make(key, c)`` (a list of findings) for every container, flattened."""
        return "(" + " + ".join(f"lists.range(size({lst})).map(ci, "
                                f"{self._bound(key, lst, make(key, 'c'))}).flatten()"
                                for key, lst in CONTAINER_LISTS) + ")"

    def _findings(self, rule: Rule) -> str | None:
        """CEL for the list of ``rule``'s findings, or None where the rule has nothing to
        check in this scope."""
        t = self.tenant
        if rule is Rule.ALLOWED_RESOURCES:
            if t is None or t.allowed_resources is None:
                return None
            allowed = sorted(t.allowed_resources)
            # one_of() of the allowed names is a constant: written by the function.
            text = words(lambda r: messages.resource_not_allowed(r, t.name, allowed), "r")
            return self._per_container(lambda key, c: (
                # A count refused as too large is not checked further, as in the webhook.
                f"{self._gpu(c)}.filter(r, !(r in {string_list(allowed)}) && "
                f"{_huge_field(c)} == '')"
                f".map(r, {self._finding(rule, text, gpu_label(key, c))})"))
        if rule in _VALIDATE_RULES:
            return self._maximum(rule)
        if rule is Rule.TENANT_REQUIRED:
            if t is not None or self.policy.unassigned_allowed:
                return None
            text = words(lambda ns: messages.no_tenant(ns, self.policy.name),
                         "request.namespace")
            return f"variables.gpu ? [{self._finding(rule, text)}] : []"
        if rule is Rule.GPU_QUANTITY:
            return self._per_container(lambda key, c: self._huge(rule, key, c))
        if rule is Rule.NON_GPU_TOLERATIONS:
            if self.policy.non_gpu_tolerations is not TolerationPolicy.DENY or not self.keys:
                return None
            keys = ("object.spec.tolerations.filter(t, {g}).map(t, t.key)"
                    .format(g=self._gpu_key("t")))
            found = bind("ks", keys, "lists.range(size(ks)).filter(i, ks.indexOf(ks[i]) == i)"
                         ".map(i, ks[i]).sort().join(', ')")
            text = words(lambda k: messages.tolerates_gpu_taint([k]), found)
            return (f"!variables.gpu && has(object.spec.tolerations) && "
                    f"object.spec.tolerations.exists(t, {self._gpu_key('t')}) ? "
                    f"[{self._finding(rule, text)}] : []")
        if t is None:
            return None
        routes = t.routes
        if rule is Rule.VISIBLE_DEVICES:
            if routes.visible_devices != "deny":
                return None
            return self._per_container(lambda key, c: bind(
                "risky", f"{env(c)}.filter(e, {is_visible('e')} && (size({self._gpu(c)}) > 0 "
                f"? !{is_neutral('e')} : !{is_harmless('e')}))",
                f"size(risky) == 0 ? [] : [size({self._gpu(c)}) > 0 ? "
                f"{self._finding(rule, words(messages.visible_devices_charged, shown_entry('risky[size(risky) - 1]')), label(key, c))} : "  # noqa: E501
                f"{self._finding(rule, words(messages.visible_devices_uncharged, shown_entry('risky[size(risky) - 1]')), label(key, c))}]"))  # noqa: E501
        if rule is Rule.PRIVILEGED:
            if not routes.privileged:
                return None
            text = words(messages.privileged, "how", "variables.reach")
            return "variables.reach == '' ? [] : " + self._per_container(
                lambda key, c: bind("how", privileged_how(c), "how == '' ? [] : ["
                                    + self._finding(rule, text, label(key, c)) + "]"))
        if rule is Rule.DEVICE_HOST_PATHS:
            if not routes.device_host_paths:
                return None
            text = words(messages.device_host_path, "v.name", "v.hostPath.path",
                         "variables.reach")
            return (f"variables.reach == '' || !has(object.spec.volumes) ? [] : "
                    f"object.spec.volumes.filter(v, {device_path('v')})"
                    f".map(v, {self._finding(rule, text)})")
        return None

    def _maximum(self, rule: Rule) -> str | None:
        """The per-container and per-pod caps (``webhook.engine.gpu.check_maximums``), in
        GPU-equivalents. Not compiled where HAMi shares GPUs (a vGPU's share is read from
        its memory and cores resources: the webhook decides)."""
        t = self.tenant
        spec = self.policy.model.spec if self.policy.model is not None else None
        if t is None or spec is None or spec.gpu_resources.hami is not None:
            return None
        cap = t.max_per_container if rule is Rule.MAX_PER_CONTAINER else t.max_per_pod
        if cap is None:
            return None
        shown, gpus = messages.num(cap), messages.gpus_of(cap)
        if rule is Rule.MAX_PER_CONTAINER:
            def one(key: str, c: str) -> str:
                ask = f"variables.{key}_asks[ci]"
                rs = f"g.filter(r, variables.{key}_counts[ci][g.indexOf(r)] != 0.0)"
                ns = f"variables.{key}_counts[ci].filter(n, n != 0.0)"
                what = devices(rs, ns, ask, self._weight)
                fewer = within(rs, cap, self._weight, shown, gpus)
                text = words(lambda w, f: messages.per_container_max(0, t.name, cap, w, f),
                             what, fewer)
                return (f"{ask} > {float(cap)!r} && !{self._skipped(rule)} ? "
                        f"[{self._finding(rule, text, gpu_label(key, c))}] : []")
            return self._per_container(one)
        rs, ns = "variables.pod_asked", "variables.pod_asked_counts"
        what = devices(rs, ns, "variables.pod_ask", self._weight)
        fewer = within(rs, cap, self._weight, shown, gpus)
        text = words(lambda w, f: messages.per_pod_max(0, t.name, cap, w, f), what, fewer)
        return (f"variables.pod_ask > {float(cap)!r} && !{self._skipped(rule)} ? "
                f"[{self._finding(rule, text)}] : []")

    def _huge(self, rule: Rule, key: str, c: str) -> str:
        """A count core validation lets through that no node has (``gpu_count``'s
        "far more devices"): its limit named first, as the webhook does."""
        def shown(v: str) -> str:  # _show(): the value as Python's repr() quotes it
            return (f"\"'\" + (size({v}) > 40 ? {v}.substring(0, 40) + '...' : {v}) "
                    f"+ \"'\"")

        lim = f"(has({c}.resources) && has({c}.resources.limits) ? {c}.resources.limits : {{}})"
        req = (f"(has({c}.resources) && has({c}.resources.requests) ? "
               f"{c}.resources.requests : {{}})")
        field = _huge_field(c)
        value = f"(f == 'limit' ? {lim}[r] : {req}[r])"
        reason = words(lambda v: f"{v} is far more devices than any node has", shown(value))
        text = words(messages.bad_quantity, "r", "f", reason)
        return (f"{self._gpu(c)}.map(r, " + bind("f", field, f"f == '' ? [] : "
                f"[{self._finding(rule, text, gpu_label(key, c))}]") + ").flatten()")

    def _reach(self) -> str:
        """Why the pod can run on a GPU node, or '' (``routes.pods.reaches_gpu_nodes``);
        '' too for a pod bound to a node, which only the webhook can judge."""
        tols = "(has(object.spec.tolerations) ? object.spec.tolerations : [])"
        if not self.policy.tolerations:
            tolerating = quote("the policy names no GPU node taint, so any node may be a "
                               "GPU node")
        else:
            ws = self.policy.tolerations
            which = "''"
            for w in reversed(ws):
                which = (f"{covers('t', w)} ? (has(t.key) && t.key != '' ? "
                         f"{quote('it tolerates the GPU taint ' + str(w.get('key')))} : "
                         f"'it tolerates every taint') : {which}")
            hit = f"{tols}.filter(t, {' || '.join(covers('t', w) for w in ws)})"
            tolerating = bind("hit", hit, "size(hit) == 0 ? '' : "
                              + bind("t", "hit[0]", which))
        return (f"variables.gpu ? 'it asks for GPUs' : "
                f"has(object.spec.nodeName) && object.spec.nodeName != '' ? '' : {tolerating}")


def _huge_field(c: str) -> str:
    """CEL over container ``c`` and resource ``r``: 'limit' or 'request', the half whose
    count is 1e16 or more (the limit first), or ''."""
    def huge(v: str) -> str:
        return f"quantity({v}).compareTo(quantity('1e16')) >= 0"
    lim = f"(has({c}.resources) && has({c}.resources.limits) ? {c}.resources.limits : {{}})"
    req = f"(has({c}.resources) && has({c}.resources.requests) ? {c}.resources.requests : {{}})"
    return (f"(r in {lim} && {huge(lim + '[r]')} ? 'limit' : "
            f"r in {req} && {huge(req + '[r]')} ? 'request' : '')")


def removals(items: str, ptr: str, hit: Callable[[str], str]) -> str:
    """JSON Patch ``remove`` operations of the items ``hit`` picks, the last first so
    that each index is still the item's (``webhook.k8s.patch.Patch.remove_indices``)."""
    return bind("hits", f"lists.range(size({items})).filter(k, {hit(f'{items}[k]')})",
                f"lists.range(size(hits)).map(j, JSONPatch{{op: 'remove', path: {ptr} + '/' "
                f"+ string(hits[size(hits) - 1 - j])}})")


def _var(name: str) -> str:
    """A CEL identifier for a rule or change name."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)

