"""Run the webhook under uvicorn with TLS: the `gpu-webhook serve` command's body.

TLS is configured here rather than through uvicorn's flags so that the minimum version,
client-certificate verification and certificate reloads are under our control: uvicorn
builds one SSLContext at start, and ``load_cert_chain`` on that same context swaps the
certificate for new handshakes without touching connections already open.

Client certificates (``--client-ca``, ``--client-cn``): the handshake asks for a client
certificate and verifies any that is offered against the CA (a bad one ends the
handshake). It does not *require* one, because the kubelet's HTTPS probes of
``/healthz`` and ``/readyz`` never present a certificate; instead every other path
answers 403 to a caller without a verified certificate, or whose certificate's common
name is not in ``--client-cn``. uvicorn 0.54 does not put TLS details in the ASGI scope,
so a small subclass of its httptools protocol reads the peer certificate once per
connection (after the handshake) and adds it as the ASGI ``tls`` extension.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from webhook.engine.target import no_labels
from webhook.libs import certs, logs
from webhook.libs.kube import Unreachable
from webhook.policy.load import PolicyError
from webhook.quota.store import MemoryStore
from webhook.server import metrics, selfcerts
from webhook.server.app import ARRIVED, AdmissionApp, Receive, Runtime, Scope, Send
from webhook.server.cluster import attach, configured, ledger_namespace
from webhook.server.reload import PolicySource, resolve
from webhook.server.settings import Settings

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


def self_managed(settings: Settings) -> selfcerts.SelfManagedCerts | None:
    """--self-managed-certs: get a serving pair from the Secret (issued if need be) into
    the files :func:`tls_files` names, before serving; None when there is no cluster.

    The renewals that follow write the same files, and :class:`CertReloader` loads them
    as it would a mounted Secret's update: one path for every way a certificate changes.
    """
    d = Path(settings.cert_dir)
    cert = settings.tls_cert or str(d / certs.CERT_FILE)
    key = settings.tls_key or str(d / certs.KEY_FILE)
    namespace = ledger_namespace(settings.namespace)
    try:
        renewer = selfcerts.connect(
            settings.kubeconfig, namespace, settings.cert_secret, settings.service,
            settings.certificate_targets(), settings.cert_host_list(),
            settings.cert_validity_hours, settings.ca_validity_hours, cert, key)
    except Unreachable as exc:
        logs.event("cannot start: --self-managed-certs needs the cluster", logging.ERROR,
                   error=str(exc))
        print(f"gpu-webhook: cannot start, --self-managed-certs needs the cluster: {exc}")
        return None
    logs.event("self-managed certificates", secret=f"{namespace}/{settings.cert_secret}",
               names=[*renewer.wanted.dns_names, *renewer.wanted.ip_addresses],
               configurations=settings.certificate_targets(),
               validity_hours=settings.cert_validity_hours,
               ca_validity_hours=settings.ca_validity_hours)
    renewer.first_sync()
    return renewer


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


class AdmissionProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus:

    - the ASGI ``tls`` extension in every scope. The peer certificate is read once, when
      the connection is made (after the handshake), so the per-request cost is one dict
      assignment;
    - the arrival time of each request's first byte in its scope (the deadline's start);
    - each response written in one piece (:class:`OneWriteTransport`).
    """

    _tls: dict[str, Any] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None:
            return
        der = ssl_object.getpeercert(binary_form=True)
        self._tls = {
            "server_cert": None,
            "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
            "client_cert_name": certs.subject(der) if der else None,
            "client_cert_error": None,
            # Not in the ASGI spec: the common names, parsed once for ClientCertGate.
            "gpu_webhook.client_cns": certs.common_names(der) if der else (),
        }

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and self.transport is not None:
            cycle.transport = OneWriteTransport(self.transport, cycle)  # type: ignore[assignment]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # The request's first byte: its deadline counts from here, so time spent queued
        # behind other requests on a busy event loop counts against it.
        self.scope[ARRIVED] = time.monotonic()  # type: ignore[literal-required]
        if self._tls is not None:
            self.scope["extensions"] = {"tls": self._tls}  # type: ignore[dict-item]


class OneWriteTransport:
    """The connection as one request's response cycle sees it: the status line and
    headers of a response with a Content-Length are held back and written together
    with its body.

    uvicorn writes the header block and the body in two ``write`` calls; over TLS each
    becomes its own record, encrypted and sent by its own system call, and the peer is
    woken twice. An admission reply is a few hundred bytes, so that second record and
    send were about a sixth of the server's CPU per review. Held bytes are written
    with the next write, at the end of the response (a HEAD reply has no body write),
    or before the connection closes; an interim ``100 Continue`` (written before the
    response starts) and chunked bodies pass straight through.
    """

    __slots__ = ("_armed", "_cycle", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport,
                 cycle: RequestResponseCycle) -> None:
        self._transport, self._cycle = transport, cycle
        self._held: bytes | None = None
        self._armed = True  # the next write after the response starts is its header block
        on_response = cycle.on_response

        def finished() -> None:
            self._release()
            on_response()

        cycle.on_response = finished

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
            return
        cycle = self._cycle
        if self._armed and cycle.response_started:
            self._armed = False
            if cycle.chunked_encoding is False and not cycle.response_complete:
                self._held = data
                return
        self._transport.write(data)

    def _release(self) -> None:
        held, self._held = self._held, None
        if held:
            self._transport.write(held)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, ...
        return getattr(self._transport, name)


