"""The mutating and validating webhook configurations: their ``caBundle``, which the
self-managed certificates keep current, and their webhooks, which the leader keeps as the
policy needs them (webhook.server.leading.configurations). RBAC: ``get`` and ``patch`` on
the two named configurations only; ``create`` on events (the drift is reported on them)."""

from __future__ import annotations

import base64
from typing import Any

from kubernetes import client

from webhook.libs.kube.api import Conflict, NotFound, json_object, translated
from webhook.libs.kube.events import write_event

WEBHOOK_KINDS = ("mutating", "validating")


class WebhookConfigurations:
    """The caBundle of named Mutating/ValidatingWebhookConfigurations (RBAC: get and
    patch on those names only)."""

    def __init__(self, api: client.ApiClient, timeout: float = 5.0,
                 instance: str = "") -> None:
        self.admission = client.AdmissionregistrationV1Api(api)
        self.core = client.CoreV1Api(api)
        self.timeout = timeout
        self.instance = instance

    def read(self, kind: str, name: str) -> dict[str, Any] | None:
        """The configuration as a plain dict; None when the API server holds none."""
        try:
            return self._read(kind, name)
        except NotFound:
            return None

    def replace_webhooks(self, kind: str, name: str, resource_version: str,
                         webhooks: list[dict[str, Any]]) -> None:
        """Write ``webhooks`` as the configuration's whole list, only if it is still at
        ``resource_version`` (a JSON Patch ``test``: a Conflict otherwise, for instance
        when a certificate rotation patched a caBundle in between)."""
        self.patch(kind, name, [
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "replace", "path": "/webhooks", "value": webhooks}], "write the webhooks")

    def patch(self, kind: str, name: str, ops: list[dict[str, Any]], what: str) -> None:
        """A JSON Patch of the configuration (a failed ``test``, HTTP 422: a Conflict)."""
        fn = (self.admission.patch_mutating_webhook_configuration if kind == "mutating"
              else self.admission.patch_validating_webhook_configuration)
        with translated(f"{what} of {kind}webhookconfiguration {name}", self.timeout,
                        statuses={422: Conflict}):
            fn(name, ops, _content_type="application/json-patch+json",
               _preload_content=False, _request_timeout=self.timeout)

    def event(self, kind: str, name: str, reason: str, message: str,
              type_: str = "Warning") -> None:
        """An Event on the configuration. The API server keeps the Events of a
        cluster-scoped object in the namespace ``default`` (it refuses them elsewhere)."""
        write_event(self.core, "default", {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": f"{kind.capitalize()}WebhookConfiguration", "name": name},
            reason, message, type_, component="gpu-webhook", instance=self.instance,
            timeout=self.timeout)

    def _read(self, kind: str, name: str) -> dict[str, Any]:
        fn = (self.admission.read_mutating_webhook_configuration if kind == "mutating"
              else self.admission.read_validating_webhook_configuration)
        what = f"read {kind}webhookconfiguration {name}"
        with translated(what, self.timeout):
            resp: Any = fn(name, _preload_content=False, _request_timeout=self.timeout)
        return json_object(what, resp.data)

    def ca_bundles(self, kind: str, name: str) -> dict[str, bytes]:
        """Each webhook's caBundle (decoded; empty when unset), by webhook name."""
        obj = self._read(kind, name)
        return {str(h.get("name")): base64.b64decode((h.get("clientConfig") or {})
                                                     .get("caBundle") or "")
                for h in obj.get("webhooks") or ()}

    def patch_ca_bundle(self, kind: str, name: str, bundle: bytes) -> list[str]:
        """Set ``caBundle`` of every webhook in the configuration that does not already
        hold ``bundle``; returns the names of the webhooks patched.

        A JSON Patch with a ``test`` of each webhook's name before its index is replaced:
        if the list changed between the read and the patch, the API server refuses the
        patch (a Conflict) instead of writing the bundle into the wrong webhook.
        """
        obj = self._read(kind, name)
        encoded = base64.b64encode(bundle).decode()
        ops: list[dict[str, Any]] = []
        patched = []
        for i, hook in enumerate(obj.get("webhooks") or ()):
            if (hook.get("clientConfig") or {}).get("caBundle") == encoded:
                continue
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle",
                        "value": encoded})
            patched.append(str(hook.get("name")))
        if not ops:
            return []
        # 422, a failed ``test``: the webhooks changed since they were read.
        self.patch(kind, name, ops, "patch caBundle")
        return patched
