"""ConfigMaps read and written with a resourceVersion precondition: the quota ledger's
one object per tenant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.libs.kube.api import (
    NotFound,
    body_bytes,
    json_object,
    resource_version_of,
    string_map,
    translated,
)


@dataclass(frozen=True, slots=True)
class StoredMap:
    """A ConfigMap's data and the resourceVersion it was read at."""

    data: dict[str, str]
    resource_version: str | None  # None: the object does not exist yet


class ConfigMaps:
    """Read and compare-and-swap write of ConfigMaps in one namespace.

    A ledger commit is on the admission path of every GPU pod, and the client's generated
    API methods cost about a millisecond of CPU per call before any byte is sent
    (argument validation, model objects, serialising them, deserialising the answer).
    So these two calls go straight to the client's connection pool: the request is built
    with the client's own ``param_serialize`` (its URL, its auth headers, a refreshed
    token included), the JSON with orjson, and errors come back as the client's
    ``ApiException``, translated like every other call."""

    def __init__(self, api: client.ApiClient, namespace: str, timeout: float = 2.0) -> None:
        self.api = api
        self.namespace = namespace
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        _, url, headers, _, _ = self.api.param_serialize(
            method, path, header_params=headers, auth_settings=["BearerToken"])
        resp = self.api.rest_client.pool_manager.request(
            method, url, body=orjson.dumps(body) if body is not None else None,
            headers=headers, timeout=urllib3.Timeout(total=self.timeout),
            preload_content=False)
        data = body_bytes(resp)
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=resp.reason,
                               body=data.decode("utf-8", "replace"))
        return data

    def read(self, name: str) -> StoredMap:
        what = f"read configmap {self.namespace}/{name}"
        try:
            with translated(what, self.timeout):
                cm = json_object(what, self._call(
                    "GET", f"/api/v1/namespaces/{self.namespace}/configmaps/{name}"))
        except NotFound:
            return StoredMap({}, None)
        return StoredMap(string_map(cm.get("data")), resource_version_of(cm))

    def write(self, name: str, data: dict[str, str], resource_version: str | None,
              labels: dict[str, str]) -> str | None:
        """Create (when ``resource_version`` is None) or replace only if unchanged since
        it was read; raise Conflict otherwise. Returns the resourceVersion written (None
        when the answer does not say), against which the next write can be made without
        reading the map again."""
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": labels}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
        collection = f"/api/v1/namespaces/{self.namespace}/configmaps"
        with translated(f"write configmap {self.namespace}/{name}", self.timeout):
            if resource_version is None:  # AlreadyExists (409) is a Conflict too
                answer = self._call("POST", collection, body)
            else:
                answer = self._call("PUT", f"{collection}/{name}", body)
        try:
            return resource_version_of(orjson.loads(answer))
        except orjson.JSONDecodeError:
            return None  # written; only the version is unknown: read before the next

    def list(self, selector: str) -> dict[str, StoredMap]:
        """Every ConfigMap of the namespace with the labels of ``selector``, by name."""
        what = f"list configmaps in {self.namespace} ({selector})"
        path = f"/api/v1/namespaces/{self.namespace}/configmaps?labelSelector={quote(selector)}"
        with translated(what, self.timeout):
            listed = json_object(what, self._call("GET", path))
        out: dict[str, StoredMap] = {}
        for cm in listed.get("items") or ():
            meta = cm.get("metadata") if isinstance(cm, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if isinstance(name, str):
                out[name] = StoredMap(string_map(cm.get("data")), resource_version_of(cm))
        return out

    def delete(self, name: str) -> None:
        """Delete one (gone already: nothing to do)."""
        try:
            with translated(f"delete configmap {self.namespace}/{name}", self.timeout):
                self._call("DELETE", f"/api/v1/namespaces/{self.namespace}/configmaps/{name}")
        except NotFound:
            return
