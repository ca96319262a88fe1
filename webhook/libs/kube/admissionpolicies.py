"""The native admission policies the leader keeps (MutatingAdmissionPolicies,
ValidatingAdmissionPolicies and their bindings, ``admissionregistration.k8s.io/v1``):
listed by their label, server-side applied, deleted. RBAC: ``list``, ``patch``
(apply) and ``delete`` on the four resources, which the install grants only in the
admission modes that use them."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from webhook.libs.kube.api import NotFound, json_object, translated
from webhook.libs.kube.custom import APPLY

GROUP, VERSION = "admissionregistration.k8s.io", "v1"
PLURALS = {"MutatingAdmissionPolicy": "mutatingadmissionpolicies",
           "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
           "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
           "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}


class AdmissionPolicies:
    """The four kinds as plain dicts, each listed item given its ``kind``."""

    def __init__(self, api: client.ApiClient, field_manager: str = "gpu-webhook",
                 timeout: float = 5.0) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.field_manager = field_manager
        self.timeout = timeout

    def list(self, label_selector: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, plural in PLURALS.items():
            what = f"list {plural}"
            with translated(what, self.timeout):
                resp: Any = self.custom.list_cluster_custom_object(
                    GROUP, VERSION, plural, label_selector=label_selector,
                    _preload_content=False, _request_timeout=self.timeout)
            for item in json_object(what, resp.data).get("items") or ():
                out.append({"kind": kind, "apiVersion": f"{GROUP}/{VERSION}", **item})
        return out

    def apply(self, obj: dict[str, Any]) -> None:
        """Create or update ``obj`` (server-side apply, forced: the leader owns it)."""
        plural = PLURALS[obj["kind"]]
        name = obj["metadata"]["name"]
        with translated(f"apply {plural} {name}", self.timeout):
            self.custom.patch_cluster_custom_object(
                GROUP, VERSION, plural, name, obj, field_manager=self.field_manager,
                force=True, _content_type=APPLY, _preload_content=False,
                _request_timeout=self.timeout)

    def delete(self, kind: str, name: str) -> None:
        """Delete one; one already gone is fine."""
        plural = PLURALS[kind]
        try:
            with translated(f"delete {plural} {name}", self.timeout):
                self.custom.delete_cluster_custom_object(
                    GROUP, VERSION, plural, name, _preload_content=False,
                    _request_timeout=self.timeout)
        except NotFound:
            pass
