"""How the webhook configurations the API server holds differ from what the policy
needs: the webhooks missing, those it does not need, and the fields that differ, each
named, so that a platform engineer reads which pods are not sent (or sent for nothing)
and why.

What the policy needs is :func:`webhook.policy.apiserver.webhooks.render` of the policy
with the options the install recorded on the configuration itself (its
``gpu-webhook.dev/install`` annotation): the Helm chart, ``deploy/base`` and
``gpu-webhook manifests`` all write it, so whoever installed them, the leader renders
the same configurations again from the policy it serves. The ``caBundle`` is the
cluster's (cert-manager's injector or the self-managed certificates keep it) and is
never compared; what the API server fills in by default (``objectSelector: {}``,
``timeoutSeconds: 10``, a rule's ``scope: "*"``, ...) is filled in on both sides first,
so a configuration written by hand with the defaults left out is not drift.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from webhook.policy.apiserver.webhooks import Options, options_of, render
from webhook.policy.model import GPUPolicy

KINDS = {"mutating": "MutatingWebhookConfiguration",
         "validating": "ValidatingWebhookConfiguration",
         "native": "admission policies"}

# The fields of a webhook the policy and the install decide, in the order a report names
# them; clientConfig is compared without its caBundle.
FIELDS = ("clientConfig", "rules", "namespaceSelector", "objectSelector", "matchConditions",
          "failurePolicy", "sideEffects", "timeoutSeconds", "matchPolicy",
          "reinvocationPolicy", "admissionReviewVersions")


@dataclass(frozen=True)
class Drift:
    """One configuration against what the policy needs (empty: in step)."""

    kind: str  # "mutating" or "validating"
    name: str
    missing: tuple[str, ...] = ()  # webhooks the policy needs that are not there
    extra: tuple[str, ...] = ()  # webhooks there that the policy does not need
    changed: tuple[tuple[str, tuple[str, ...]], ...] = ()  # webhook -> fields that differ
    unusable: str = ""  # why it cannot be compared (absent, no install record)

    def __bool__(self) -> bool:
        return bool(self.missing or self.extra or self.changed or self.unusable)

    @property
    def configuration(self) -> str:
        return f"{KINDS[self.kind]} {self.name}"

    def describe(self) -> str:
        """One line: what differs, in the order it matters."""
        if self.unusable:
            return f"{self.configuration}: {self.unusable}"
        if not self:
            return f"{self.configuration}: as the policy needs"
        parts = []
        if self.missing:
            parts.append(f"missing {', '.join(self.missing)}")
        if self.extra:
            parts.append(f"not needed {', '.join(self.extra)}")
        for hook, fields in self.changed:
            parts.append(f"{hook} differs in {', '.join(fields)}")
        return f"{self.configuration}: {'; '.join(parts)}"


def wanted(policy: GPUPolicy, kind: str, live: dict[str, Any]) -> dict[str, Any]:
    """The configuration ``live`` should be under ``policy``, rendered with the options
    it records (ValueError when it records none), each webhook keeping the caBundle it
    holds (a new one: that of the configuration's other webhooks)."""
    options = options_of(live)
    (rendered,) = [o for o in render(policy, _named(options, live))
                   if o["kind"] == KINDS[kind]]
    held = {str(h.get("name")): _bundle(h) for h in live.get("webhooks") or ()}
    shared = next((b for b in held.values() if b), None)
    for hook in rendered["webhooks"]:
        bundle = held.get(hook["name"]) or shared
        if bundle:
            hook["clientConfig"]["caBundle"] = bundle
    return rendered


def compare(policy: GPUPolicy, kind: str, name: str, live: dict[str, Any] | None) -> Drift:
    """``live`` (None: the API server holds no such configuration) against the policy."""
    if live is None:
        return Drift(kind, name, unusable="not found: nothing is sent to the webhook "
                     "through it; install it again (helm upgrade, kubectl apply -k)")
    try:
        want = wanted(policy, kind, live)
    except ValueError as exc:
        return Drift(kind, name, unusable=str(exc))
    have = {str(h.get("name")): _defaulted(h, kind) for h in live.get("webhooks") or ()}
    need = {str(h["name"]): _defaulted(h, kind) for h in want["webhooks"]}
    changed = []
    for hook, fields in need.items():
        if hook in have:
            differ = tuple(f for f in FIELDS if fields.get(f) != have[hook].get(f))
            if differ:
                changed.append((hook, differ))
    return Drift(kind, name,
                 missing=tuple(h for h in need if h not in have),
                 extra=tuple(h for h in have if h not in need),
                 changed=tuple(changed))


def compare_native(name: str, want: list[dict[str, Any]], live: list[dict[str, Any]]
                   ) -> Drift:
    """The native admission policies and bindings held (``live``: those labelled as
    ours) against ``want``: those missing, those not needed, and those whose spec (or
    labels) differ in a field the compiler sets. What the API server fills in by default
    is left out of the comparison: only the fields written are compared."""
    have = {f"{o.get('kind')}/{o['metadata']['name']}": o for o in live}
    need = {f"{o['kind']}/{o['metadata']['name']}": o for o in want}
    changed = []
    for key, obj in need.items():
        if key in have:
            differ = tuple(f for f in obj["spec"]
                           if not _within(obj["spec"][f], have[key].get("spec", {}).get(f)))
            if not _within(obj["metadata"].get("labels", {}),
                           have[key]["metadata"].get("labels", {})):
                differ += ("labels",)
            if differ:
                changed.append((key, differ))
    return Drift("native", f"{name}.*", missing=tuple(k for k in need if k not in have),
                 extra=tuple(k for k in have if k not in need), changed=tuple(changed))


def _within(want: Any, have: Any) -> bool:
    """Every field of ``want`` is in ``have`` with the same value (lists item by item)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(_within(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return (isinstance(have, list) and len(want) == len(have)
                and all(_within(w, h) for w, h in zip(want, have, strict=True)))
    return bool(want == have)


def _named(options: Options, live: dict[str, Any]) -> Options:
    name = str((live.get("metadata") or {}).get("name") or options.name)
    return Options(**{**options.__dict__, "name": name})


def _bundle(hook: dict[str, Any]) -> str | None:
    bundle = (hook.get("clientConfig") or {}).get("caBundle")
    return str(bundle) if bundle else None


def _defaulted(hook: dict[str, Any], kind: str) -> dict[str, Any]:
    """A webhook with what the API server sets when it is left out (admissionregistration
    v1 defaults), and no caBundle."""
    h = copy.deepcopy(hook)
    client = h.setdefault("clientConfig", {})
    client.pop("caBundle", None)
    if "service" in client:
        client["service"].setdefault("port", 443)
    h.setdefault("failurePolicy", "Fail")
    h.setdefault("matchPolicy", "Equivalent")
    h.setdefault("namespaceSelector", {})
    h.setdefault("objectSelector", {})
    h.setdefault("timeoutSeconds", 10)
    h.setdefault("matchConditions", [])
    if kind == "mutating":
        h.setdefault("reinvocationPolicy", "Never")
    for rule in h.get("rules") or ():
        rule.setdefault("scope", "*")
    for selector in (h["namespaceSelector"], h["objectSelector"]):
        for key in ("matchLabels", "matchExpressions"):
            if not selector.get(key):
                selector.pop(key, None)
    return h


# Webhooks whose failurePolicy is always Ignore (webhooks.py): a delete or a scale is never
# the webhook's to block, nor the policy ConfigMap an install creates before any replica.
ALWAYS_IGNORED = ("scale.", "release.", "policy-file.")


def failure_policy_ops(live: dict[str, Any], policy: str) -> tuple[list[dict[str, Any]],
                                                                   list[str]]:
    """The JSON Patch setting ``policy`` (Fail or Ignore) on every webhook of ``live``
    that follows the install's failure policy (not the scale and release webhooks, nor
    the routes webhooks in admission mode fallback or native), each
    guarded by a ``test`` of its name; and the names changed."""
    ops: list[dict[str, Any]] = []
    changed = []
    try:
        beside_native = options_of(live).admission_mode != "webhook"
    except ValueError:
        beside_native = False
    # Beside the native admission policies the routes webhooks always fail open.
    ignored = (*ALWAYS_IGNORED, "routes") if beside_native else ALWAYS_IGNORED
    for i, hook in enumerate(live.get("webhooks") or ()):
        name = str(hook.get("name"))
        if name.startswith(ignored) or hook.get("failurePolicy", "Fail") == policy:
            continue
        ops += [{"op": "test", "path": f"/webhooks/{i}/name", "value": name},
                {"op": "replace" if "failurePolicy" in hook else "add",
                 "path": f"/webhooks/{i}/failurePolicy", "value": policy}]
        changed.append(name)
    return ops, changed
