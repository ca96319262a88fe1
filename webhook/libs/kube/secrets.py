"""Secrets read and written with a resourceVersion precondition: the self-managed
serving certificates."""

from __future__ import annotations

import base64
from dataclasses import dataclass

from kubernetes import client

from webhook.libs.kube.api import KubeError, NotFound, translated


@dataclass(frozen=True, slots=True)
class StoredSecret:
    """A Secret's decoded data, its annotations and the resourceVersion it was read at."""

    data: dict[str, bytes]
    annotations: dict[str, str]
    resource_version: str | None  # None: the Secret does not exist yet


class Secrets:
    """Read and compare-and-swap write of one namespace's Secrets (the certificate Secret:
    RBAC allows get/update on that name only, and create)."""

    def __init__(self, api: client.ApiClient, namespace: str, timeout: float = 5.0) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.timeout = timeout

    def read(self, name: str) -> StoredSecret:
        what = f"read secret {self.namespace}/{name}"
        try:
            with translated(what, self.timeout):
                secret = self.core.read_namespaced_secret(name, self.namespace,
                                                          _request_timeout=self.timeout)
        except NotFound:
            return StoredSecret({}, {}, None)
        meta = secret.metadata
        try:
            data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
        except ValueError:
            raise KubeError(what, "its data is not base64") from None
        return StoredSecret(data, dict(meta.annotations or {}) if meta else {},
                            meta.resource_version if meta else None)

    def write(self, name: str, data: dict[str, bytes], annotations: dict[str, str],
              resource_version: str | None, labels: dict[str, str],
              secret_type: str = "kubernetes.io/tls") -> str:
        """Create (``resource_version`` None; AlreadyExists is a Conflict) or replace only
        if unchanged since read (else Conflict). Returns the new resourceVersion."""
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, namespace=self.namespace, labels=labels,
                                         annotations=annotations,
                                         resource_version=resource_version),
            type=secret_type,
            data={k: base64.b64encode(v).decode() for k, v in data.items()},
        )
        what = f"{'create' if resource_version is None else 'update'} secret " \
               f"{self.namespace}/{name}"
        with translated(what, self.timeout):
            out = (self.core.create_namespaced_secret(
                       self.namespace, body, _request_timeout=self.timeout)
                   if resource_version is None else
                   self.core.replace_namespaced_secret(
                       name, self.namespace, body, _request_timeout=self.timeout))
        return str(out.metadata.resource_version) if out.metadata else ""
