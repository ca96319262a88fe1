"""Certificate rotation without a restart: the serving pair is replaced the way the
kubelet updates a mounted Secret (an atomic ``..data`` symlink swap), while a client keeps
sending reviews on new connections."""

from __future__ import annotations

import threading
import time

from tlskit import REVIEW, SecretVolume, client_context, connect, request, serial_of_pem

from webhook.libs import certs


class Caller(threading.Thread):
    """Sends reviews, each on a new connection, until stopped; records every outcome."""

    def __init__(self, server, ctx) -> None:
        super().__init__(daemon=True)
        self.server, self.ctx = server, ctx
        self.serials: list[int] = []
        self.failures: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                answer = request(self.server, self.ctx, "POST", "/validate", REVIEW)
                if answer.status != 200 or answer.body["response"]["allowed"] is not True:
                    self.failures.append(f"HTTP {answer.status}: {answer.body}")
                self.serials.append(answer.serial)
            except Exception as exc:
                self.failures.append(repr(exc))

    def wait_for(self, serial: int, seconds: float = 20) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if serial in self.serials[-5:]:
                return True
            time.sleep(0.05)
        return False


def test_rotation_under_load_fails_no_request(serve, ca, volume: SecretVolume):
    server = serve()
    ctx = client_context(ca.path)
    old = serial_of_pem((volume.root / "tls.crt").read_bytes())
    kept_open = connect(server, ctx)
    assert request(server, ctx, conn=kept_open).serial == old

    caller = Caller(server, ctx)
    caller.start()
    try:
        assert caller.wait_for(old)
        renewed = ca.serving()
        volume.put_pair(renewed)
        assert caller.wait_for(serial_of_pem(renewed.cert_pem)), caller.serials[-5:]
        count = len(caller.serials)
        while len(caller.serials) < count + 20:  # a few more on the new certificate
            time.sleep(0.02)
    finally:
        caller.done.set()
        caller.join(timeout=30)
    assert caller.failures == []
    # New handshakes got the new certificate; the connection opened before is untouched.
    assert caller.serials[-1] == serial_of_pem(renewed.cert_pem)
    still = request(server, ctx, conn=kept_open)
    assert still.status == 200 and still.serial == old
    kept_open.close()
    assert "TLS certificate reloaded" in server.log_text()


def test_a_bad_pair_keeps_the_old_certificate_serving(serve, ca, volume: SecretVolume):
    server = serve()
    ctx = client_context(ca.path)
    old = serial_of_pem((volume.root / "tls.crt").read_bytes())
    caller = Caller(server, ctx)
    caller.start()
    try:
        assert caller.wait_for(old)
        other = ca.serving()
        # Half-way through a rotation: the new certificate with the old key ...
        volume.put({certs.CERT_FILE: other.cert_pem,
                    certs.KEY_FILE: (volume.root / "tls.key").read_bytes()})
        _wait_for_log(server, "TLS certificate reload failed", 1)
        # ... then a corrupt certificate ...
        volume.put({certs.CERT_FILE: b"garbage", certs.KEY_FILE: other.key_pem})
        _wait_for_log(server, "TLS certificate reload failed", 2)
        before = len(caller.serials)
        while len(caller.serials) < before + 10:
            time.sleep(0.02)
        assert set(caller.serials) == {old}
        # ... and once the pair is whole, it serves.
        volume.put_pair(other)
        assert caller.wait_for(serial_of_pem(other.cert_pem))
    finally:
        caller.done.set()
        caller.join(timeout=30)
    assert caller.failures == []
    log = server.log_text()
    assert "is not the private key of the certificate" in log
    assert "holds no PEM certificate" in log


def _wait_for_log(server, text: str, count: int, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while server.log_text().count(text) < count:
        assert time.monotonic() < deadline, f"{text!r} not logged {count}x:\n{server.log_text()}"
        time.sleep(0.05)
