"""The webhook configurations the API server needs, rendered from the policy.

``gpu-webhook manifests`` prints a MutatingWebhookConfiguration and a
ValidatingWebhookConfiguration (admissionregistration.k8s.io/v1). They are derived from
the policy so that the API server sends only what the webhook acts on:

- ``matchConditions`` (CEL, evaluated in the API server) pass only pods and pod templates
  with a GPU resource (by the policy's names and patterns) in any container's or init
  container's limits or requests. When ``nonGpuPodsToleratingGpuTaints`` is ``strip`` the
  mutating webhook (``deny``: the validating one) also gets pods that tolerate a GPU taint
  key. Requests from exempt users, groups and service accounts are not sent.
- ``namespaceSelector`` leaves out kube-system, the webhook's own namespace and the
  policy's exempt namespaces, so a webhook that is down can never block the pods that
  would bring it back.
- The *routes* webhooks (``routes.gpu-webhook.dev``, ``routes-N.gpu-webhook.dev``, in the
  MutatingWebhookConfiguration) get every other pod of the tenants' namespaces at CREATE,
  and the ephemeral containers added to any pod there (``pods/ephemeralcontainers``):
  ``webhook.engine.routes`` gives a container given no GPU ``NVIDIA_VISIBLE_DEVICES=void``
  and refuses the other routes to a GPU that skip the GPU request (docs/security.md). The
  namespaces a tenant names are matched by ``request.namespace`` in a matchCondition;
  tenants chosen by one label share one webhook per label key (``key In [values]``),
  other selectors one each.

Training workloads (Volcano Jobs, JobSets, Kubeflow jobs, TrainJobs, LeaderWorkerSets,
Ray clusters and jobs, Argo workflows) and the kinds the policy's ``workloadKinds`` adds
are sent on CREATE and UPDATE, each with a matchCondition that walks its own templates
(every task, replicated job, replica type, ...), so a training job without GPUs is never
sent either. A rule for a kind whose CRD is not installed matches nothing.

The ValidatingWebhookConfiguration holds a second webhook, ``scale.gpu-webhook.dev``:
the ``scale`` subresource of Deployments, StatefulSets and ReplicaSets (``kubectl
scale``, an HPA), so a scale-up past the GPU quota is refused or warned about at once.
A Scale object holds only replica counts, so its matchCondition passes scale-ups only
(more replicas than before); whether the workload asks for GPUs is known only once the
webhook has read it. Its failurePolicy is always ``Ignore``: it is sent scale-ups of
workloads without GPUs too, which a webhook that is down must not block, and quota
holds without it (each pod is still checked when it is created). The mutating webhook
is never sent scale requests: there is nothing to mutate.

``release.gpu-webhook.dev`` is sent the DELETE of the kinds that can have a gang (the
built-in training kinds but Ray and Argo, and the configured kinds with a gang): the
slots of the workload's gang reservation that no pod took are freed at once, not at the
reservation's bound (``webhook.quota.gang``). It is always allowed, and its failurePolicy
is always ``Ignore``: a webhook that is down must never block a delete, and the bound
frees the slots anyway. A DELETE carries no object, so it has no matchConditions: every
delete of those kinds is sent (one small review each, answered without a write when the
workload holds no reservation). A delete is seen rather than watched for, so no replica
needs a watch (and RBAC) per training kind, and the slots are free before ``kubectl
delete`` returns.

The ValidatingWebhookConfiguration also holds ``policies.gpu-webhook.dev``: GPUPolicy
objects (the CRD ``gpu-webhook policy crd`` renders) are sent to ``/validate-policy`` on
CREATE and UPDATE, where the policy loader checks them (``webhook.policy.review``), so an
edit the webhook could not load is refused at ``kubectl apply`` with the message
``gpu-webhook policy check`` gives. It is in the same configuration as the GPU webhooks
so that the caBundle reaches it by the same path (self-managed or cert-manager), and it
follows the validating failurePolicy. Without the CRD installed its rule matches nothing.

failurePolicy, per webhook (both default to Fail):

- ``Fail``: while no replica answers, every GPU pod or GPU workload create/update that
  matches is rejected ("failed calling webhook"), and so is every pod of a tenant's
  namespace (the routes webhooks). Nothing escapes quota, pinning or the routes; pods
  without GPUs of other namespaces are unaffected because they are never sent.
- ``Ignore``: while no replica answers, matching requests are admitted as they are: no
  GPU requests completed, no tolerations or node affinity injected, no quota charged.

``gates.gpu-webhook.dev`` is sent a pod's UPDATE only when it removes the scheduling gate
``gpu-webhook.dev/quota`` of a pod waiting for quota (a CEL matchCondition compares the
old and new gates; no other pod update is sent): only the webhook's own identity may
remove it, having charged the pod first (``webhook.server.leading.release``). It follows
the validating failurePolicy: with ``Fail`` and no replica answering, no waiting pod is
released, by anyone.

The configurations must be rendered again when the policy's GPU resources, toleration
keys, ``nonGpuPodsToleratingGpuTaints``, exemptions, ``workloadKinds`` or the tenants'
namespaces (names and selectors) change.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from webhook.k8s.objects import parse_pointer
from webhook.k8s.workloads import CRD_KINDS, BuiltIn
from webhook.policy.model import GPUPolicy, TolerationPolicy, WorkloadKind

FailurePolicy = Literal["Fail", "Ignore"]
GROUP = "gpu-webhook.dev"
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server

RULES: list[dict[str, Any]] = [
    # A pod's resources and placement are immutable: only its creation matters.
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
     "resources": ["pods"], "scope": "Namespaced"},
    # Workloads are checked at `kubectl apply`, so a developer sees the problem there and
    # not as an event on a ReplicaSet.
    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["deployments", "replicasets", "statefulsets", "daemonsets"],
     "scope": "Namespaced"},
    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["jobs", "cronjobs"], "scope": "Namespaced"},
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["replicationcontrollers"], "scope": "Namespaced"},
]


# DRA claims and templates: their spec is immutable, so only their creation matters.
# Registered for v1; with matchPolicy Equivalent the API server converts a request made
# through another version (v1beta1's flat request fields) to v1 before sending it.
CLAIM_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
     "resources": ["resourceclaims", "resourceclaimtemplates"], "scope": "Namespaced"},
]


def workload_rules(configured: Iterable[WorkloadKind] = ()) -> list[dict[str, Any]]:
    """Rules for the training kinds and the configured ones: one per group and versions."""
    by: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for b in CRD_KINDS:
        by.setdefault((b.group, b.versions), []).append(b.resource)
    for w in configured:
        resources = by.setdefault((w.group, tuple(w.versions)), [])
        if w.resource not in resources:
            resources.append(w.resource)
    return [{"apiGroups": [g], "apiVersions": list(v), "operations": ["CREATE", "UPDATE"],
             "resources": r, "scope": "Namespaced"} for (g, v), r in by.items()]


def release_rules(configured: Iterable[WorkloadKind] = ()) -> list[dict[str, Any]]:
    """DELETE of the kinds that can have a gang: what its reservation still holds is
    freed when the workload is deleted."""
    by: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for b in CRD_KINDS:
        if b.reserves:
            by.setdefault((b.group, b.versions), []).append(b.resource)
    for w in configured:
        if w.gang == "all" or w.gang_minimum is not None:
            resources = by.setdefault((w.group, tuple(w.versions)), [])
            if w.resource not in resources:
                resources.append(w.resource)
    return [{"apiGroups": [g], "apiVersions": list(v), "operations": ["DELETE"],
             "resources": r, "scope": "Namespaced"} for (g, v), r in by.items()]


# Every pod of a tenant's namespaces, for the routes to a GPU that skip the GPU request
# (webhook.engine.routes): a pod's creation, and the ephemeral containers added to it
# (``kubectl debug``), a subresource that a rule of ``pods`` alone does not match.
ROUTE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
     "resources": ["pods"], "scope": "Namespaced"},
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
     "resources": ["pods/ephemeralcontainers"], "scope": "Namespaced"},
]

# Tenants chosen by label each get a routes webhook of their own selector; past this many
# distinct selectors one webhook takes every namespace not excluded.
MAX_ROUTE_SELECTORS = 8


def route_scopes(policy: GPUPolicy, excluded: list[str]
                 ) -> list[tuple[str, dict[str, Any], list[str] | None]]:
    """(webhook name, namespaceSelector, namespaces by name or None) of the routes
    webhooks: the tenants' namespaces by name in one (``request.namespace in [...]``),
    the tenants chosen by one label each in one per label key (``key In [values]``:
    the usual ``gpu.example.com/tenant: <tenant>``), and one per other distinct
    namespaceSelector; the selector ones leave out the namespaces named (so no pod is
    sent twice). Past 8 selectors one webhook takes every namespace not excluded."""
    spec = policy.spec
    named = sorted({ns for t in spec.tenants for ns in t.namespaces} - set(excluded))
    by_key: dict[str, list[str]] = {}
    selectors: list[dict[str, Any]] = []
    for t in spec.tenants:
        sel = t.namespace_selector
        if sel is None:
            continue
        if len(sel.match_labels) == 1 and not sel.match_expressions:
            ((key, value),) = sel.match_labels.items()
            values = by_key.setdefault(key, [])
            if value not in values:
                values.append(value)
            continue
        dumped = sel.model_dump(by_alias=True, exclude_defaults=True)
        if dumped not in selectors:
            selectors.append(dumped)
    selectors = [{"matchExpressions": [{"key": key, "operator": "In",
                                        "values": sorted(values)}]}
                 for key, values in by_key.items()] + selectors
    out: list[tuple[str, dict[str, Any], list[str] | None]] = []
    if named:
        out.append(("routes", {"matchExpressions": [
            {"key": NAMESPACE_LABEL, "operator": "NotIn", "values": list(excluded)}]}, named))
    others = {"key": NAMESPACE_LABEL, "operator": "NotIn",
              "values": sorted({*excluded, *named})}
    if len(selectors) > MAX_ROUTE_SELECTORS:
        out.append(("routes-selected", {"matchExpressions": [others]}, None))
        return out
    for i, chosen in enumerate(selectors):
        # The exclusion first, as in every other webhook of the configuration.
        selector: dict[str, Any] = {"matchExpressions": [
            others, *chosen.get("matchExpressions", [])]}
        if chosen.get("matchLabels"):
            selector = {"matchLabels": chosen["matchLabels"], **selector}
        out.append((f"routes-{i + 1}", selector, None))
    return out


# GPUPolicy objects (cluster-scoped): what the loader refuses is refused at apply.
POLICY_RULES: list[dict[str, Any]] = [
    {"apiGroups": [GROUP], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["gpupolicies"], "scope": "Cluster"},
]


# The scale subresource: only the replica count changes, and only the validating webhook
# (quota) cares. The pods a scale-up adds are checked when they are created either way.
SCALE_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["UPDATE"],
     "resources": ["deployments/scale", "statefulsets/scale", "replicasets/scale"],
     "scope": "Namespaced"},
]

# CEL over a Scale object (autoscaling/v1): more replicas than before. An absent
# spec.replicas is 0 (the field is omitted when empty).
SCALE_UP = ("(has(object.spec) && has(object.spec.replicas) ? object.spec.replicas : 0) > "
            "(has(oldObject.spec) && has(oldObject.spec.replicas) ? "
            "oldObject.spec.replicas : 0)")


# A pod's UPDATE that removes the quota gate (webhook.engine.waiting): only the webhook's
# own identity may, once it has charged the pod; every other pod update is not sent.
GATE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
     "resources": ["pods"], "scope": "Namespaced"},
]
_HAS_GATE = ("(has({o}.spec.schedulingGates) && "
             "{o}.spec.schedulingGates.exists(g, g.name == 'gpu-webhook.dev/quota'))")
GATE_REMOVED = f"{_HAS_GATE.format(o='oldObject')} && !{_HAS_GATE.format(o='object')}"


@dataclass(frozen=True)
class Options:
    name: str = "gpu-webhook"
    """Name of both configurations (and the prefix of the webhooks' names)."""
    namespace: str = "gpu-webhook"
    service: str = "gpu-webhook"
    port: int = 443
    url: str | None = None
    """Call this base URL (``https://host:port``) instead of the Service."""
    ca_bundle: bytes | None = None
    """PEM of the CA that signed the serving certificate."""
    timeout_seconds: int = 5
    mutating_failure_policy: FailurePolicy = "Fail"
    validating_failure_policy: FailurePolicy = "Fail"


def render(policy: GPUPolicy, options: Options = Options()) -> list[dict[str, Any]]:
    """The MutatingWebhookConfiguration and ValidatingWebhookConfiguration."""
    if not 1 <= options.timeout_seconds <= 30:
        raise ValueError("timeoutSeconds must be between 1 and 30 (the API server's limit)")
    if options.url is not None and not options.url.startswith("https://"):
        raise ValueError(f"--url must start with https:// (got {options.url!r})")
    r = _Rendering(policy, options)
    mutating, validating = options.mutating_failure_policy, options.validating_failure_policy
    claims = bool(policy.spec.device_classes)
    labels = {"app.kubernetes.io/name": "gpu-webhook", "app.kubernetes.io/component": "admission"}
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": options.name, "labels": labels},
         "webhooks": [r.pods("mutate", mutating),
                      *([r.claims("mutate", mutating)] if claims else []),
                      *[r.route(*scope) for scope in route_scopes(policy, r.excluded)]]},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": options.name, "labels": labels},
         "webhooks": [r.pods("validate", validating), r.scale(),
                      *([r.claims("validate", validating)] if claims else []),
                      r.release(), r.gates(validating), r.policies(validating)]},
    ]


