"""Helpers to run the real webhook server the way a user does, and to talk to it.

``gpu-webhook serve`` is started as a subprocess of the installed console script
(``kit.start_server``, by the ``server`` fixtures), on a free port of 127.0.0.1 with a
fresh certificate directory; the tests talk to it with httpx over TLS, verifying the CA
the server generated (``ca.pem``), so the certificate, the SANs and the TLS settings are
exercised exactly as a caller sees them. Here: the pods and AdmissionReviews they send.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kit import Server

from webhook.k8s.review import request_review

ServerFactory = Callable[..., Server]


def pod(name: str = "trainer", namespace: str = "research", *, gpus: object = 2,
        **spec: Any) -> dict[str, Any]:
    """A Pod manifest; ``gpus=None`` makes it a plain CPU pod."""
    resources: dict[str, Any] = {"limits": {"cpu": "1"}}
    if gpus is not None:
        resources = {"limits": {"nvidia.com/gpu": gpus}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "pytorch:2", "resources": resources}],
                 **spec},
    }


def review(obj: dict[str, Any], uid: str = "4f1c9a55-0b5e-4d3c-9f00-1a2b3c4d5e6f",
           **kw: Any) -> dict[str, Any]:
    """The AdmissionReview the API server would send for ``obj``."""
    return dict(request_review(obj, uid=uid, **kw))
