"""A small fake of the Kubernetes API's ConfigMaps and pod list/watch, over real HTTP.

The code under test (``webhook.libs.kube`` with the real ``kubernetes`` client and
urllib3, ``LedgerStore``, ``Watcher``, ``ClusterState``) talks to it as to a
kube-apiserver: resourceVersion preconditions on replace (409 when stale),
AlreadyExists on create, 404 Status objects, a watch stream of JSON lines with
bookmarks. Faults are injected at the wire: an HTTP status, a reply that never comes
(the client's read timeout fires), a hook that runs between a read and the write that
follows it (another replica committing first), or a watch stream that goes silent
without closing. Only what the webhook uses is implemented.
"""

from __future__ import annotations

import json
import queue
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

CM = re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps(?:/([^/?]+))?$")


class FakeAPI:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 100
        self.faults: list[str] = []  # next requests: "503", "403", "hang"
        self.before_write: Callable[[], None] | None = None  # runs once, before a write
        self.requests: list[tuple[str, str]] = []
        self.authorizations: list[str | None] = []  # each request's Authorization header
        self.pods: list[dict[str, Any]] = []
        self.watch_events: queue.Queue[dict[str, Any] | str] = queue.Queue()
        self.released = threading.Event()  # set at stop: "hang" replies give up
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        # A short poll: shutdown() waits for it, once per test.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeAPI:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()

    def api_client(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = self.url
        cfg.retries = 0
        return client.ApiClient(cfg)

    # -- state, as a test (or "another replica") sets it --------------------------------

    def put_configmap(self, namespace: str, name: str, data: dict[str, str]) -> str:
        with self.lock:
            self.rv += 1
            obj = {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": name, "namespace": namespace,
                                "resourceVersion": str(self.rv)},
                   "data": dict(data)}
            self.configmaps[(namespace, name)] = obj
            return str(self.rv)

    def data(self, namespace: str, name: str) -> dict[str, str]:
        with self.lock:
            return dict(self.configmaps[(namespace, name)]["data"])


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "reason": reason, "message": message}


def _handler(api: FakeAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            out: dict[str, Any] = json.loads(self.rfile.read(n) or b"{}")
            return out

        def _fault(self) -> bool:
            with api.lock:
                fault = api.faults.pop(0) if api.faults else None
            if fault is None:
                return False
            if fault == "hang":
                api.released.wait(30)  # longer than any client timeout in the tests
                self.close_connection = True
                return True
            code = int(fault)
            self._reply(code, _status(code, "Fault", f"injected HTTP {code}"))
            return True

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            api.requests.append(("GET", path))
            api.authorizations.append(self.headers.get("Authorization"))
            if self._fault():
                return
            if path == "/api/v1/pods":
                if "watch=true" in query:
                    self._watch()
                else:
                    self._reply(200, {"kind": "PodList", "apiVersion": "v1",
                                      "metadata": {"resourceVersion": str(api.rv)},
                                      "items": list(api.pods)})
                return
            m = CM.match(path)
            if not m or not m.group(2):
                self._reply(404, _status(404, "NotFound", path))
                return
            with api.lock:
                obj = api.configmaps.get((m.group(1), m.group(2)))
            if obj is None:
                self._reply(404, _status(404, "NotFound", f"configmaps {m.group(2)!r} not found"))
            else:
                self._reply(200, obj)

        def _watch(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                ev = api.watch_events.get()
                if ev == "close":  # the server's watch timeout: a clean end
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if ev == "stall":  # silent, open: a dead path that sends no FIN/RST
                    api.released.wait(30)
                    self.close_connection = True
                    return
                assert isinstance(ev, dict)
                line = json.dumps(ev).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

        def do_POST(self) -> None:
            self._write(create=True)

        def do_PUT(self) -> None:
            self._write(create=False)

        def _write(self, create: bool) -> None:
            path = self.path.partition("?")[0]
            api.requests.append(("POST" if create else "PUT", path))
            api.authorizations.append(self.headers.get("Authorization"))
            body = self._body()
            hook, api.before_write = api.before_write, None
            if hook is not None:
                hook()
            if self._fault():
                return
            m = CM.match(path)
            assert m, path
            ns, name = m.group(1), body["metadata"]["name"]
            with api.lock:
                current = api.configmaps.get((ns, name))
                if create and current is not None:
                    self._reply(409, _status(409, "AlreadyExists", f"{name} already exists"))
                    return
                if not create and (current is None or body["metadata"].get("resourceVersion")
                                   != current["metadata"]["resourceVersion"]):
                    self._reply(409, _status(409, "Conflict", "the object has been modified"))
                    return
                api.rv += 1
                body["metadata"]["resourceVersion"] = str(api.rv)
                body["metadata"]["namespace"] = ns
                api.configmaps[(ns, name)] = body
            self._reply(201 if create else 200, body)

    return Handler


@contextmanager
def running() -> Iterator[FakeAPI]:
    api = FakeAPI().start()
    try:
        yield api
    finally:
        api.stop()
