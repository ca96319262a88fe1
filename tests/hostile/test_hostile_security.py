"""Security properties seen from outside: only forward-secret AEAD suites are offered
under TLS 1.2 (the 1.2 floor itself is tested in tests/tls); object contents (a
secret-looking env value) reach no response but the JSON Patch and no info-level log.
"""

from __future__ import annotations

import base64
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from cases import gpu_pod, review
from hostilekit import start
from kit import Server, stop_server

from webhook.libs import certs

SECRET = "hunter2-sk-live-0123456789abcdef"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start(tmp_path_factory.mktemp("security"), "--log-level", "info")
    yield s
    stop_server(s)


def _handshake(server: Server, ctx: ssl.SSLContext) -> tuple[str | None, str | None]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as conn:
        cipher = conn.cipher()
        return conn.version(), cipher[0] if cipher else None


def _tls12(server: Server, ciphers: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(server.ca))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(ciphers)
    return ctx


@pytest.mark.parametrize("ciphers", [
    "AES128-SHA:AES256-SHA",  # RSA key exchange, CBC: no forward secrecy
    "ECDHE-RSA-AES128-SHA:ECDHE-RSA-AES256-SHA",  # CBC with SHA-1 MAC
    "AES128-GCM-SHA256:AES256-GCM-SHA384",  # AEAD but static RSA key exchange
    "DHE-RSA-AES128-SHA",
], ids=["rsa-cbc", "ecdhe-cbc", "rsa-gcm", "dhe-cbc"])
def test_weak_tls_1_2_suites_are_refused(server: Server, ciphers: str) -> None:
    ctx = _tls12(server, ciphers)  # a client that cannot offer them fails the test
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _handshake(server, ctx)


def test_the_server_enables_only_forward_secret_aead_suites(tmp_path: Path) -> None:
    # RC4 and 3DES cannot be offered by this machine's OpenSSL, so no handshake can
    # show the server refusing them; the server's own context shows it enables none
    # of them, nor any other suite without ECDHE and an AEAD cipher.
    from webhook.server.certs.tls import ssl_context
    from webhook.server.settings import Settings

    issued = certs.issue(["localhost"], ["127.0.0.1"], days=1)
    written = certs.write(issued, str(tmp_path))
    cert = next(p for p in written if str(p).endswith(certs.CERT_FILE))
    key = next(p for p in written if str(p).endswith(certs.KEY_FILE))
    ctx = ssl_context(Settings(), str(cert), str(key))
    tls12 = [c for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12, "no TLS 1.2 suite enabled"
    for c in tls12:
        assert c["kea"] == "kx-ecdhe" and c["aead"], c["name"]
        assert not any(weak in c["name"] for weak in ("RC4", "DES", "CBC", "SHA1")), c


def test_strong_tls_1_2_and_1_3_are_accepted(server: Server) -> None:
    version, cipher = _handshake(server, _tls12(server, "ECDHE+AESGCM"))
    assert version == "TLSv1.2" and cipher and "GCM" in cipher
    version, _ = _handshake(server, ssl.create_default_context(cafile=str(server.ca)))
    assert version == "TLSv1.3"


def _secret_pod(gpus: object) -> bytes:
    pod = gpu_pod(gpus)
    pod["spec"]["containers"][0]["env"] = [{"name": "API_KEY", "value": SECRET}]
    pod["metadata"]["annotations"] = {"config": f"token={SECRET}"}
    return orjson.dumps(review(pod))


def test_object_contents_reach_no_body_but_the_patch_and_no_log(server: Server,
                                                                tmp_path: Path) -> None:
    c = server.client()
    for path in ("/mutate", "/validate"):
        for gpus in (2, "NaN", 100):  # allowed with a patch, malformed, over a cap
            r = c.post(path, content=_secret_pod(gpus))
            assert r.status_code == 200
            resp = r.json()["response"]
            patch = resp.pop("patch", "")
            assert SECRET not in orjson.dumps(resp).decode(), resp
            if patch:
                # The patch carries only the webhook's additions, not the object.
                assert SECRET not in base64.b64decode(patch).decode()
    # A review refused as malformed does not echo the object in its error (envelope
    # values such as a bad operation are echoed, shortened: they are not object contents).
    doc = orjson.loads(_secret_pod(2))
    doc["request"]["object"] = [doc["request"]["object"]]
    r = c.post("/validate", content=orjson.dumps(doc))
    assert r.status_code == 400 and SECRET not in r.text
    for path in ("/healthz", "/readyz", "/metrics"):
        assert SECRET not in c.get(path).text
    # Decision lines are buffered (flushed every 200 ms): wait until they are written.
    deadline = time.monotonic() + 10
    while '"msg":"decision"' not in (log := server.log()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert '"msg":"decision"' in log  # the decisions were logged, just not the object
    assert SECRET not in log