class _Rendering:
    """The webhooks of one policy's configurations, each from what they share: the CEL
    that tells a GPU pod, the exempt users, the namespaces left out, the options."""

    def __init__(self, policy: GPUPolicy, options: Options) -> None:
        spec = self.spec = policy.spec
        self.options = options
        # A pod asking through DRA claims is sent too: whether a claim is a GPU's is known
        # only to the webhook (its watch of claims and templates).
        # Time-sliced resources (gpuResources.timeSlicing) are GPU resources too.
        self.gpu = (gpu_pod_expression([*spec.gpu_resources.names, *(
            r for r in sorted(spec.gpu_resources.time_slicing)
            if r not in spec.gpu_resources.names)], [
            *spec.gpu_resources.patterns,
            *(f"deviceclass.resource.kubernetes.io/{c}" for c in sorted(spec.device_classes))])
            + f" || {claims_expression()}")
        # KAI-Scheduler fractions are asked by annotation, not in the pod spec.
        self.kai = kai_expression() if spec.gpu_resources.kai is not None else None
        keys = sorted({t.key for t in spec.tolerations if t.key})
        tolerating = tolerates_expression(keys) if keys else None
        choice = spec.non_gpu_pods_tolerating_gpu_taints
        self.wanted = {
            "mutate": self.gpu if choice is not TolerationPolicy.STRIP or not tolerating
            else f"{self.gpu} || {tolerating}",
            "validate": self.gpu if choice is not TolerationPolicy.DENY or not tolerating
            else f"{self.gpu} || {tolerating}",
        }
        self.exempt = exemption_expression(
            spec.exemptions.users, spec.exemptions.groups,
            [f"system:serviceaccount:{sa.replace('/', ':')}"
             for sa in spec.exemptions.service_accounts])
        self.excluded = sorted({"kube-system", options.namespace, *spec.exemptions.namespaces})

    def _hook(self, name: str, path: str, rules: Any, side_effects: str, failure: str, *,
              selector: dict[str, Any] | None = None,
              conditions: list[dict[str, str]] | None = None,
              reinvoke: bool = False) -> dict[str, Any]:
        hook: dict[str, Any] = {
            "name": f"{name}.{GROUP}",
            "admissionReviewVersions": ["v1"],
            "clientConfig": _client_config(path, self.options),
            "rules": copy.deepcopy(rules),
            "matchPolicy": "Equivalent",
        }
        if selector is not None:
            hook["namespaceSelector"] = selector
        if conditions is not None:
            if self.exempt:
                conditions.append({"name": "not-exempt", "expression": self.exempt})
            hook["matchConditions"] = conditions
        hook.update(sideEffects=side_effects, timeoutSeconds=self.options.timeout_seconds,
                    failurePolicy=failure)
        if reinvoke:
            hook["reinvocationPolicy"] = "IfNeeded"
        return hook

    def _not_excluded(self) -> dict[str, Any]:
        return {"matchExpressions": [
            {"key": NAMESPACE_LABEL, "operator": "NotIn", "values": list(self.excluded)}]}

    def pods(self, kind: str, failure: FailurePolicy) -> dict[str, Any]:
        """GPU pods and pod-template workloads (and pods tolerating the GPU taint, where
        the policy strips or refuses that)."""
        wanted = self.wanted[kind]
        conditions = [{"name": "gpu-pods" if wanted == self.gpu
                       else "gpu-pods-or-gpu-tolerations",
                       "expression": for_pod_spec(lambda s: _or_terms(wanted, s),
                                                  self.spec.workload_kinds)}]
        if self.kai is not None:
            conditions[0]["expression"] += f" || {self.kai}"
        # Another mutating webhook may add a GPU container after ours ran.
        return self._hook(kind, kind, [*RULES, *workload_rules(self.spec.workload_kinds)],
                          # quota reservations are skipped for dry runs
                          "NoneOnDryRun", failure, selector=self._not_excluded(),
                          conditions=conditions, reinvoke=kind == "mutate")

    def claims(self, kind: str, failure: FailurePolicy) -> dict[str, Any]:
        conditions = [{"name": "gpu-device-classes",
                       "expression": claim_expression(sorted(self.spec.device_classes))}]
        # A claim's quota is reserved, except for dry runs.
        return self._hook(f"claims.{kind}", kind, CLAIM_RULES, "NoneOnDryRun", failure,
                          selector=self._not_excluded(), conditions=conditions)

    def scale(self) -> dict[str, Any]:
        # It only reads the workload; never Fail: see the module's docstring.
        return self._hook("scale", "validate", SCALE_RULES, "None", "Ignore",
                          selector=self._not_excluded(),
                          conditions=[{"name": "scale-up", "expression": SCALE_UP}])

    def release(self) -> dict[str, Any]:
        # Its quota reservation is freed, except for a dry run. Never Fail: a delete is
        # never the webhook's to block (see the docstring).
        return self._hook("release", "validate", release_rules(self.spec.workload_kinds),
                          "NoneOnDryRun", "Ignore", selector=self._not_excluded())

    def gates(self, failure: FailurePolicy) -> dict[str, Any]:
        # Nobody but the webhook removes the quota gate: it charges the pod first.
        return self._hook("gates", "validate", GATE_RULES, "None", failure,
                          selector=self._not_excluded(),
                          conditions=[{"name": "removes-quota-gate",
                                       "expression": GATE_REMOVED}])

    def policies(self, failure: FailurePolicy) -> dict[str, Any]:
        # It only runs the loader.
        return self._hook("policies", "validate-policy", POLICY_RULES, "None", failure)

    def route(self, name: str, selector: dict[str, Any], only: list[str] | None
              ) -> dict[str, Any]:
        """Pods of tenants' namespaces the GPU webhook is not sent (it runs the same rules
        on its own), and every ephemeral container added there: its pod may be a GPU
        pod. It only mutates."""
        sent = _or_terms(self.wanted["mutate"], "object.spec")
        if self.kai is not None:
            sent = f"{sent} || {self.kai}"
        test = (f"(has(request.subResource) && request.subResource == 'ephemeralcontainers')"
                f" || !(has(object.spec) && ({sent}))")
        conditions = [{"name": "pods-not-sent-as-gpu-pods", "expression": test}]
        if only is not None:
            conditions.insert(0, {"name": "tenant-namespaces",
                                  "expression": f"request.namespace in {_list(only)}"})
        return self._hook(name, "mutate", ROUTE_RULES, "None",
                          self.options.mutating_failure_policy,
                          selector=copy.deepcopy(selector), conditions=conditions,
                          reinvoke=True)


