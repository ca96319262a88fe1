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

``resize.gpu-webhook.dev`` is sent a GPU pod's in-place resize (``pods/resize``, GA in
1.35) where a tenant's CPU and memory per GPU are capped (``resourcesPerGpu``): the new
resources are held to the caps, as at creation (``webhook.engine.resize``). A resize
cannot change a pod's GPUs, so quota is not asked; resizes of pods without GPUs are
never sent. It follows the validating failurePolicy.

``release.gpu-webhook.dev`` is sent the DELETE of the kinds that can have a gang (the
built-in training kinds but Ray and Argo, PodGroups and CompositePodGroups, and the
configured kinds with a gang): the
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

``policy-file.gpu-webhook.dev`` is sent the CREATE and UPDATE of the policy ConfigMap
(``gpu-webhook-policy`` in the webhook's own namespace) at ``/validate-policy``: an edit
the loader refuses is refused at apply, with the located messages of ``gpu-webhook
policy check``. It is always ``Ignore``: the install creates the ConfigMap before any
replica answers.

``gates.gpu-webhook.dev`` is sent a pod's UPDATE only when it removes the scheduling gate
``gpu-webhook.dev/quota`` of a pod waiting for quota (a CEL matchCondition compares the
old and new gates; no other pod update is sent): only the webhook's own identity may
remove it, having charged the pod first (``webhook.server.leading.release``). It follows
the validating failurePolicy: with ``Fail`` and no replica answering, no waiting pod is
released, by anyone.

The configurations must be rendered again when the policy's GPU resources, toleration
keys, ``nonGpuPodsToleratingGpuTaints``, exemptions, ``workloadKinds`` or the tenants'
namespaces (names and selectors) change.

Modules: rules (what each webhook is sent: rules, namespaces), cel (its
matchConditions); this one puts them together into the two configurations.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from webhook.policy.apiserver.cel import (
    GATE_REMOVED,
    NEEDS_STATE,
    SCALE_UP,
    claim_expression,
    claims_expression,
    exemption_expression,
    for_pod_spec,
    gpu_pod_expression,
    kai_expression,
    string_list,
    tolerates_expression,
    with_spec,
)
from webhook.policy.apiserver.rules import (
    CLAIM_RULES,
    GATE_RULES,
    GROUP,
    NAMESPACE_LABEL,
    POLICY_CONFIGMAP,
    POLICY_FILE_RULES,
    POLICY_RULES,
    RESIZE_RULES,
    ROUTE_RULES,
    RULES,
    SCALE_RULES,
    caps_resources,
    natively_mutated,
    release_rules,
    route_scopes,
    workload_rules,
)
from webhook.policy.model import GPUPolicy, TolerationPolicy

FailurePolicy = Literal["Fail", "Ignore"]
AdmissionMode = Literal["webhook", "fallback", "native"]
ADMISSION_MODES: tuple[AdmissionMode, ...] = ("webhook", "fallback", "native")


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
    exempt_namespaces: tuple[str, ...] = ()
    """Namespaces never sent, besides kube-system, ``namespace`` and the policy's exempt
    ones (the Helm chart's ``exemptNamespaces``)."""
    admission_mode: AdmissionMode = "webhook"
    """Where the stateless rules run (:mod:`.native`): ``webhook`` only in the webhook;
    ``fallback`` in the API server's admission policies too, the routes webhooks (pods
    without GPUs) then failing open; ``native`` in the API server only, the routes
    webhooks sent only the pods whose rules need the webhook's state."""


# The install's choices, written on both configurations: with the policy they determine
# every webhook (but its caBundle), so the leader can render them again from a new policy
# exactly as ``manifests`` or the chart did, and tell what differs (drift.py).
INSTALL_ANNOTATION = f"{GROUP}/install"


def install_record(options: Options) -> str:
    """The annotation's value: the options as JSON (the CA is the cluster's, not ours)."""
    record: dict[str, Any] = {
        "namespace": options.namespace, "timeoutSeconds": options.timeout_seconds,
        "mutatingFailurePolicy": options.mutating_failure_policy,
        "validatingFailurePolicy": options.validating_failure_policy,
        "exemptNamespaces": sorted(options.exempt_namespaces)}
    if options.admission_mode != "webhook":
        record["admissionMode"] = options.admission_mode
    if options.url:
        record["url"] = options.url
    else:
        record["service"] = {"name": options.service, "port": options.port}
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def options_of(configuration: dict[str, Any]) -> Options:
    """The options a configuration was rendered with, from its install annotation;
    ValueError saying what is wrong and how to put it right."""
    meta = configuration.get("metadata") or {}
    where = f"{str(configuration.get('kind', '')).lower()} {meta.get('name', '')}"
    text = (meta.get("annotations") or {}).get(INSTALL_ANNOTATION)
    fix = ("render it with `gpu-webhook manifests` or install it with the Helm chart or "
           "deploy/base")
    if not text:
        raise ValueError(f"{where} has no annotation {INSTALL_ANNOTATION}, so the "
                         f"webhook cannot tell how it was installed: {fix}")
    try:
        record = json.loads(text)
        service = record.get("service") or {}
        exempt = record.get("exemptNamespaces") or []
        options = Options(
            name=str(meta.get("name") or "gpu-webhook"),
            namespace=str(record["namespace"]),
            service=str(service.get("name", "gpu-webhook")),
            port=int(service.get("port", 443)),
            url=str(record["url"]) if record.get("url") else None,
            timeout_seconds=int(record.get("timeoutSeconds", 5)),
            mutating_failure_policy=_failure(record.get("mutatingFailurePolicy", "Fail")),
            validating_failure_policy=_failure(record.get("validatingFailurePolicy", "Fail")),
            exempt_namespaces=tuple(str(n) for n in exempt),
            admission_mode=_mode(record.get("admissionMode", "webhook")))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{where}: annotation {INSTALL_ANNOTATION} is not a record of "
                         f"the install ({exc.__class__.__name__}: {exc}): {fix}") from None
    return options


