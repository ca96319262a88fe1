"""The pod watch on the event loop: list, then watch, with each event parsed and applied
on the loop that answers reviews, with no thread between.

Every replica watches every pod of the cluster. :class:`~webhook.libs.kube.watch.Watcher`
reads a watch in a thread and hands each event to the loop: per event the thread wakes,
then the loop, and the interpreter passes between the two, which on a busy cluster cost
the replica more CPU than applying the events (bench/README.md, "Pod watch events").
Here the watch request is the loop's own connection (uvloop's TLS), its chunked answer
parsed by httptools (the HTTP parser the server answers reviews with) and each line by
orjson, and each event handed to ``deliver`` where it is parsed. The list, rare and large,
is the client library's, in a thread; its items are delivered a turn's worth at a time.

The contract is :class:`Watcher`'s: RESET (after a relist), ADDED for each item, SYNCED;
then ADDED / MODIFIED / DELETED, PROGRESS for a bookmark and at the end of each window;
ABSENT for a collection the API server does not serve; a connection silent for three
windows is given up and the collection listed again, with backoff after failures.

Credentials and TLS are the API client's (a kubeconfig's or the in-cluster service
account's: CA, client certificate, bearer token refreshed as the client refreshes it). A
kubeconfig that reaches the API server through a proxy is not read here:
:func:`loop_watcher` returns None and the caller uses a :class:`Watcher`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

import httptools
from kubernetes import client

from webhook.libs import logs
from webhook.libs.kube.api import (
    KubeError,
    NotFound,
    Unreachable,
    json_object,
    network_error,
    status_error,
    translated,
)
from webhook.libs.kube.watch import (
    ABSENT_RECHECK_SECONDS,
    apply_event,
    failed_words,
    split_lines,
    watch_event,
)

# The collections watched here, by the kind :class:`Watcher` names them.
PATHS = {"pods": "/api/v1/pods"}
ITEMS_PER_TURN = 256  # list items delivered before the loop's other work runs again
MAX_ERROR_BODY = 64 * 1024


def loop_watcher(api: client.ApiClient, kind: str,
                 deliver: Callable[[str, dict[str, Any]], None],
                 window: Callable[[], float]) -> LoopWatcher | None:
    """A watch of ``kind`` on the running loop, or None where this module cannot make
    the request itself (a proxy, a kind it does not know)."""
    cfg = api.configuration
    url = urlsplit(str(cfg.host))
    if kind not in PATHS or cfg.proxy or url.scheme not in ("http", "https") \
            or not url.hostname:
        return None
    return LoopWatcher(api, kind, deliver, window)


class LoopWatcher:
    """List then watch one collection on the running event loop (see the module
    docstring); ``deliver`` is called on the loop."""

    def __init__(self, api: client.ApiClient, kind: str,
                 deliver: Callable[[str, dict[str, Any]], None],
                 window: Callable[[], float]) -> None:
        cfg = api.configuration
        url = urlsplit(str(cfg.host))
        self.api, self.kind, self._consumer, self.window = api, kind, deliver, window
        self._list_fn: Callable[..., Any] = client.CoreV1Api(api).list_pod_for_all_namespaces
        self._host = url.hostname or ""
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._netloc = url.netloc
        self._path = url.path.rstrip("/") + PATHS[kind]
        self._tls = _context(cfg) if url.scheme == "https" else None
        self._server_hostname = (cfg.tls_server_name or self._host) if self._tls else None
        self.synced = threading.Event()
        self._relist = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.get_loop().call_soon_threadsafe(self._task.cancel)

    def resync(self) -> None:
        """Relist (and RESET the consumer) when the current watch window ends."""
        self._relist = True

    def deliver(self, typ: str, obj: dict[str, Any]) -> None:
        """Hand an event to the consumer; one it fails to apply is reported and the next
        ones delivered (:func:`~webhook.libs.kube.watch.apply_event`)."""
        apply_event(asyncio.get_running_loop(), self._consumer, typ, obj)

    async def _run(self) -> None:
        backoff, first = 0.5, True
        while True:
            try:
                rv = await self._list(first)
                first, backoff = False, 0.5
                await self._watch(rv)
            except NotFound:
                self.deliver("ABSENT", {})  # see Watcher._run
                self.synced.set()
                await asyncio.sleep(ABSENT_RECHECK_SECONDS)
            except Exception as exc:  # any failure: log, back off, relist
                logs.event(f"{self.kind} watch failed; relisting", logging.WARNING,
                           error=failed_words(exc), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _list(self, first: bool) -> str:
        body = await asyncio.to_thread(self._fetch_list)
        if not first:
            self.deliver("RESET", {})
        for i, item in enumerate(body.get("items") or ()):
            self.deliver("ADDED", item)
            if i % ITEMS_PER_TURN == ITEMS_PER_TURN - 1:
                await asyncio.sleep(0)  # reviews between the turns of a long list
        self.deliver("SYNCED", {})
        self.synced.set()
        return str(body.get("metadata", {}).get("resourceVersion", ""))

    def _fetch_list(self) -> dict[str, Any]:
        with translated(f"list {self.kind}", 30):
            resp = self._list_fn(_preload_content=False, _request_timeout=30)
            return json_object(f"list {self.kind}", resp.data)

    async def _watch(self, rv: str) -> None:
        while True:
            if self._relist:
                self._relist = False
                return
            rv = await self._one_window(rv, self.window())
            # The server closed the watch at its timeout: alive to the end.
            self.deliver("PROGRESS", {})

    async def _one_window(self, rv: str, window: float) -> str:
        """One watch request, from ``rv`` for ``window`` seconds; the resourceVersion
        to go on from."""
        what, silence = f"watch {self.kind}", 3 * window
        loop = asyncio.get_running_loop()
        stream = _Stream(self, what, rv, silence, loop)
        try:
            transport, _ = await asyncio.wait_for(loop.create_connection(
                lambda: stream, self._host, self._port, ssl=self._tls,
                server_hostname=self._server_hostname), silence)
        except (OSError, TimeoutError) as exc:
            raise network_error(what, exc, silence) from None
        try:
            transport.write(self._request(rv, window))
            return await stream.done
        finally:
            transport.close()

    def _request(self, rv: str, window: float) -> bytes:
        query = urlencode({"watch": "true", "resourceVersion": rv,
                           "allowWatchBookmarks": "true",
                           "timeoutSeconds": str(max(1, int(window)))})
        headers = [f"GET {self._path}?{query} HTTP/1.1", f"Host: {self._netloc}",
                   "Accept: application/json", f"User-Agent: {self.api.user_agent}",
                   "Connection: close"]
        # Read for each request: the client refreshes an expiring token here.
        for auth in self.api.configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers.append(f"{auth['key']}: {auth['value']}")
        return ("\r\n".join(headers) + "\r\n\r\n").encode()


class _Stream(asyncio.Protocol):
    """One watch request's answer, parsed as it arrives; ``done`` is the
    resourceVersion to go on from once the server ends the watch, or the failure."""

    def __init__(self, watcher: LoopWatcher, what: str, rv: str, silence: float,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.watcher, self.what, self.rv, self.silence, self.loop = (
            watcher, what, rv, silence, loop)
        self.done: asyncio.Future[str] = loop.create_future()
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.rest = b""
        self.error_body = bytearray()
        self.transport: asyncio.BaseTransport | None = None
        self.last = loop.time()
        self.timer = loop.call_later(silence, self._check_silence)

    # -- the connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            pass  # an event that failed: done holds why
        except httptools.HttpParserError as exc:
            self._fail(Unreachable(self.what, "the API server's answer could not be read",
                                   f"{type(exc).__name__}: {exc}"))
        if self.done.done() and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()
        self._fail(network_error(self.what, exc or ConnectionResetError(
            "the connection closed before the watch ended"), None))

    def _check_silence(self) -> None:
        if self.done.done():
            return
        idle = self.loop.time() - self.last
        if idle < self.silence:
            self.timer = self.loop.call_later(self.silence - idle, self._check_silence)
            return
        # A dead path that sends nothing and never closes: give it up.
        self._fail(network_error(self.what, TimeoutError("no data"), self.silence))
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: KubeError) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    # -- httptools' callbacks ------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            if len(self.error_body) < MAX_ERROR_BODY:
                self.error_body += body
            return
        lines, self.rest = split_lines(self.rest, body)
        for line in lines:
            self._line(line)

    def on_message_complete(self) -> None:
        if self.status != 200:
            self._fail(status_error(self.what, self.status, "", bytes(self.error_body)))
            return
        self._line(self.rest)
        self.rest = b""
        if not self.done.done():
            self.done.set_result(self.rv)

    def _line(self, line: bytes) -> None:
        if not line.strip() or self.done.done():
            return
        try:
            self.rv = watch_event(self.watcher.kind, line, self.rv, self.watcher.deliver)
        except KubeError as exc:  # an ERROR event (410 Gone), or a line not JSON
            self._fail(exc)
            raise


def _context(cfg: client.Configuration) -> ssl.SSLContext:
    """The TLS the API client uses to reach the API server (kubernetes.client.rest)."""
    if not cfg.verify_ssl:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.ssl_ca_cert or cfg.ca_cert_data:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert, cadata=cfg.ca_cert_data)
    else:
        ctx = ssl.create_default_context()
    if cfg.verify_ssl and cfg.assert_hostname is False:
        ctx.check_hostname = False
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx
