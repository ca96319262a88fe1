"""Helpers to run the real webhook server the way a user does, and to talk to it.

``gpu-webhook serve`` is started as a subprocess of the installed console script, on a
free port of 127.0.0.1 with a fresh certificate directory; the tests talk to it with
httpx over TLS, verifying the CA the server generated (``ca.pem``), so the certificate,
the SANs and the TLS settings are exercised exactly as a caller sees them.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kit import free_port, healthy_or_stopped, serve, stop_serving

from webhook.k8s.review import request_review

START_TIMEOUT = 30.0  # generous: the first start also generates certificates
STOP_TIMEOUT = 30.0  # uvicorn's graceful shutdown is capped at 20 s


@dataclass
class Server:
    """A running ``gpu-webhook serve`` process and how to reach it."""

    process: subprocess.Popen[bytes]
    port: int
    cert_dir: Path
    log_path: Path
    ca_file: Path | None = None  # when the server runs on certificates given by flags
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.ca_file or self.cert_dir / "ca.pem"

    def client(self) -> httpx.Client:
        """An HTTP/1.1 keep-alive client that trusts only the server's own CA."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        c = httpx.Client(base_url=self.base_url, verify=ctx, timeout=10.0)
        self.clients.append(c)
        return c

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(tmp: Path, *extra: str, ca: Path | None = None) -> Server:
    """Start ``gpu-webhook serve`` and return once /healthz answers over verified TLS
    (trusting ``ca``, or the CA of the dev certificates the server generates)."""
    port = free_port()
    cert_dir = tmp / "certs"
    proc = serve(port, cert_dir, tmp / "server.log", *extra, cwd=tmp)
    server = Server(proc, port, cert_dir, tmp / "server.log", ca)

    healthy_or_stopped(proc, server.base_url, server.ca, server.log,
                       lambda: stop_server(server), START_TIMEOUT)
    return server


def stop_server(server: Server) -> int:
    """SIGTERM, as the kubelet sends; returns the exit code."""
    return stop_serving(server.process, server.clients, STOP_TIMEOUT)


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
