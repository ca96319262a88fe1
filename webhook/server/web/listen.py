"""Listening: connections accepted and bounded before they cost anything, TLS started on
them, and requests read with deadlines (the protocol the server runs).

uvicorn would hand the listening socket's SSLContext to the event loop, which sets up TLS
state (~50 KB) for every TCP connection the moment it is accepted and waits 60 s for its
handshake, with no cap at all. Instead :class:`Acceptor` accepts each connection itself:
beyond ``--max-connections`` it is closed at once (no TLS state made); otherwise TLS
starts on it with a handshake deadline. After the handshake, a connection must deliver a
request's headers within ``HEADER_TIMEOUT`` (and in at most ``MAX_HEADER_BYTES``), and may
idle between requests for the keep-alive timeout: a caller that connects and says
nothing, or trickles headers, is closed. uvicorn 0.54 does not put TLS details in the
ASGI scope, so :class:`AdmissionProtocol` (its httptools protocol, subclassed) reads the
peer certificate once per connection and adds it as the ASGI ``tls`` extension.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import itertools
import logging
import socket
import ssl
import time
import weakref
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from webhook.libs import certs, logs
from webhook.server.web.app import ARRIVED

HANDSHAKE_TIMEOUT = 5.0  # s: a TLS handshake on a LAN takes milliseconds
HEADER_TIMEOUT = 10.0  # s: from connection (or the end of the last request) to headers
MAX_HEADER_BYTES = 64 * 1024  # an AdmissionReview's headers are a few hundred bytes
KEEP_ALIVE_TIMEOUT = 30  # s: the API server reuses connections to a webhook


class Connections:
    """The open connections (in TLS handshake or after), against a cap.

    At the cap, a new connection takes the place of the oldest one that has not yet
    delivered a request's headers (still in its handshake, or connected and silent):
    a flood of connections that say nothing cannot lock out the API server or the
    kubelet's probes, whose requests follow their handshake at once. Only when every
    connection has proven itself is a new one refused.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.refused = 0
        self.evicted = 0
        self.closed = 0
        self._unproven: dict[int, Callable[[], None]] = {}  # oldest first: token -> close
        self._tokens = itertools.count()

    def take(self) -> int | None:
        """A token for a new connection, or None: refused."""
        if self.open >= self.limit:
            if not self._unproven:
                self.refused += 1
                return None
            token = next(iter(self._unproven))
            self.evicted += 1
            self._unproven.pop(token)()  # its slot comes back when it has closed
        self.open += 1
        return next(self._tokens)

    def unproven(self, token: int, close: Callable[[], None]) -> None:
        """Until ``proven``, the connection may be closed to make room (oldest first);
        a later call for the same token keeps its place in the queue."""
        self._unproven[token] = close

    def proven(self, token: int) -> None:
        self._unproven.pop(token, None)

    def give_back(self, token: int) -> None:
        self._unproven.pop(token, None)
        self.open -= 1
        self.closed += 1


class AdmissionProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus:

    - the ASGI ``tls`` extension in every scope. The peer certificate is read once, when
      the connection is made (after the handshake), so the per-request cost is one dict
      assignment;
    - the arrival time of each request in its scope (the deadline's start): its first
      byte, and for a connection's first request that less the time from the accept to
      the end of the TLS handshake (the API server's clock ran through the handshake
      too, which a busy loop delays; but not through the time the connection then sat
      idle in its pool, as Go's client leaves a connection it dialed for a request
      another connection took first);
    - each response written in one piece (:class:`OneWriteTransport`).
    """

    _tls: dict[str, Any] | None = None
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0
    _in_headers = True  # bytes until the current request's headers are complete
    _requests = 0  # requests whose headers arrived on this connection
    # Set by Acceptor: the connection's place in the count, given back when it ends.
    slot: tuple[Connections, int] | None = None
    began = False  # connection_made was called (the TLS handshake succeeded)
    accepted: float | None = None  # when Acceptor accepted it (monotonic)
    handshake = 0.0  # seconds from the accept to the handshake's end, until used

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.began = True
        if self.accepted is not None:
            self.handshake = time.monotonic() - self.accepted
        super().connection_made(transport)
        if self.slot is not None:
            self.slot[0].unproven(self.slot[1], transport.abort)
        self._expect_headers()
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

    def _expect_headers(self, deadline: bool = True) -> None:
        self._in_headers, self._header_bytes = True, 0
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if deadline:
            self._header_timer = self.loop.call_later(HEADER_TIMEOUT, self._headers_too_slow)

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._in_headers and self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # nothing worth an answer has arrived

    def data_received(self, data: bytes) -> None:
        requests, in_headers = self._requests, self._in_headers
        super().data_received(data)
        # Counted after parsing, only for a chunk that began and ended inside one
        # request's headers: a chunk may end the headers and carry the body (and the
        # next request), or end a body.
        if (in_headers and self._in_headers and requests == self._requests
                and self.transport is not None):
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                     b"content-length: 0\r\nconnection: close\r\n\r\n")
                self.transport.close()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # Idle until the next request: uvicorn's keep-alive timeout applies. The next
        # request's first byte starts its own header deadline (on_message_begin).
        self._expect_headers(deadline=False)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)
        if self.slot is not None:
            self.slot[0].give_back(self.slot[1])
            self.slot = None

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._requests += 1
        if self.slot is not None:
            self.slot[0].proven(self.slot[1])
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and self.transport is not None:
            cycle.transport = OneWriteTransport(self.transport, cycle)  # type: ignore[assignment]

    def on_message_begin(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(HEADER_TIMEOUT, self._headers_too_slow)
        super().on_message_begin()
        # The request's first byte: its deadline counts from here, so time spent queued
        # behind other requests on a busy event loop counts against it; the first on a
        # connection also counts its handshake.
        handshake, self.handshake = self.handshake, 0.0
        self.scope[ARRIVED] = time.monotonic() - handshake  # type: ignore[literal-required]
        if self._tls is not None:
            self.scope["extensions"] = {"tls": self._tls}  # type: ignore[dict-item]


class Acceptor:
    """The listening socket, with connections counted against a cap before TLS starts.

    Each accepted socket over the cap is closed at once; the others get TLS through
    ``connect_accepted_socket`` with a handshake deadline, then :class:`AdmissionProtocol`.
    (uvicorn would hand the SSLContext to ``create_server``, whose loop makes TLS state
    for every connection it accepts and waits 60 s for its handshake, with no cap.)
    Duck-types the ``asyncio.Server`` methods uvicorn's shutdown calls.
    """

    def __init__(self, sock: socket.socket, make_protocol: Any, context: ssl.SSLContext,
                 connections: Connections) -> None:
        self.sock = sock
        self.make_protocol = make_protocol
        self.context = context
        self.connections = connections
        self.loop = asyncio.get_running_loop()
        self._closed = asyncio.Event()
        self._paused: asyncio.TimerHandle | None = None
        # Accepted, nothing received yet: token -> (socket, its deadline).
        self._silent: dict[int, tuple[socket.socket, asyncio.TimerHandle]] = {}
        self._accepted: dict[int, float] = {}  # token -> when accepted, until its handshake
        self.loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        # Everything waiting, in one callback: a flood of connects fills the kernel's
        # accept queue in milliseconds, and a probe's SYN dropped from a full queue is
        # only retried a second later.
        for _ in range(1024):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: pause, do not spin
                logs.event("accept failed", logging.WARNING, error=str(exc))
                self.loop.remove_reader(self.sock.fileno())
                self._paused = self.loop.call_later(
                    0.1, self.loop.add_reader, self.sock.fileno(), self._accept)
                return
            token = self.connections.take()
            if token is None:
                conn.close()  # every slot holds a working connection: refused
                continue
            conn.setblocking(False)
            # No TLS state until the client speaks: a connection that never sends its
            # ClientHello costs a socket and nothing more, and is closed after the
            # handshake deadline (or sooner, to make room).
            fd = conn.fileno()
            self._accepted[token] = time.monotonic()
            timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._drop, conn, token)
            self._silent[token] = (conn, timer)
            self.connections.unproven(token, functools.partial(self._drop, conn, token))
            self.loop.add_reader(fd, self._spoke, conn, token)

    def _drop(self, conn: socket.socket, token: int) -> None:
        """Close a connection that has not sent a byte yet (still ours, not the loop's)."""
        self._accepted.pop(token, None)
        if self._silent.pop(token, None) is None:
            return
        self.loop.remove_reader(conn.fileno())
        conn.close()
        self.connections.give_back(token)

    def _spoke(self, conn: socket.socket, token: int) -> None:
        silent = self._silent.pop(token, None)
        if silent is None:
            return
        silent[1].cancel()
        self.loop.remove_reader(conn.fileno())
        # Evicted during its handshake: shut the socket down (the handshake then
        # fails and the transport closes it; closing the fd here could close a
        # number the loop has already reused).
        self.connections.unproven(token, functools.partial(_shutdown, conn))
        self.loop.create_task(self._handshake(conn, token))

    async def _handshake(self, conn: socket.socket, token: int) -> None:
        protocol: list[AdmissionProtocol] = []
        accepted = self._accepted.pop(token, None)

        def made() -> AdmissionProtocol:
            p: AdmissionProtocol = self.make_protocol()
            p.slot = (self.connections, token)
            p.accepted = accepted
            protocol.append(p)
            return p

        try:
            await self.loop.connect_accepted_socket(
                made, conn, ssl=self.context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
                ssl_shutdown_timeout=HANDSHAKE_TIMEOUT)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, RuntimeError,
                asyncio.CancelledError):
            # A protocol whose connection never began never ends either: give back here.
            if not (protocol and protocol[0].began):
                self.connections.give_back(token)
                if protocol:
                    protocol[0].slot = None

    def close(self) -> None:
        for token, (conn, _) in list(self._silent.items()):
            self._drop(conn, token)
        if self._paused is not None:
            self._paused.cancel()
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()


TRIM_EVERY = 2.0  # s between checks
TRIM_AFTER = 256  # connections closed since the last trim


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim, or None (another C library)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], object] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return functools.partial(trim, 0)