class _Plain(yaml.SafeDumper):
    """YAML as people read and edit it: a value used twice is written twice, never as an
    anchor and an alias (``&id001`` / ``*id001``)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(objects: Iterable[dict[str, Any]], header: str = "") -> str:
    docs = [yaml.dump(o, Dumper=_Plain, sort_keys=False, width=100) for o in objects]
    return header + "---\n".join(docs)


# --- CEL -------------------------------------------------------------------------------
# The expressions are built from placeholders: "S" stands for the pod spec, and is
# replaced by the path to it for each kind (see for_pod_spec).

_SPEC = "{S}"


def _quote(s: str) -> str:
    # Policy names and patterns are restricted to [-A-Za-z0-9_./*] by the schema; the
    # check keeps a future schema change from producing an expression that means
    # something else.
    if any(c in s for c in "'\\\n"):
        raise ValueError(f"{s!r} cannot be put in a CEL string")
    return f"'{s}'"


def _list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_quote(v) for v in values) + "]"


def resource_test(var: str, names: Iterable[str], patterns: Iterable[str]) -> str:
    """CEL that is true when the resource name ``var`` is a GPU resource."""
    terms = []
    names = list(names)
    if names:
        terms.append(f"{var} in {_list(names)}")
    for p in patterns:
        parts = p.split("*")
        if len(parts) == 1:
            terms.append(f"{var} == {_quote(p)}")
        elif p == "*":
            return "true"
        elif len(parts) == 2 and parts[1] == "":
            terms.append(f"{var}.startsWith({_quote(parts[0])})")
        elif len(parts) == 2 and parts[0] == "":
            terms.append(f"{var}.endsWith({_quote(parts[1])})")
        else:  # RE2 through matches(); "." is the only regex character a name can hold
            regex = "^" + ".*".join(part.replace(".", "[.]") for part in parts) + "$"
            terms.append(f"{var}.matches({_quote(regex)})")
    return " || ".join(terms) if terms else "false"


def gpu_pod_expression(names: Iterable[str], patterns: Iterable[str]) -> str:
    """CEL over the pod spec placeholder: any container or init container asks for a GPU."""
    gpu = resource_test("r", names, patterns)
    container = (f"has(c.resources) && ("
                 f"(has(c.resources.limits) && c.resources.limits.exists(r, {gpu})) || "
                 f"(has(c.resources.requests) && c.resources.requests.exists(r, {gpu})))")
    return (f"(has({_SPEC}.containers) && {_SPEC}.containers.exists(c, {container})) || "
            f"(has({_SPEC}.initContainers) && {_SPEC}.initContainers.exists(c, {container}))")


def kai_expression() -> str:
    """CEL: the pod (or a built-in kind's pod template) carries a KAI-Scheduler GPU
    fraction annotation (``gpu-fraction``, ``gpu-memory``)."""
    def annotated(meta: str) -> str:
        a = f"{meta}.annotations"
        return f"({_has(a)} && ('gpu-fraction' in {a} || 'gpu-memory' in {a}))"
    return (f"(request.kind.kind == 'Pod' ? {annotated('object.metadata')} : "
            f"request.kind.kind == 'CronJob' ? "
            f"{annotated('object.spec.jobTemplate.spec.template.metadata')} : "
            f"{annotated('object.spec.template.metadata')})")


def claims_expression() -> str:
    """CEL over the pod spec placeholder: it names DRA claims or claim templates."""
    return f"(has({_SPEC}.resourceClaims) && size({_SPEC}.resourceClaims) > 0)"


def claim_expression(classes: list[str]) -> str:
    """CEL over a ResourceClaim or ResourceClaimTemplate: a device request (or one of its
    firstAvailable alternatives) asks one of ``classes``."""
    listed = _list(classes)
    request = (f"(has(r.exactly) && r.exactly.deviceClassName in {listed}) || "
               f"(has(r.firstAvailable) && r.firstAvailable.exists(f, "
               f"f.deviceClassName in {listed}))")
    specs = ("(request.kind.kind == 'ResourceClaimTemplate' ? "
             "(has(object.spec.spec) ? [object.spec.spec] : []) : [object.spec])")
    return (f"{specs}.exists(s, has(s.devices) && has(s.devices.requests) && "
            f"s.devices.requests.exists(r, {request}))")


def tolerates_expression(keys: list[str]) -> str:
    """CEL over the pod spec placeholder: a toleration names a GPU taint key."""
    return (f"(has({_SPEC}.tolerations) && {_SPEC}.tolerations.exists(t, "
            f"has(t.key) && t.key in {_list(keys)}))")


def _or_terms(expr: str, spec: str) -> str:
    return expr.replace(_SPEC, spec)


def for_pod_spec(test: Callable[[str], str], configured: Iterable[WorkloadKind] = ()) -> str:
    """Apply ``test`` to the pod spec(s) of whichever kind the request is about.

    For a built-in kind the spec is picked once into a one-element list so the test is
    written once and binds it as ``s``; a training kind's templates are gathered into a
    list the same way (a list's items, a map's values). A template missing on the way gives
    false, never an evaluation error, which failurePolicy Fail would turn into a
    rejection.
    """
    template = ("has(object.spec.template) && has(object.spec.template.spec) ? "
                "[object.spec.template.spec] : []")
    cron = ("has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec) && "
            "has(object.spec.jobTemplate.spec.template) && "
            "has(object.spec.jobTemplate.spec.template.spec) ? "
            "[object.spec.jobTemplate.spec.template.spec] : []")
    specs = (f"(request.kind.kind == 'Pod' ? [object.spec] : "
             f"request.kind.kind == 'CronJob' ? ({cron}) : ({template}))")
    for group, kind, listed in reversed([*((b.group, b.kind, _crd_specs(b))
                                            for b in CRD_KINDS),
                                          *((w.group, w.kind, _configured_specs(w))
                                            for w in configured)]):
        specs = (f"(request.kind.group == {_quote(group)} && request.kind.kind == "
                 f"{_quote(kind)}) ? ({listed}) : {specs}")
    if configured or CRD_KINDS:
        specs = f"({specs})"  # a conditional binds looser than .exists
    return f"{specs}.exists(s, {test('s')})"


def _has(expr: str) -> str:
    """``has()`` of every field on the way to ``expr`` (after its root variable)."""
    head, *keys = expr.split(".")
    out, cur = [], head
    for k in keys:
        cur = f"{cur}.{k}"
        out.append(f"has({cur})")
    return " && ".join(out)


def _specs(*path: str, shape: str = "list") -> str:
    """CEL for the list of pod specs at ``path`` (from ``object``), where one ``*``
    stands for every item of a list (``shape`` list), the values of a map (map), or
    either (any: told apart when evaluated). Empty when a level is missing."""
    if "*" not in path:
        at = ".".join(("object", *path))
        return f"({_has(at + '.spec')} ? [{at}.spec] : [])"
    i = path.index("*")
    items = ".".join(("object", *path[:i]))
    rest = ".".join(("v", *path[i + 1:]))
    values = {"list": items, "map": f"{items}.map(k, {items}[k])",
              "any": f"(type({items}) == map ? {items}.map(k, {items}[k]) : {items})"}[shape]
    keep = _has(rest + ".spec")
    return (f"({_has(items)} ? {values}.filter(v, {keep}).map(v, {rest}.spec) : [])")


def _configured_specs(w: WorkloadKind) -> str:
    return " + ".join(_specs(*parse_pointer(r.template), shape="any") for r in w.roles)


def _crd_specs(b: BuiltIn) -> str:
    """CEL for the pod specs of a built-in training kind, from the places its reader finds
    them (``BuiltIn.templates``); a TrainJob's and an Argo step's are made up of their
    containers."""
    t = b.templates
    if t.made_of == "resources":
        res = ".".join(("object", *t.paths[0]))
        return f"({_has(res)} ? [{{'containers': [{{'resources': {res}}}]}}] : [])"
    if t.made_of == "steps":
        at = ".".join(("object", *t.paths[0]))
        containers = ("(has(t.container) ? [t.container] : []) + "
                      "(has(t.script) ? [t.script] : []) + "
                      "(has(t.containerSet) && has(t.containerSet.containers) ? "
                      "t.containerSet.containers : [])")
        return f"({_has(at)} ? {at}.map(t, {{'containers': {containers}}}) : [])"
    return " + ".join(_specs(*path, shape=t.shape) for path in t.paths)


def exemption_expression(users: list[str], groups: list[str], accounts: list[str]) -> str:
    """CEL that is false for a request the policy exempts by user, group or account."""
    terms = []
    if users or accounts:
        terms.append(f"(has(request.userInfo.username) && request.userInfo.username in "
                     f"{_list([*users, *accounts])})")
    if groups:
        terms.append(f"(has(request.userInfo.groups) && "
                     f"request.userInfo.groups.exists(g, g in {_list(groups)}))")
    return f"!({' || '.join(terms)})" if terms else ""


def _client_config(kind: str, options: Options) -> dict[str, Any]:
    config: dict[str, Any]
    if options.url:
        config = {"url": f"{options.url.rstrip('/')}/{kind}"}
    else:
        config = {"service": {"name": options.service, "namespace": options.namespace,
                              "path": f"/{kind}", "port": options.port}}
    if options.ca_bundle:
        config["caBundle"] = base64.b64encode(options.ca_bundle).decode()
    return config
