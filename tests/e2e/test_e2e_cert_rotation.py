"""Rotating the webhook's serving certificate while pods keep being created.

The new certificate comes from the same CA (``gpu-webhook certs --force --ca --ca-key``)
and replaces tls.crt and tls.key by rename, as a Secret update or cert-manager does; the
running server picks it up without a restart. No admission may fail meanwhile, and
every pod must still have gone through the webhook. The API server keeps its
connections to a webhook open, so the proxy in front of the replica drops them after the
rotation: the pods created next come over new connections, verified against the new
certificate.
"""

from __future__ import annotations

import os
import ssl
import threading
from pathlib import Path

import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import (
    MUTATED_ANNOTATION,
    Deployment,
    NamespaceFactory,
    gpu_pod,
    gpu_webhook,
    to_yaml,
    wait_until,
)

pytestmark = pytest.mark.e2e

E2E_PROXY = True  # read by the `webhook` fixture


def served_certificate(port: int) -> bytes:
    """The DER certificate a TLS client gets from the server now."""
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", port)))


def test_certificate_rotation_under_load_fails_no_admission(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
    tmp_path: Path,
) -> None:
    ns = namespace("ops")
    port = webhook.replicas[0].port
    old = served_certificate(port)
    results: list[tuple[str, int, str]] = []
    stop = threading.Event()
    between_creates = threading.Lock()

    def create_pods() -> None:
        i = 0
        while not stop.is_set():
            name = f"rot-{i:03d}"
            with between_creates:
                out = control_plane.kubectl("create", "-n", ns, "-f", "-",
                                            input=to_yaml(gpu_pod(name, limits="1")),
                                            check=False)
            results.append((name, out.returncode, out.stderr))
            i += 1

    creator = threading.Thread(target=create_pods, name="create-pods")
    creator.start()
    try:
        wait_until("pods to be created before the rotation", lambda: len(results) >= 3)

        new_dir = tmp_path / "new-certs"
        gpu_webhook("certs", "--force", "--ca", str(webhook.cert_dir / "ca.pem"),
                    "--ca-key", str(webhook.cert_dir / "ca-key.pem"), "--out", str(new_dir),
                    "--dns", "localhost", "--ip", "127.0.0.1")
        new = ssl.PEM_cert_to_DER_cert((new_dir / "tls.crt").read_text())
        assert new != old
        for name in ("tls.crt", "tls.key"):
            os.replace(new_dir / name, webhook.cert_dir / name)

        wait_until("the new certificate to be served", lambda: served_certificate(port) == new,
                   timeout=15)
        assert webhook.proxy is not None
        with between_creates:  # idle connections only: a request cut mid-way is no test
            webhook.proxy.drop_connections()
        connections = webhook.proxy.connections.total()
        rotated_at = len(results)
        wait_until("pods to be created after the rotation",
                   lambda: len(results) >= rotated_at + 5)
    finally:
        stop.set()
        creator.join(timeout=60)

    assert webhook.proxy.connections.total() > connections  # new handshakes happened
    failed = [r for r in results if r[1] != 0]
    assert not failed, failed[:3]
    pods = yaml.safe_load(control_plane.kubectl("get", "pods", "-n", ns, "-o", "yaml").stdout)
    assert len(pods["items"]) == len(results)
    assert all(MUTATED_ANNOTATION in (p["metadata"].get("annotations") or {})
               for p in pods["items"])
