"""What a TLS client sees of ``gpu-webhook serve``: the handshake with the CA succeeds,
old protocol versions are refused, ``--tls-min-version 1.3`` refuses TLS 1.2, and a
server refuses to start on TLS files it cannot use."""

from __future__ import annotations

import socket
import ssl
import subprocess

import pytest
from kit import console_script, free_port
from tlskit import REVIEW, client_context, connect, request, serial_of_pem

from webhook.libs import certs


def test_client_trusting_the_ca_completes_a_handshake_and_a_review(serve, ca, volume):
    server = serve()
    ctx = client_context(ca.path)
    health = request(server, ctx)
    assert health.status == 200 and health.body == {"status": "ok"}
    assert health.version == "TLSv1.3"
    assert health.serial == serial_of_pem((volume.root / "tls.crt").read_bytes())
    review = request(server, ctx, "POST", "/validate", REVIEW)
    assert review.status == 200 and review.body["response"]["allowed"] is True


def test_client_trusting_another_ca_refuses_the_server(serve, tmp_path):
    from tlskit import new_ca

    server = serve()
    other = new_ca(tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError):
        connect(server, client_context(other.path)).close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # ssl.TLSVersion.TLSv1/1_1
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
def test_tls_1_0_and_1_1_are_refused(serve, version):
    server = serve()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    # Security level 0 lets this client's OpenSSL actually offer the old protocols, so
    # that a refusal is the server's.
    ctx.set_ciphers("ALL:@SECLEVEL=0")
    ctx.minimum_version = ssl.TLSVersion.TLSv1
    ctx.maximum_version = version
    with pytest.raises(ssl.SSLError) as err:
        connect(server, ctx).close()
    if err.value.reason == "NO_PROTOCOLS_AVAILABLE":
        pytest.skip("this OpenSSL cannot offer TLS 1.0/1.1 even at security level 0")


def test_tls_1_2_is_accepted_by_default(serve, ca):
    server = serve()
    answer = request(server, client_context(ca.path, max_version=ssl.TLSVersion.TLSv1_2))
    assert answer.status == 200 and answer.version == "TLSv1.2"


def test_min_version_1_3_refuses_a_tls_1_2_client(serve, ca):
    server = serve("--tls-min-version", "1.3")
    with pytest.raises(ssl.SSLError):
        connect(server, client_context(ca.path, max_version=ssl.TLSVersion.TLSv1_2)).close()
    assert request(server, client_context(ca.path)).version == "TLSv1.3"


def _serve_fails(tmp_path, *flags: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([console_script(), "serve", "--host", "127.0.0.1", "--port",
                           str(free_port()), *flags], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot start: TLS files unusable" in done.stdout
    return done


def test_startup_refuses_a_missing_certificate_file(tmp_path):
    done = _serve_fails(tmp_path, "--tls-cert", "missing.crt", "--tls-key", "missing.key")
    assert "missing.crt" in done.stdout


def test_startup_refuses_half_a_pair_in_the_cert_dir(tmp_path, ca):
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "tls.crt").write_bytes(ca.serving().cert_pem)
    done = _serve_fails(tmp_path, "--cert-dir", "certs")
    assert "tls.key" in done.stdout


def test_startup_refuses_a_corrupt_certificate(tmp_path, ca):
    (tmp_path / "tls.crt").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n")
    (tmp_path / "tls.key").write_bytes(ca.serving().key_pem)
    done = _serve_fails(tmp_path, "--tls-cert", "tls.crt", "--tls-key", "tls.key")
    assert "tls.crt holds no PEM certificate" in done.stdout


def test_startup_refuses_a_key_of_another_certificate(tmp_path, ca):
    (tmp_path / "tls.crt").write_bytes(ca.serving().cert_pem)
    (tmp_path / "tls.key").write_bytes(ca.serving().key_pem)
    done = _serve_fails(tmp_path, "--tls-cert", "tls.crt", "--tls-key", "tls.key")
    assert "tls.key is not the private key of the certificate in tls.crt" in done.stdout


def test_plain_http_gets_no_answer(serve):
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert b"200" not in s.recv(1024)


def test_certs_module_is_the_one_that_imports_cryptography():
    import pathlib

    import webhook

    root = pathlib.Path(webhook.__file__).parent
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if "import cryptography" in p.read_text() or "from cryptography" in
                   p.read_text())
    assert users == [str(pathlib.Path(certs.__file__).relative_to(root))]
