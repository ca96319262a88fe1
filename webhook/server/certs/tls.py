"""The webhook's TLS: the serving certificate (files, or development certificates made on
first start), the SSLContext, reloading a renewed certificate into it, and the gate on
client certificates.

TLS is configured here rather than through uvicorn's flags so that the minimum version,
client-certificate verification and certificate reloads are under our control: one
SSLContext is made at start, and ``load_cert_chain`` on that same context swaps the
certificate for new handshakes without touching connections already open.

Client certificates (``--client-ca``, ``--client-cn``): the handshake asks for a client
certificate and verifies any that is offered against the CA (a bad one ends the
handshake). It does not *require* one, because the kubelet's HTTPS probes of
``/healthz`` and ``/readyz`` never present a certificate; instead every other path
answers 403 to a caller without a verified certificate, or whose certificate's common
name is not in ``--client-cn`` (:class:`ClientCertGate`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from webhook.libs import certs, logs
from webhook.server.settings import Settings
from webhook.server.web.asgi import Receive, Scope, Send

DEV_NAMES = ["localhost", *certs.service_names("gpu-webhook", "gpu-webhook")]


def tls_files(settings: Settings) -> tuple[str, str]:
    """The certificate and key to serve; generates dev certificates when none exist."""
    if settings.tls_cert and settings.tls_key:
        return settings.tls_cert, settings.tls_key
    d = Path(settings.cert_dir)
    cert, key = d / certs.CERT_FILE, d / certs.KEY_FILE
    if not cert.exists() and not key.exists():
        issued = certs.issue(DEV_NAMES, ["127.0.0.1", "::1"], days=30)
        certs.write(issued, d)
        logs.event("generated development TLS certificates", cert_dir=str(d),
                   names=DEV_NAMES, expires=issued.not_after.isoformat(),
                   hint="use `gpu-webhook certs` or cert-manager for a cluster")
    return str(cert), str(key)


def ssl_context(settings: Settings, cert: str, key: str) -> ssl.SSLContext:
    """The server's SSLContext, with the pair checked first so a bad file gets a clear error."""
    certs.check_pair(_read(cert), _read(key), cert_name=cert, key_name=key)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = (ssl.TLSVersion.TLSv1_3 if settings.tls_min_version == "1.3"
                           else ssl.TLSVersion.TLSv1_2)
    # Forward-secret AEAD suites only for TLS 1.2 (TLS 1.3 suites are all strong).
    ctx.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20")
    ctx.load_cert_chain(cert, key)
    if settings.client_ca:
        ctx.load_verify_locations(settings.client_ca)
        # OPTIONAL, not REQUIRED: see the module docstring (kubelet probes carry no
        # certificate); ClientCertGate refuses the admission paths without one.
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


Stamp = tuple[int, int, int, int] | None


class CertReloader:
    """Reloads the serving certificate into the live SSLContext when its files change.

    Files are watched by the identity of what their paths resolve to (device, inode,
    size, mtime), as for the policy: a Secret volume updates by swapping a symlink, and
    cert-manager or an operator may replace files by rename. A pair that does not load
    (missing, corrupt, a key that belongs to another certificate, caught half-way
    through a rotation) is logged and the old certificate keeps serving; the next change
    of either file is tried again.
    """

    def __init__(self, context: ssl.SSLContext, cert: str, key: str) -> None:
        self.context, self.cert, self.key = context, cert, key
        self._stamp = self._stat()
        self.serving = certs.check_pair(_read(cert), _read(key), cert_name=cert, key_name=key)
        self.last_error: str | None = None

    def _stat(self) -> tuple[Stamp, Stamp]:
        def one(path: str) -> Stamp:
            try:
                st = os.stat(path)  # follows symlinks: the Secret's ..data swap
            except OSError:
                return None
            return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

        return one(self.cert), one(self.key)

    def reload_if_changed(self) -> bool:
        """Load the pair if either file changed; True when a new certificate is serving."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            cert_pem, key_pem = _read(self.cert), _read(self.key)
            pair = certs.check_pair(cert_pem, key_pem, cert_name=self.cert, key_name=self.key)
            self._load(cert_pem, key_pem)
        except (OSError, ValueError, ssl.SSLError) as exc:
            self.last_error = str(exc)
            logs.event("TLS certificate reload failed; the previous certificate keeps serving",
                       logging.ERROR, error=str(exc), cert=self.cert, key=self.key,
                       serving_serial=f"{self.serving.serial:x}")
            return False
        self.serving, self.last_error = pair, None
        logs.event("TLS certificate reloaded", serial=f"{pair.serial:x}", names=pair.names,
                   not_after=pair.not_after.isoformat())
        if pair.expired():
            logs.event("the new TLS certificate has expired; callers will refuse it",
                       logging.ERROR, not_after=pair.not_after.isoformat())
        return True

    def _load(self, cert_pem: bytes, key_pem: bytes) -> None:
        # OpenSSL reads files, and the watched files may change again under it: load the
        # exact bytes checked above from private copies, into a scratch context first, so
        # that what reaches the live context is known to load whole.
        with tempfile.TemporaryDirectory(prefix="gpu-webhook-tls-") as d:
            cert_copy, key_copy = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
            for path, data in ((cert_copy, cert_pem), (key_copy, key_pem)):
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                    f.write(data)
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_copy, key_copy)
            self.context.load_cert_chain(cert_copy, key_copy)

    async def watch(self, interval: float = 2.0) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                self.reload_if_changed()
            except Exception:  # a watcher must never die: the next tick tries again
                logging.getLogger("gpu_webhook").exception("certificate watch failed")


PROBE_PATHS = frozenset({"/healthz", "/readyz"})


class ClientCertGate:
    """Refuses, with 403, callers without a verified client certificate or with a common
    name outside the allow-list. The handshake has already verified any certificate
    offered, so a certificate here is one the client CA signed."""

    def __init__(self, app: Any, allowed_cns: Sequence[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed_cns)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        tls = scope.get("extensions", {}).get("tls")
        cns: tuple[str, ...] = tls.get("gpu_webhook.client_cns", ()) if tls else ()
        if not tls or not tls.get("client_cert_chain"):
            reason = "a client certificate signed by the --client-ca is required"
        elif self.allowed and not self.allowed.intersection(cns):
            reason = (f"client certificate CN {', '.join(cns) or '(none)'} is not allowed; "
                      f"allowed: {', '.join(sorted(self.allowed))}")
        else:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        logs.event("caller refused", logging.WARNING, path=scope["path"], reason=reason,
                   client=f"{client[0]}:{client[1]}" if client else "")
        body = orjson.dumps({"error": reason})
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
