"""The webhook configurations kept as the served policy needs them, by the leader.

Which pods the API server sends to the webhook is decided by the webhook configurations
(their rules, namespace selectors and CEL matchConditions), and those follow from the
policy: a tenant chosen by another label, a new GPU resource name, an exemption. A chart
cannot run the renderer at template time, a ConfigMap or GPUPolicy edited after the
install changes the policy without touching them, and nothing else would notice the two
apart: the pods of a new tenant's namespaces that ask for no GPU would never be sent, and
would keep every GPU their image's ``NVIDIA_VISIBLE_DEVICES`` names. So the leader
renders them itself, from the policy it serves and the options the install recorded on
them (:mod:`webhook.policy.apiserver.drift`), at once when a new policy is served and
every ``--quota-status-seconds`` after, and:

- reports what differs: ``gpu_webhook_configuration_drift`` by configuration, a Warning
  Event ``WebhookConfigurationDrift`` on the configuration (``kubectl get events -n
  default``, where the Events of cluster-scoped objects are kept), a log line, and
  ``/readyz``'s ``webhookConfigurations``;
- with ``--webhook-configurations-sync fix`` (the default), writes the webhooks as the
  policy needs them (a JSON Patch conditional on the resourceVersion read; RBAC ``patch``
  on the two configurations by name), keeping each webhook's caBundle, and says so in a
  Normal Event ``WebhookConfigurationUpdated``; with ``report`` it only reports, for an
  install whose configurations are kept by something else (GitOps).

Only the leader writes: replicas serving two generations of a policy during a rollout
would otherwise write their own in turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from webhook.admission.native import policies as native
from webhook.libs import kube, logs
from webhook.policy.apiserver.drift import Drift, compare, compare_native, wanted
from webhook.policy.model import GPUPolicy
from webhook.server import metrics

DRIFT_REASON = "WebhookConfigurationDrift"
UPDATED_REASON = "WebhookConfigurationUpdated"


@dataclass
class ConfigurationKeeper:
    configurations: kube.WebhookConfigurations
    names: dict[str, str]  # "mutating"/"validating" -> configuration name
    policy: Callable[[], tuple[int, GPUPolicy | None]]  # (generation, document) served
    leading: Callable[[], bool]
    interval: float = 10.0
    fix: bool = True
    # The native admission policies (admission modes fallback and native), kept by the
    # same rounds; None: not looked at (no RBAC to list them).
    policies: kube.AdmissionPolicies | None = None
    # The last comparison by kind, for /readyz and the tests; empty until the first.
    drift: dict[str, Drift] = field(default_factory=dict)
    _told: dict[str, str] = field(default_factory=dict)  # the drift last reported, by kind
    _failing: str = ""

    def summary(self) -> str:
        """What /readyz says: "in step", the differences, or not compared yet."""
        if not self.drift:
            return "not compared (only the leader compares them)"
        found = [d.describe() for d in self.drift.values() if d]
        return "; ".join(found) if found else "in step with the policy"

    async def run(self) -> None:
        due, seen = 0.0, -1
        while True:
            generation = self.policy()[0]
            if self.leading() and (time.monotonic() >= due or generation != seen):
                due, seen = time.monotonic() + self.interval, generation
                try:
                    await asyncio.to_thread(self.once)
                    self._failing = ""
                except kube.KubeError as exc:
                    self._fail(str(exc), exc.detail)
                except Exception as exc:  # a bug must not stop the keeper for good
                    self._fail(f"{exc.__class__.__name__}: {exc}", "")
            elif not self.leading():
                due = 0.0
                if self.drift:  # another replica compares them now, and reports
                    self.drift.clear()
                    metrics.CONFIGURATION_DRIFT.clear()
            await asyncio.sleep(min(self.interval, 1.0))

    def _fail(self, error: str, detail: str) -> None:
        """A round that failed, logged once until it fails otherwise; the next tries."""
        if self._failing != error:
            logs.event("webhook configurations not compared with the policy; tried again",
                       logging.WARNING, error=error, detail=detail)
        self._failing = error

    def once(self) -> dict[str, Drift]:
        """Compare both configurations with the policy, and write those that differ
        (with ``fix``). Returns what was found before any write; what /readyz says
        afterwards is what is left (nothing, for a configuration written)."""
        _, model = self.policy()
        if model is None:
            return {}
        found, left = {}, {}
        held: dict[str, dict[str, object] | None] = {}
        for kind, name in self.names.items():
            live = held[kind] = self.configurations.read(kind, name)
            drift = compare(model, kind, name, live)
            found[kind] = left[kind] = drift
            configuration = drift.configuration
            metrics.CONFIGURATION_DRIFT.labels(configuration).set(_count(drift))
            if not drift:
                self._told.pop(kind, None)
                continue
            text = drift.describe()
            if self._told.get(kind) != text:
                self._told[kind] = text
                logs.event("a webhook configuration differs from what the policy needs",
                           logging.WARNING, configuration=configuration, drift=text,
                           policy=model.metadata.name)
                fixing = self.fix and live is not None and not drift.unusable
                then = ("the leader writes it as the policy needs" if fixing else
                        "not written: --webhook-configurations-sync report" if not self.fix
                        else "the leader cannot write it")
                self._event(kind, name, DRIFT_REASON, "Warning",
                            f"{text} (policy {model.metadata.name}; {then})")
            if self.fix and live is not None and not drift.unusable and \
                    self._write(kind, name, model, live, drift):
                left[kind] = Drift(kind, name)
        want = (native.wanted(model, held.get("mutating")) if self.policies is not None
                else [])
        # Only an install in admission mode fallback or native has them (and grants the
        # RBAC to list them): in mode webhook they are not looked for.
        if want:
            drift, live_policies = self._native(model, want)
            found["native"] = left["native"] = drift
            if self.fix and drift and live_policies is not None and \
                    self._write_native(model, want, live_policies):
                left["native"] = Drift("native", drift.name)
        self.drift = left
        return found

    def _native(self, model: GPUPolicy, want: list[dict[str, Any]]
                ) -> tuple[Drift, list[dict[str, Any]] | None]:
        """The native admission policies held against those the install's mode needs,
        and those held (None: they could not be listed)."""
        assert self.policies is not None
        name = self.names["mutating"]
        live: list[dict[str, Any]] | None
        try:
            live = native.ours(self.policies.list(native.SELECTOR), name)
        except kube.KubeError as exc:
            drift = Drift("native", f"{name}.*", unusable=(
                f"not compared: {exc} (RBAC: list on the four admission policy resources, "
                "which the chart and deploy/components/native-policies grant)"))
            live = None
        if live is not None:
            drift = compare_native(name, want, live)
        metrics.CONFIGURATION_DRIFT.labels(drift.configuration).set(_count(drift))
        if not drift:
            self._told.pop("native", None)
        elif self._told.get("native") != drift.describe():
            self._told["native"] = drift.describe()
            logs.event("the native admission policies differ from what the policy needs",
                       logging.WARNING, drift=drift.describe(), policy=model.metadata.name)
            self._event("mutating", self.names["mutating"], DRIFT_REASON, "Warning",
                        f"{drift.describe()} (policy {model.metadata.name}; "
                        f"{'the leader writes them' if self.fix else 'not written: report'})")
        return drift, live

    def _write_native(self, model: GPUPolicy, want: list[dict[str, Any]],
                      held: list[dict[str, Any]]) -> bool:
        """Apply the policies and bindings wanted, then delete those ``held`` that are not
        needed (the apply makes none of those)."""
        assert self.policies is not None
        name = self.names["mutating"]
        keep = {(o["kind"], o["metadata"]["name"]) for o in want}
        try:
            # Policies before their bindings, bindings deleted before their policies.
            for obj in sorted(want, key=lambda o: str(o["kind"]).endswith("Binding")):
                self.policies.apply(obj)
            for obj in sorted(held, key=lambda o: not str(o["kind"]).endswith("Binding")):
                key = (str(obj["kind"]), str(obj["metadata"]["name"]))
                if key not in keep:
                    self.policies.delete(*key)
        except kube.KubeError as exc:
            metrics.CONFIGURATION_WRITES.labels("admission policies", "failed").inc()
            logs.event("native admission policies not written as the policy needs (RBAC: "
                       "patch, list and delete on them); the drift stays reported",
                       logging.WARNING, error=str(exc), detail=exc.detail)
            return False
        metrics.CONFIGURATION_WRITES.labels("admission policies", "written").inc()
        metrics.CONFIGURATION_DRIFT.labels(f"admission policies {name}.*").set(0)
        self._told.pop("native", None)
        logs.event("native admission policies written as the policy needs",
                   policy=model.metadata.name, objects=len(want))
        self._event("mutating", name, UPDATED_REASON, "Normal",
                    f"native admission policies written as policy {model.metadata.name} "
                    f"needs ({len(want)} objects)")
        return True

    def _write(self, kind: str, name: str, model: GPUPolicy, live: dict[str, object],
               drift: Drift) -> bool:
        configuration = drift.configuration
        meta = live.get("metadata")
        version = str(meta.get("resourceVersion", "")) if isinstance(meta, dict) else ""
        try:
            self.configurations.replace_webhooks(
                kind, name, version, wanted(model, kind, live)["webhooks"])
        except kube.Conflict as exc:
            # Changed since it was read (a caBundle rotation): compared again next round.
            metrics.CONFIGURATION_WRITES.labels(configuration, "conflict").inc()
            logs.event("webhook configuration changed while being written; compared again",
                       configuration=configuration, detail=exc.detail)
            return False
        except kube.KubeError as exc:
            metrics.CONFIGURATION_WRITES.labels(configuration, "failed").inc()
            logs.event("webhook configuration not written as the policy needs (RBAC: patch "
                       "on it by name); the drift stays reported", logging.WARNING,
                       configuration=configuration, error=str(exc), detail=exc.detail)
            return False
        metrics.CONFIGURATION_WRITES.labels(configuration, "written").inc()
        metrics.CONFIGURATION_DRIFT.labels(configuration).set(0)
        self._told.pop(kind, None)
        logs.event("webhook configuration written as the policy needs",
                   configuration=configuration, policy=model.metadata.name,
                   was=drift.describe())
        self._event(kind, name, UPDATED_REASON, "Normal",
                    f"written as policy {model.metadata.name} needs; it was: "
                    f"{drift.describe()}")
        return True

    def _event(self, kind: str, name: str, reason: str, type_: str, message: str) -> None:
        try:
            self.configurations.event(kind, name, reason, message, type_)
        except kube.KubeError as exc:
            logs.event("event not written on the webhook configuration", logging.WARNING,
                       configuration=f"{kind} {name}", reason=reason, error=str(exc))


def _count(drift: Drift) -> int:
    if drift.unusable:
        return 1
    return len(drift.missing) + len(drift.extra) + len(drift.changed)
