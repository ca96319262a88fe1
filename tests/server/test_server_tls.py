"""TLS as the API server meets it: a server run on certificates from ``gpu-webhook certs``
verifies against the caBundle that command printed, and ``--tls-min-version`` holds."""

from __future__ import annotations

import base64
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from kit import console_script
from serverkit import ServerFactory, pod, review


def test_served_certificate_verifies_with_the_printed_ca_bundle(
        tmp_path: Path, serve: ServerFactory) -> None:
    done = subprocess.run([console_script(), "certs", "--out", str(tmp_path / "issued"),
                           "--ip", "127.0.0.1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    server = serve("--tls-cert", str(tmp_path / "issued" / "tls.crt"),
                   "--tls-key", str(tmp_path / "issued" / "tls.key"),
                   ca=tmp_path / "issued" / "ca.pem")
    ctx = ssl.create_default_context(
        cadata=base64.b64decode(done.stdout.strip()).decode("ascii"))
    r = httpx.post(server.base_url + "/mutate", json=review(pod()), verify=ctx, timeout=10)
    assert r.status_code == 200
    assert r.json()["response"]["allowed"] is True


def test_another_ca_is_not_trusted(tmp_path: Path, serve: ServerFactory) -> None:
    server = serve()
    other = subprocess.run([console_script(), "certs", "--out", str(tmp_path / "other")],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 0
    ctx = ssl.create_default_context(cafile=str(tmp_path / "other" / "ca.pem"))
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(server.base_url + "/healthz", verify=ctx, timeout=10)


@pytest.mark.parametrize(("minimum", "client_max", "works"), [
    ("1.2", ssl.TLSVersion.TLSv1_2, True),
    ("1.3", ssl.TLSVersion.TLSv1_2, False),
    ("1.3", ssl.TLSVersion.TLSv1_3, True),
])
def test_tls_min_version(serve: ServerFactory, minimum: str, client_max: ssl.TLSVersion,
                         works: bool) -> None:
    server = serve("--tls-min-version", minimum)
    ctx = ssl.create_default_context(cafile=str(server.ca))
    ctx.maximum_version = client_max
    if works:
        assert httpx.get(server.base_url + "/healthz", verify=ctx, timeout=10).status_code == 200
    else:
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.base_url + "/healthz", verify=ctx, timeout=10)
