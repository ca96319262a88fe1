"""core/v1 Events the webhook writes: on a pod waiting for quota (``kubectl describe
pod``), and on a webhook configuration that differs from the policy (in the namespace
``default``, where the API server keeps the Events of cluster-scoped objects). RBAC:
``create`` on events.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client

from webhook.libs.kube.api import translated


def write_event(core: client.CoreV1Api, namespace: str, involved: dict[str, Any],
                reason: str, message: str, kind: str, *, component: str, instance: str,
                timeout: float) -> None:
    """One Event about ``involved`` (apiVersion, kind, name, and namespace/uid where it
    has them), stored in ``namespace``."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    name = str(involved.get("name") or "object")
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason, "message": message[:1024], "type": kind,
        "source": {"component": component},
        "reportingComponent": component, "reportingInstance": instance,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
    where = f"{involved.get('namespace')}/{name}" if involved.get("namespace") else name
    with translated(f"write an event on {str(involved.get('kind', '')).lower()} {where}",
                    timeout):
        core.create_namespaced_event(namespace, cast(Any, body), _request_timeout=timeout)