async def give_memory_back(connections: Connections) -> None:
    """After a burst of connections has closed, return freed memory to the system.

    The TLS state of a connection is allocated by OpenSSL through glibc's malloc; after
    a flood of thousands, glibc keeps the freed pages in its arenas, and the RSS a
    container limit counts stays at the flood's peak, wave after wave, until the pod is
    killed (measured: +20 MB per wave of 6,000 connections, never given back). Trimming
    after bursts keeps it flat; a quiet server never trims.
    """
    trim = _malloc_trim()
    if trim is None:
        return
    seen = connections.closed
    while True:
        await asyncio.sleep(TRIM_EVERY)
        if connections.closed - seen >= TRIM_AFTER:
            seen = connections.closed
            trim()


def _shutdown(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


class BoundedServer(uvicorn.Server):
    """uvicorn's server listening through :class:`Acceptor` (TLS and the cap are ours)."""

    def __init__(self, config: uvicorn.Config, context: ssl.SSLContext, limit: int) -> None:
        super().__init__(config)
        self.context = context
        self.connections = Connections(limit)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        config = self.config

        def make_protocol() -> Any:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state)

        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        # A listen queue as deep as the kernel allows (net.core.somaxconn caps it): a
        # burst of connects waits there to be accepted instead of having SYNs dropped.
        sock = socket.create_server((config.host, config.port), family=family,
                                    backlog=max(config.backlog, socket.SOMAXCONN, 4096))
        sock.setblocking(False)
        self.servers = [Acceptor(sock, make_protocol, self.context,  # type: ignore[list-item]
                                 self.connections)]
        self._trimmer = asyncio.get_running_loop().create_task(
            give_memory_back(self.connections))
        logs.event("listening", url=f"https://{config.host}:{sock.getsockname()[1]}",
                   max_connections=self.connections.limit)
        self.started = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._trimmer.cancel()
        await super().shutdown(sockets)


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
        # The cycle holds this as its transport and the hook below: a strong reference
        # back would make each request a reference cycle, left for the garbage collector
        # (about 15 objects a review, and a collection pass every few dozen reviews).
        self._transport, self._cycle = transport, weakref.ref(cycle)
        self._held: bytes | None = None
        self._armed = True  # the next write after the response starts is its header block
        cycle.on_response = functools.partial(_finished, self, cycle.on_response)

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
            return
        cycle = self._cycle()
        if self._armed and cycle is not None and cycle.response_started:
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


def _finished(transport: OneWriteTransport, on_response: Callable[[], None]) -> None:
    """The response is complete: what is held goes out, then uvicorn's own hook."""
    transport._release()
    on_response()


# Paths a caller without a client certificate may use: the kubelet's probes.


def cannot_listen(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or None. Tried before uvicorn, which would
    log the bare OS error and exit 3 with nothing naming the flag."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"--host {host!r} is not an address of this machine ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As uvicorn binds: SO_REUSEADDR, so a probe just closed does not block it.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return f"cannot listen on {host}:{port} ({exc.strerror}): check --host and --port"
    return None