# Paths a caller without a client certificate may use: the kubelet's probes.
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


class _Config(uvicorn.Config):
    """uvicorn's Config with our SSLContext in place of the one it would build."""

    def __init__(self, app: Any, context: ssl.SSLContext, **kw: Any) -> None:
        super().__init__(app, **kw)
        self._context = context

    def load(self) -> None:
        super().load()
        self.ssl = self._context


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def run(settings: Settings) -> int:
    logs.setup(settings.log_level)
    source = PolicySource(resolve(settings.policy))
    try:
        active = source.load()
    except PolicyError as exc:
        logs.event("cannot start: the policy is invalid", logging.ERROR, error=str(exc))
        print(f"gpu-webhook: cannot start, the policy is invalid:\n{exc}")
        return 2
    renewer = None
    if settings.self_managed_certs:
        renewer = self_managed(settings)
        if renewer is None:
            return 2
    try:
        cert, key = tls_files(settings)
        context = ssl_context(settings, cert, key)
        reloader = CertReloader(context, cert, key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        msg = (f"cannot start: TLS files unusable ({exc}); check --tls-cert/--tls-key or "
               "--cert-dir (and --client-ca), or regenerate them with "
               "`gpu-webhook certs --force`")
        logs.event(msg, logging.ERROR)
        print(f"gpu-webhook: {msg}")
        return 2
    if reloader.serving.expired():
        logs.event("the TLS certificate has expired; the API server will refuse it until it "
                   "is renewed (the new files are picked up without a restart)",
                   logging.ERROR, not_after=reloader.serving.not_after.isoformat())
    # Read at scrape time, so it follows certificate reloads.
    metrics.CERT_EXPIRY.set_function(lambda: reloader.serving.not_after.timestamp())
    client_cns = settings.client_cn_list()
    logs.event("starting", host=settings.host, port=settings.port,
               policy=active.policy.name, policy_source=active.source,
               tls_min=settings.tls_min_version, mtls=bool(settings.client_ca),
               client_cns=client_cns, cert_serial=f"{reloader.serving.serial:x}",
               cert_names=reloader.serving.names,
               cert_not_after=reloader.serving.not_after.isoformat(),
               usage_store="cluster ledger" if configured(settings.kubeconfig)
               else "in-memory (no cluster configured)", pid=os.getpid())

    async def main() -> None:
        # The cluster first, then the app built on it once: nothing is swapped into a
        # running server.
        cluster = None
        ready: dict[str, Callable[[], bool]] = {}
        if configured(settings.kubeconfig):
            try:
                cluster = attach(source, settings.kubeconfig, settings.namespace,
                                 asyncio.get_running_loop())
                ready["caches-synced"] = cluster.state.synced
            except Unreachable as exc:
                logs.event("cannot use the cluster; not ready until it can", logging.ERROR,
                           error=str(exc))
                ready["cluster"] = lambda: False
        runtime = Runtime(
            policy=source,
            namespace_labels=cluster.state.namespace_labels if cluster else no_labels,
            # read at each scrape: a relist replaces the dict
            namespaces=(lambda: cluster.state.labels) if cluster else metrics.no_namespaces,
            store=cluster.store if cluster else MemoryStore(ttl=active.policy.reservation_ttl),
            read_workload=cluster.read_workload if cluster else None,
            ready_checks=ready,
            max_inflight=settings.max_inflight,
            request_timeout=settings.request_timeout)
        app: Any = AdmissionApp(runtime)
        if settings.client_ca:
            app = ClientCertGate(app, client_cns)
        config = _Config(
            app, context, host=settings.host, port=settings.port, loop="uvloop",
            http=AdmissionProtocol, lifespan="off", access_log=False, log_config=None,
            timeout_keep_alive=30, timeout_graceful_shutdown=20,
        )
        server = uvicorn.Server(config)
        watchers = [asyncio.ensure_future(source.watch(settings.policy_poll_seconds)),
                    asyncio.ensure_future(reloader.watch(settings.cert_poll_seconds))]
        if renewer is not None:
            watchers.append(asyncio.ensure_future(
                renewer.keep_renewed(settings.cert_check_seconds)))
        try:
            await server.serve()
        finally:
            for w in watchers:
                w.cancel()
            if cluster is not None:
                cluster.stop()
            # uvicorn re-raises SIGTERM after its shutdown, which skips atexit: write the
            # buffered log lines now.
            logs.flush()

    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal so that the
    # default action ends the process "killed by SIGTERM" (143). A drained, orderly stop
    # is a success: this handler turns the re-raised signal (or one that arrives before
    # uvicorn listens) into exit status 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvloop.run(main())
    return 0
