"""Watches: list, then watch, of one kind of object, delivered as plain dicts with
relists and resets, for the webhook's in-memory caches."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes import client

from webhook.libs import logs
from webhook.libs.kube.api import KubeError, NotFound, Unreachable, json_object, translated

Event = tuple[str, dict[str, Any]]  # ("ADDED"|"MODIFIED"|"DELETED"|"SYNCED"|"RESET", obj)


class Watcher:
    """List then watch a collection in a background thread, handing each event to
    ``deliver`` (called from that thread). After the initial list it sends
    ("SYNCED", {}); after a relist (watch expired, 410 Gone) it first sends
    ("RESET", {}) so the consumer can drop state and rebuild.

    A collection the API server does not serve (HTTP 404 on the list) is reported as
    ("ABSENT", {}) and listed again a minute later.

    It also sends ("PROGRESS", {}) whenever the stream shows it is alive without a
    change (a bookmark, the end of a watch window), so the consumer can tell a quiet
    watch from a dead one. Each watch request asks the server to end it after
    ``window()`` seconds (``deliver.window`` when the consumer offers one), so a healthy
    watch shows progress at least that often; a connection silent for three windows is
    given up (the read times out) and the collection is listed again on a new one.
    """

    def __init__(self, api: client.ApiClient, kind: str,
                 deliver: Callable[[str, dict[str, Any]], None],
                 window: Callable[[], float] | None = None,
                 list_fn: Callable[..., Any] | None = None) -> None:
        core = client.CoreV1Api(api)
        self.api = api
        self.kind = kind
        fn: Callable[..., Any]
        if list_fn is not None:  # a collection of its own (the one GPUPolicy served)
            fn = list_fn
        elif kind == "pods":
            fn = core.list_pod_for_all_namespaces
        elif kind == "resourceclaims":
            fn = client.ResourceV1Api(api).list_resource_claim_for_all_namespaces
        elif kind == "resourceclaimtemplates":
            fn = client.ResourceV1Api(api).list_resource_claim_template_for_all_namespaces
        elif kind == "resourceslices":
            fn = client.ResourceV1Api(api).list_resource_slice
        elif kind == "podgroups":
            fn = client.SchedulingV1beta1Api(api).list_pod_group_for_all_namespaces
        elif kind == "compositepodgroups":
            fn = client.SchedulingV1alpha3Api(api).list_composite_pod_group_for_all_namespaces
        elif kind == "nodes":
            fn = core.list_node
        elif kind == "priorityclasses":
            fn = client.SchedulingV1Api(api).list_priority_class
        else:
            fn = core.list_namespace

        self.list_fn: Callable[..., Any] = fn
        self.deliver = deliver
        self.window: Callable[[], float] = (window or getattr(deliver, "window", None)
                                            or (lambda: DEFAULT_WATCH_WINDOW))
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._relist = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def resync(self) -> None:
        """Relist (and RESET the consumer) when the current watch window ends."""
        self._relist.set()

    def _run(self) -> None:
        backoff = 0.5
        first = True
        while not self._stop.is_set():
            try:
                rv = self._list(first)
                first = False
                backoff = 0.5
                self._watch(rv)
            except NotFound:
                # The API server does not serve this collection (resource.k8s.io/v1 on a
                # cluster older than 1.34): nothing of it exists to watch. Say so, and
                # look again now and then (the API may be turned on).
                self.deliver("ABSENT", {})
                self.synced.set()
                self._stop.wait(ABSENT_RECHECK_SECONDS)
            except Exception as exc:  # any failure: log, back off, relist
                logs.event(f"{self.kind} watch failed; relisting", logging.WARNING,
                           error=failed_words(exc), retry_in=backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _list(self, first: bool) -> str:
        with translated(f"list {self.kind}", 30):
            resp = self.list_fn(_preload_content=False, _request_timeout=30)
            body = json_object(f"list {self.kind}", resp.data)
        if not first:
            self.deliver("RESET", {})
        for item in body.get("items") or ():
            self.deliver("ADDED", item)
        self.deliver("SYNCED", {})
        self.synced.set()
        return str(body.get("metadata", {}).get("resourceVersion", ""))

    def _watch(self, rv: str) -> None:
        while not self._stop.is_set():
            if self._relist.is_set():
                self._relist.clear()
                return
            window = self.window()
            # The server ends the request after ``window`` (whole seconds); a read that
            # waits three windows for a byte is a stalled connection, not a quiet one.
            with translated(f"watch {self.kind}", 3 * window):
                resp = self.list_fn(
                    watch=True, _preload_content=False, resource_version=rv,
                    allow_watch_bookmarks=True, timeout_seconds=max(1, int(window)),
                    _request_timeout=3 * window)
                try:
                    for line in _lines(resp):
                        rv = watch_event(self.kind, line, rv, self.deliver)
                        if self._stop.is_set():
                            return
                finally:
                    resp.close()  # a stream left midway must not go back to the pool
                    resp.release_conn()
            # The server closed the watch at its timeout: the stream was alive to the end.
            self.deliver("PROGRESS", {})


def watch_event(kind: str, line: bytes, rv: str,
                deliver: Callable[[str, dict[str, Any]], None]) -> str:
    """Deliver one line of a watch stream of ``kind``; the resourceVersion to resume
    from. An ERROR event (410 Gone among them) or a line that is not JSON raises: the
    collection is listed again."""
    try:
        ev = orjson.loads(line)
    except orjson.JSONDecodeError:
        # Skipping a line would lose an object's change for good: list again.
        raise Unreachable(f"watch {kind}", "the API server sent a watch event that is "
                          "not JSON", line[:200].decode(errors="replace")) from None
    typ = ev.get("type") if isinstance(ev, dict) else None
    raw = ev.get("object") if isinstance(ev, dict) else None
    if not isinstance(raw, dict):
        raw = {}
    if typ == "ERROR":
        code = raw.get("code")
        raise KubeError(f"watch {kind}", f"error {code}", str(raw.get("message")))
    meta = raw.get("metadata")
    if isinstance(meta, dict):
        rv = str(meta.get("resourceVersion") or rv)
    deliver("PROGRESS" if typ == "BOOKMARK" else str(typ), {} if typ == "BOOKMARK" else raw)
    return rv


def failed_words(exc: BaseException) -> str:
    """What a watch's failure was, for the log."""
    return (exc.detail or str(exc)) if isinstance(exc, KubeError) else \
        f"{type(exc).__name__}: {exc}"


