"""coordination.k8s.io Leases: the leader election's one object."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client

from webhook.libs.kube.api import NotFound, json_object, translated


@dataclass(frozen=True, slots=True)
class StoredLease:
    """A coordination.k8s.io Lease as leader election reads it."""

    holder: str  # "" when released
    duration: float  # leaseDurationSeconds
    transitions: int
    resource_version: str
    address: str = ""  # where the holder answers (ADDRESS_ANNOTATION), "" if unsaid
    renewed: datetime | None = None  # renewTime, as the holder's clock wrote it


# Where the holder can be reached (an https:// URL): the replicas that do not lead relay
# to it what only the leader decides (``serve --quota-commit leader``).
ADDRESS_ANNOTATION = "gpu-webhook.dev/leader-url"


class Leases:
    """Read and compare-and-swap write of Leases in one namespace (the leader Lease:
    RBAC get/update on that name, and create)."""

    def __init__(self, api: client.ApiClient, namespace: str, timeout: float = 5.0) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.timeout = timeout

    def read(self, name: str) -> StoredLease | None:
        what = f"read lease {self.namespace}/{name}"
        try:
            with translated(what, self.timeout):
                resp: Any = self.coordination.read_namespaced_lease(
                    name, self.namespace, _preload_content=False,
                    _request_timeout=self.timeout)
        except NotFound:
            return None
        obj = json_object(what, resp.data)
        spec = obj.get("spec") or {}
        meta = obj.get("metadata") or {}
        return StoredLease(str(spec.get("holderIdentity") or ""),
                           float(spec.get("leaseDurationSeconds") or 0),
                           int(spec.get("leaseTransitions") or 0),
                           str(meta.get("resourceVersion") or ""),
                           str((meta.get("annotations") or {}).get(ADDRESS_ANNOTATION) or ""),
                           _time(spec.get("renewTime")))

    def write(self, name: str, holder: str, duration: int, transitions: int,
              renewed: datetime, resource_version: str | None, address: str = "") -> None:
        """Create (``resource_version`` None; AlreadyExists is a Conflict) or replace only
        if unchanged since read (else Conflict). ``address``: where the holder answers."""
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=name, namespace=self.namespace,
                                         labels={"app.kubernetes.io/name": "gpu-webhook"},
                                         annotations={ADDRESS_ANNOTATION: address}
                                         if address and holder else None,
                                         resource_version=resource_version),
            spec=client.V1LeaseSpec(holder_identity=holder or None,
                                    lease_duration_seconds=duration,
                                    lease_transitions=transitions, renew_time=renewed))
        what = f"{'create' if resource_version is None else 'update'} lease " \
               f"{self.namespace}/{name}"
        with translated(what, self.timeout):
            if resource_version is None:
                self.coordination.create_namespaced_lease(
                    self.namespace, body, _preload_content=False,
                    _request_timeout=self.timeout)
            else:
                self.coordination.replace_namespaced_lease(
                    name, self.namespace, body, _preload_content=False,
                    _request_timeout=self.timeout)


def _time(value: object) -> datetime | None:
    """A MicroTime ("2026-12-07T10:00:00.123456Z"); None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
