"""Run the webhook under uvicorn with TLS: the `gpu-webhook serve` command's body.

TLS is configured here rather than through uvicorn's flags so that the minimum version,
client-certificate verification and certificate reloads are under our control: uvicorn
builds one SSLContext at start, and ``load_cert_chain`` on that same context swaps the
certificate for new handshakes without touching connections already open.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

import uvicorn
import uvloop

from webhook import certs, logs
from webhook.policy.load import PolicyError
from webhook.policy.source import PolicySource, resolve
from webhook.quota.store import MemoryStore
from webhook.server import AdmissionApp, Runtime
from webhook.settings import Settings

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
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = (ssl.TLSVersion.TLSv1_3 if settings.tls_min_version == "1.3"
                           else ssl.TLSVersion.TLSv1_2)
    # Forward-secret AEAD suites only for TLS 1.2 (TLS 1.3 suites are all strong).
    ctx.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20")
    ctx.load_cert_chain(cert, key)
    if settings.client_ca:
        ctx.load_verify_locations(settings.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class _Config(uvicorn.Config):
    """uvicorn's Config with our SSLContext in place of the one it would build."""

    def __init__(self, app: AdmissionApp, context: ssl.SSLContext, **kw: object) -> None:
        super().__init__(app, **kw)  # type: ignore[arg-type]
        self._context = context

    def load(self) -> None:
        super().load()
        self.ssl = self._context


def run(settings: Settings) -> int:
    logs.setup(settings.log_level)
    source = PolicySource(resolve(settings.policy))
    try:
        active = source.load()
    except PolicyError as exc:
        logs.event("cannot start: the policy is invalid", logging.ERROR, error=str(exc))
        print(f"gpu-webhook: cannot start, the policy is invalid:\n{exc}")
        return 2
    try:
        cert, key = tls_files(settings)
        context = ssl_context(settings, cert, key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        msg = (f"cannot start: TLS files unusable ({exc}); check --tls-cert/--tls-key or "
               "--cert-dir, or regenerate them with `gpu-webhook certs --force`")
        logs.event(msg, logging.ERROR)
        print(f"gpu-webhook: {msg}")
        return 2
    runtime = Runtime(policy=source,
                      store=MemoryStore(ttl=active.policy.reservation_ttl))
    logs.event("starting", host=settings.host, port=settings.port,
               policy=active.policy.name, policy_source=active.source,
               tls_min=settings.tls_min_version, mtls=bool(settings.client_ca),
               usage_store="in-memory (no cluster configured)", pid=os.getpid())
    app = AdmissionApp(runtime)
    config = _Config(
        app, context, host=settings.host, port=settings.port, loop="uvloop", http="httptools",
        lifespan="off", access_log=False, log_config=None, timeout_keep_alive=30,
        timeout_graceful_shutdown=20,
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        watcher = asyncio.ensure_future(source.watch(settings.policy_poll_seconds))
        try:
            await server.serve()
        finally:
            watcher.cancel()

    uvloop.run(main())
    return 0