def _lines(resp: Any) -> Iterator[bytes]:
    """The non-empty lines of a watch response (one JSON event each), as the chunks
    arrive: parsed with orjson by the caller, where the client library's Watch decodes
    each line to text and parses it with the standard library (about 5x the CPU per
    event, on the thread that shares the interpreter with the event loop)."""
    rest = b""
    for chunk in resp.stream(None, decode_content=False):
        lines, rest = split_lines(rest, chunk)
        yield from (line for line in lines if line.strip())
    if rest.strip():
        yield rest


def apply_event(loop: asyncio.AbstractEventLoop, consumer: Callable[[str, dict[str, Any]], None],
                typ: str, obj: dict[str, Any]) -> None:
    """Hand a watch event to its consumer on ``loop``. One the consumer fails to apply is
    reported as the loop reports a callback's, and the watch goes on: listing again would
    meet the same object, and fail again."""
    try:
        consumer(typ, obj)
    except Exception as exc:
        loop.call_exception_handler({
            "message": f"a watch event ({typ}) could not be applied", "exception": exc})


def split_lines(rest: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    """The whole lines of a watch stream that ``chunk`` completes after ``rest`` (what
    the chunks before it left of an unfinished line), and what it leaves unfinished."""
    if b"\n" not in chunk:
        return [], rest + chunk
    *lines, tail = (rest + chunk).split(b"\n")
    return lines, tail


DEFAULT_WATCH_WINDOW = 15.0


ABSENT_RECHECK_SECONDS = 60.0
