"""Custom resources: GPUPolicy objects (the served policy), and the objects the leader
keeps by server-side apply (GPUQuota, PolicyReport)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from webhook.libs.kube.api import NotFound, json_object, translated
from webhook.libs.kube.watch import Watcher

POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL = "gpu-webhook.dev", "v1alpha1", "gpupolicies"


class GPUPolicies:
    """One named GPUPolicy (cluster-scoped): read it, watch it, and replace its status
    subresource only if unchanged since it was read. RBAC: get, list and watch on
    gpupolicies; update on gpupolicies/status."""

    def __init__(self, api: client.ApiClient, name: str, timeout: float = 5.0) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.name = name
        self.timeout = timeout

    def read(self) -> dict[str, Any]:
        """The object as a plain dict; NotFound when there is none of that name (or no
        GPUPolicy CRD at all)."""
        what = f"read gpupolicy {self.name}"
        with translated(what, self.timeout):
            resp: Any = self.custom.get_cluster_custom_object(
                POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, self.name,
                _preload_content=False, _request_timeout=self.timeout)
        return json_object(what, resp.data)

    def replace_status(self, obj: dict[str, Any]) -> None:
        """Write ``obj["status"]``; ``obj["metadata"]["resourceVersion"]`` is the
        precondition (a Conflict when the object changed since)."""
        with translated(f"update the status of gpupolicy {self.name}", self.timeout):
            self.custom.replace_cluster_custom_object_status(
                POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, self.name, obj,
                _preload_content=False, _request_timeout=self.timeout)

    def watcher(self, deliver: Callable[[str, dict[str, Any]], None]) -> Watcher:
        """A :class:`Watcher` of this one object (a field selector on its name)."""
        custom, name = self.custom, self.name

        def list_one(**kw: Any) -> Any:
            return custom.list_cluster_custom_object(
                POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL,
                field_selector=f"metadata.name={name}", **kw)

        return Watcher(self.api, POLICY_PLURAL, deliver, list_fn=list_one)


APPLY = "application/apply-patch+yaml"  # server-side apply (JSON is valid YAML)


class CustomObjects:
    """Server-side apply, list and delete of one namespaced custom resource, as plain
    dicts (the GPUQuota status objects, the audit's PolicyReports).

    An apply is create-or-update in one call, with no read first, and owns only the
    fields it sets under ``field_manager``: forced, because one writer (the leader
    replica) owns these objects and a previous leader's fields are its own too.
    """

    def __init__(self, api: client.ApiClient, group: str, version: str, plural: str,
                 field_manager: str = "gpu-webhook", timeout: float = 5.0) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.group, self.version, self.plural = group, version, plural
        self.field_manager = field_manager
        self.timeout = timeout

    def apply(self, obj: dict[str, Any], status: bool = False) -> None:
        """Apply ``obj`` (its ``status`` subresource alone when ``status``). Applying the
        status of an object that does not exist yet is a NotFound."""
        meta = obj["metadata"]
        ns, name = str(meta["namespace"]), str(meta["name"])
        what = f"apply {self.plural.removesuffix('s')}{' status' if status else ''} {ns}/{name}"
        fn = (self.custom.patch_namespaced_custom_object_status if status
              else self.custom.patch_namespaced_custom_object)
        with translated(what, self.timeout):
            fn(self.group, self.version, ns, self.plural, name, obj,
               field_manager=self.field_manager, force=True, _content_type=APPLY,
               _preload_content=False, _request_timeout=self.timeout)

    def list(self, label_selector: str = "", namespace: str | None = None
             ) -> list[dict[str, Any]]:
        """Every object in every namespace, or in ``namespace`` (with
        ``label_selector``). A resource the API server does not serve (its CRD not
        installed) is a NotFound."""
        what = f"list {self.plural}.{self.group}" + (f" in {namespace}" if namespace else "")
        kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout}
        if label_selector:
            kw["label_selector"] = label_selector
        with translated(what, self.timeout):
            resp: Any = (self.custom.list_namespaced_custom_object(
                self.group, self.version, namespace, self.plural, **kw) if namespace else
                self.custom.list_cluster_custom_object(
                    self.group, self.version, self.plural, **kw))
        return list(json_object(what, resp.data).get("items") or ())

    def delete(self, namespace: str, name: str) -> None:
        """Delete one object; one already gone is fine."""
        what = f"delete {self.plural.removesuffix('s')} {namespace}/{name}"
        try:
            with translated(what, self.timeout):
                self.custom.delete_namespaced_custom_object(
                    self.group, self.version, namespace, self.plural, name,
                    _preload_content=False, _request_timeout=self.timeout)
        except NotFound:
            pass


class ClusterRecords:
    """Read, compare-and-swap write and delete of one cluster-scoped custom resource of
    ours (the GPUUsage days): a write names the resourceVersion it read, and a Conflict
    says another writer got there first."""

    def __init__(self, api: client.ApiClient, group: str, version: str, plural: str,
                 kind: str, timeout: float = 5.0) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.group, self.version, self.plural, self.kind = group, version, plural, kind
        self.timeout = timeout

    def list(self) -> list[dict[str, Any]]:
        """Every object; a resource the API server does not serve is a NotFound."""
        what = f"list {self.plural}.{self.group}"
        with translated(what, self.timeout):
            resp: Any = self.custom.list_cluster_custom_object(
                self.group, self.version, self.plural, _preload_content=False,
                _request_timeout=self.timeout)
        return list(json_object(what, resp.data).get("items") or ())

    def write(self, name: str, labels: dict[str, str], fields: dict[str, Any],
              resource_version: str | None) -> None:
        """Create ``name`` (``resource_version`` None) or replace it only if unchanged
        since read; Conflict otherwise (an existing name on create too)."""
        meta: dict[str, Any] = {"name": name, "labels": labels}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        body = {"apiVersion": f"{self.group}/{self.version}", "kind": self.kind,
                "metadata": meta, **fields}
        what = f"write {self.plural.removesuffix('s')} {name}"
        kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout}
        with translated(what, self.timeout):
            if resource_version is None:
                self.custom.create_cluster_custom_object(
                    self.group, self.version, self.plural, body, **kw)
            else:
                self.custom.replace_cluster_custom_object(
                    self.group, self.version, self.plural, name, body, **kw)

    def delete(self, name: str) -> None:
        """Delete one object; one already gone is fine."""
        try:
            with translated(f"delete {self.plural.removesuffix('s')} {name}", self.timeout):
                self.custom.delete_cluster_custom_object(
                    self.group, self.version, self.plural, name, _preload_content=False,
                    _request_timeout=self.timeout)
        except NotFound:
            pass
