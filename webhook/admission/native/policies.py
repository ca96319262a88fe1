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

Modules: scoped (what one scope's two policies share), mutating and validating (each
policy), cel (their CEL, in the webhook's words), static (as files the API server loads
at start); this one makes the scopes and puts them together.
"""

from __future__ import annotations

from typing import Any

from webhook.admission.native.cel import quote
from webhook.admission.native.mutating import Mutating
from webhook.admission.native.scoped import LABELS, SELECTOR, Scope, words
from webhook.admission.native.validating import (
    ACTIONS,
    MUTATE_RULES,
    VALIDATE_RULES,
    Validating,
)
from webhook.policy.apiserver.cel import string_list
from webhook.policy.apiserver.rules import NAMESPACE_LABEL
from webhook.policy.apiserver.webhooks import Options, options_of
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.model import GPUPolicy, Mode, Rule
from webhook.policy.model.resources import LabelSelector

__all__ = ["COMPILED", "KEPT", "LABELS", "OTHER", "SELECTOR", "Scope", "kept", "ours",
           "render", "scopes", "wanted", "words"]


OTHER = "other-namespaces"  # the scope of the namespaces of no tenant

# What the native policies do, by rule (and the changes they make, by the webhook's
# name for them in the provenance annotation).
COMPILED: dict[str, str] = {
    "gpu-requests": "the missing half of a GPU request/limit pair written (mutating)",
    "gpu-tolerations": "the policy's tolerations added to GPU pods (mutating)",
    "strip-gpu-tolerations": "GPU taint tolerations removed from pods without GPUs "
                             "(nonGpuPodsToleratingGpuTaints: strip; mutating)",
    "gpu-node-affinity": "the tenant's default (else allowed) products and topology group "
                         "ANDed into every required node-affinity term of a GPU pod that "
                         "names neither label nor asks for a product (mutating)",
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
    Rule.ALLOWED_PRODUCTS.value: "a pod that names a product itself (request label or "
                                 "annotation, nodeSelector, its own node affinity): its "
                                 "choice weighed against the allowed ones, not compiled "
                                 "yet; and every GPU pod where spot placement or GPU "
                                 "capabilities add terms",
    Rule.TOPOLOGY.value: "a pod that names the topology label itself: not compiled yet",
    Rule.SPOT_PLACEMENT.value: "stateless, not compiled yet",
    "workload templates": "Deployments, Jobs and training kinds are checked at apply by "
                          "the webhook; their pods meet the native policies",
}

_DEFAULT = Options()




def render(policy: GPUPolicy, options: Options = _DEFAULT) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicies, ValidatingAdmissionPolicies and their bindings, for
    the namespaces the webhook configurations would send (the same ones left out)."""
    compiled = compile_policy(policy)
    excluded = sorted({"kube-system", options.namespace, *policy.spec.exemptions.namespaces,
                       *options.exempt_namespaces})
    out: list[dict[str, Any]] = []
    for scope in scopes(policy, compiled, excluded):
        out.extend(_objects(compiled, scope, options))
    return out


def _objects(policy: CompiledPolicy, scope: Scope, options: Options) -> list[dict[str, Any]]:
    """One scope's policies and bindings: the mutating one, and a validating one per mode
    of the scope's rules."""
    mutating = Mutating(policy, scope, options.name, options.mutating_failure_policy,
                        options.validating_failure_policy)
    validating = Validating(policy, scope, options.name, options.mutating_failure_policy,
                            options.validating_failure_policy)
    out = [mutating.mutating(), mutating.binding("MutatingAdmissionPolicyBinding", "")]
    rules = [r for r in (*MUTATE_RULES, *VALIDATE_RULES) if validating.findings(r) is not None]
    modes = {policy.mode_for(r, scope.tenant) for r in rules}
    for mode in (m for m in (Mode.ENFORCE, Mode.WARN, Mode.AUDIT) if m in modes):
        suffix = "" if mode is Mode.ENFORCE else f".{mode.value}"
        out.append(validating.validating(suffix, mode, rules))
        out.append(validating.binding("ValidatingAdmissionPolicyBinding", suffix,
                                      ACTIONS[mode]))
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


def ours(held: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Of the native objects listed by :data:`SELECTOR`, those of the install whose
    configurations are named ``name`` (each object's name starts ``name.``)."""
    return [o for o in held if str(o["metadata"]["name"]).startswith(f"{name}.")]


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