def _failure(value: object) -> FailurePolicy:
    if value == "Fail":
        return "Fail"
    if value == "Ignore":
        return "Ignore"
    raise ValueError(f"failure policy {value!r} is neither Fail nor Ignore")


def _mode(value: object) -> AdmissionMode:
    for mode in ADMISSION_MODES:
        if value == mode:
            return mode
    raise ValueError(f"admission mode {value!r} is none of {', '.join(ADMISSION_MODES)}")


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
    annotations = {INSTALL_ANNOTATION: install_record(options)}
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": options.name, "labels": labels, "annotations": annotations},
         "webhooks": [r.pods("mutate", mutating),
                      *([r.claims("mutate", mutating)] if claims else []),
                      *[r.route(*scope) for scope in route_scopes(policy, r.excluded)]]},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": options.name, "labels": labels,
                      "annotations": dict(annotations)},
         "webhooks": [r.pods("validate", validating), r.scale(),
                      *([r.resize(validating)] if caps_resources(policy) else []),
                      *([r.claims("validate", validating)] if claims else []),
                      r.release(), r.gates(validating), r.policies(validating),
                      r.policy_file()]},
    ]


class _Rendering:
    """The webhooks of one policy's configurations, each from what they share: the CEL
    that tells a GPU pod, the exempt users, the namespaces left out, the options."""

    def __init__(self, policy: GPUPolicy, options: Options) -> None:
        self.policy = policy
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
        self.excluded = sorted({"kube-system", options.namespace, *spec.exemptions.namespaces,
                                *options.exempt_namespaces})

    def _hook(self, name: str, path: str, rules: Any, side_effects: str, failure: str, *,
              selector: dict[str, Any] | None = None,
              conditions: list[dict[str, str]] | None = None,
              reinvoke: bool = False, exemptable: bool = True) -> dict[str, Any]:
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
            if self.exempt and exemptable:
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
                       "expression": for_pod_spec(lambda s: with_spec(wanted, s),
                                                  self.spec.workload_kinds)}]
        if self.kai is not None:
            conditions[0]["expression"] += f" || {self.kai}"
        free = (natively_mutated(self.policy)
                if kind == "mutate" and self.options.admission_mode == "native" else [])
        if free:
            # The native policies make every change these namespaces' GPU pods need:
            # one webhook call (the quota's) instead of two.
            conditions.append({"name": "pods-needing-the-webhook", "expression": (
                f"request.kind.kind != 'Pod' || !(request.namespace in "
                f"{string_list(free)}) || {with_spec(claims_expression(), 'object.spec')}"
                + (f" || {self.kai}" if self.kai is not None else ""))})
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

    def resize(self, failure: FailurePolicy) -> dict[str, Any]:
        """A GPU pod's in-place resize, held to the per-GPU caps; the resize of a pod
        without GPUs is never sent (the API server allows no change of GPUs by it)."""
        gpu = with_spec(self.gpu, "object.spec")
        return self._hook("resize", "validate", RESIZE_RULES, "None", failure,
                          selector=self._not_excluded(),
                          conditions=[{"name": "gpu-pods", "expression": gpu}])

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

    def policy_file(self) -> dict[str, Any]:
        """The policy ConfigMap in the webhook's own namespace, checked by the loader at
        each edit (``kubectl edit``, ``helm upgrade``): a policy that does not load is
        refused with its located messages, where it would otherwise be loaded by no
        replica. Always Ignore: the install creates the ConfigMap before any replica
        answers, and an upgrade must go through while none does."""
        return self._hook(
            "policy-file", "validate-policy", POLICY_FILE_RULES, "None", "Ignore",
            selector={"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "In",
                                            "values": [self.options.namespace]}]},
            conditions=[{"name": "the-policy-configmap",
                         "expression": f"object.metadata.name == '{POLICY_CONFIGMAP}'"}],
            exemptable=False)

    def route(self, name: str, selector: dict[str, Any], only: list[str] | None
              ) -> dict[str, Any]:
        """Pods of tenants' namespaces the GPU webhook is not sent (it runs the same rules
        on its own), and every ephemeral container added there: its pod may be a GPU
        pod. It only mutates."""
        sent = with_spec(self.wanted["mutate"], "object.spec")
        if self.kai is not None:
            sent = f"{sent} || {self.kai}"
        test = (f"(has(request.subResource) && request.subResource == 'ephemeralcontainers')"
                f" || !(has(object.spec) && ({sent}))")
        conditions = [{"name": "pods-not-sent-as-gpu-pods", "expression": test}]
        mode = self.options.admission_mode
        if mode == "native" and not any(t.priority is not None and t.priority.default_class
                                        for t in self.spec.tenants):
            # The native policies decide the rest; a tenant's default PriorityClass is
            # given to pods that name none, so then every pod is still sent.
            conditions.append({"name": "pods-needing-state", "expression": NEEDS_STATE})
        if only is not None:
            conditions.insert(0, {"name": "tenant-namespaces",
                                  "expression": f"request.namespace in {string_list(only)}"})
        # Beside the native policies a pod without GPUs is still created, and
        # neutralized, while no replica answers: these webhooks fail open.
        failure = ("Ignore" if self.options.admission_mode != "webhook"
                   else self.options.mutating_failure_policy)
        return self._hook(name, "mutate", ROUTE_RULES, "None", failure,
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
