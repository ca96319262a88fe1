"""Helpers every test folder shares: the installed console script, a free port, a
``gpu-webhook serve`` process started, awaited and stopped as a user's would be, the
helm binary, the admission pipeline's validating step for synchronous tests, and a
GPUPolicy document around a test's own ``spec``.

``tests/`` is on ``sys.path`` while the suite runs (pytest puts the directory of the
root ``conftest.py`` there), so any test module can ``from kit import ...``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from webhook.admission import webhooks
from webhook.admission.webhooks import Cluster
from webhook.engine.decision import Decision
from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.target import NamespaceLabels, no_labels
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.store import UsageStore
from webhook.server.web.app import ARRIVED, AdmissionApp


def policy_yaml(name: str, spec: str) -> str:
    """A GPUPolicy document named ``name`` whose ``spec`` is ``spec``: the apiVersion,
    kind and metadata lines every policy starts with, then ``spec:`` and the lines under
    it. ``spec`` may be written at any indentation (it is dedented, then indented two
    spaces), so a module's policy reads as the YAML it is, one level under ``spec:``."""
    return ("apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\n"
            f"metadata: {{name: {name}}}\nspec:\n"
            + textwrap.indent(textwrap.dedent(spec), "  "))


def console_script() -> str:
    """The ``gpu-webhook`` script installed next to the interpreter running the tests:
    the tests run the command exactly as a user does."""
    beside = Path(sys.executable).with_name("gpu-webhook")
    if beside.exists():
        return str(beside)
    found = shutil.which("gpu-webhook")
    if found is None:
        pytest.fail("the gpu-webhook console script is not installed (pip install -e .)")
    return found


HELM_BUILD = Path(__file__).resolve().parent / "deploy" / "helm" / "build.sh"


def helm() -> str:
    """The helm binary (Helm v3), built from the Go module proxy by
    ``tests/deploy/helm/build.sh`` and cached (``make test`` builds it first). A helm that
    cannot be built fails the test: a skip would pass CI with the chart untested."""
    out = subprocess.run(["bash", str(HELM_BUILD)], capture_output=True, text=True,
                         check=False, timeout=1800)
    assert out.returncode == 0, f"tests/deploy/helm/build.sh could not build helm:\n{out.stderr}"
    path = out.stdout.strip().splitlines()[-1]
    assert Path(path).is_file(), path
    return path


def kube_version() -> str:
    """The Kubernetes release the e2e control plane runs (tests/e2e/controlplane/
    versions.env), for ``helm template --kube-version``: a helm built from source without
    the release's link flags takes its cluster to be v1.20.0, below the chart's
    ``kubeVersion``, where an official build assumes the release it was built against."""
    env = HELM_BUILD.parents[2] / "e2e" / "controlplane" / "versions.env"
    [line] = [ln for ln in env.read_text().splitlines() if ln.startswith("K8S_VERSION=")]
    return line.split("=", 1)[1].strip()


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(port: int, cert_dir: Path, log_path: Path, *flags: str,
          env: dict[str, str] | None = None, append: bool = False, **popen: Any
          ) -> subprocess.Popen[bytes]:
    r"""``gpu-webhook serve`` on 127.0.0.1:``port``, its output written (or ``append``\ed)
    to ``log_path``.
    The settings of the shell running the tests (``GPU_WEBHOOK_*``, an in-cluster
    ``KUBERNETES_SERVICE_HOST``) are left out, so only the test's flags and ``env``
    configure it."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("GPU_WEBHOOK_") and k != "KUBERNETES_SERVICE_HOST"}
    with open(log_path, "ab" if append else "wb") as out:
        return subprocess.Popen(
            [console_script(), "serve", "--host", "127.0.0.1", "--port", str(port),
             "--cert-dir", str(cert_dir), *flags],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**base, **(env or {})}, **popen)


def await_serving(proc: subprocess.Popen[bytes], ready: Callable[[], bool],
                  log: Callable[[], str], what: str = "healthy",
                  timeout: float = 30.0) -> None:
    """Poll ``ready()`` until it is true: an AssertionError with the server's log if the
    process exits first or ``timeout`` passes (generous: the first start also makes
    certificates; only ever waited out on failure). ``ready`` may raise OSError or an
    httpx error while the server is not up: that is not-ready yet."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gpu-webhook serve exited with {proc.returncode}:\n{log()}")
        try:
            if ready():
                return
        except Exception as exc:
            last = repr(exc)
        time.sleep(0.05)
    raise AssertionError(f"gpu-webhook serve was not {what} within {timeout:.0f} s "
                         f"(last error: {last or 'none'}):\n{log()}")


def listening(port: int) -> Callable[[], bool]:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""

    def check() -> bool:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True

    return check


def answering(url: str, ca: Path, path: str = "/healthz") -> Callable[[], bool]:
    """Whether the server at ``url`` answers ``path`` with 200 over TLS verified against
    ``ca`` (not yet while the server has not written its CA)."""

    def check() -> bool:
        if not ca.exists():
            return False
        ctx = ssl.create_default_context(cafile=str(ca))
        return httpx.get(url + path, verify=ctx, timeout=2.0).status_code == 200

    return check


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM, as the kubelet sends, then SIGKILL after ``timeout`` (uvicorn's graceful
    shutdown is capped at 20 s); the exit code (negative: killed by that signal)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


@dataclass
class Server:
    """A ``gpu-webhook serve`` process a test started on 127.0.0.1, how to reach it over
    TLS, and the HTTP clients the test opened to it (closed by :func:`stop_server`)."""

    process: subprocess.Popen[bytes]
    port: int
    cert_dir: Path
    log_path: Path
    ca_file: Path | None = None  # when the server runs on certificates given by flags
    client_timeout: float = 10.0  # of the clients :meth:`client` makes
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.ca_file or self.cert_dir / "ca.pem"

    def context(self) -> ssl.SSLContext:
        """TLS that trusts only the server's own CA."""
        return ssl.create_default_context(cafile=str(self.ca))

    def client(self, timeout: float | None = None) -> httpx.Client:
        """An HTTP/1.1 keep-alive client that trusts only the server's own CA."""
        c = httpx.Client(base_url=self.base_url, verify=self.context(),
                         timeout=self.client_timeout if timeout is None else timeout)
        self.clients.append(c)
        return c

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


SERVER_START_TIMEOUT = 30.0  # generous: the first start also generates certificates
SERVER_STOP_TIMEOUT = 30.0  # uvicorn's graceful shutdown is capped at 20 s


def start_server(tmp: Path, *flags: str, ca: Path | None = None,
                 env: dict[str, str] | None = None, client_timeout: float = 10.0) -> Server:
    """``gpu-webhook serve`` with ``flags`` in ``tmp`` (certificates in ``tmp/certs``, its
    log ``tmp/server.log``), returned once /healthz answers over verified TLS (trusting
    ``ca``, or the CA of the dev certificates the server generates); stopped, and the
    AssertionError with its log raised, if it never does."""
    port = free_port()
    cert_dir = tmp / "certs"
    proc = serve(port, cert_dir, tmp / "server.log", *flags, env=env, cwd=tmp)
    server = Server(proc, port, cert_dir, tmp / "server.log", ca, client_timeout)
    try:
        await_serving(proc, answering(server.base_url, server.ca), server.log,
                      timeout=SERVER_START_TIMEOUT)
    except AssertionError:
        stop_server(server)
        raise
    return server


def stop_server(server: Server) -> int:
    """The test's clients of ``server`` closed, then SIGTERM, as the kubelet sends
    (:func:`stop_process`); the exit code (negative: killed by that signal)."""
    for c in server.clients:
        c.close()
    return stop_process(server.process, SERVER_STOP_TIMEOUT)


def validating(req: AdmissionRequest, policy: CompiledPolicy,
               labels: NamespaceLabels = no_labels, store: UsageStore | None = None,
               claims: ClaimLookup = no_claims, budget: float = 1.0) -> Decision:
    """The validating webhook exactly as the server runs it (``webhook.admission.webhooks``), from
    synchronous test code; with ``store``, quota is checked and committed in it, within
    ``budget`` seconds (the server's default)."""
    return asyncio.run(webhooks.validating(req, policy, Cluster(labels, store,
                                                                 claims=claims), budget))


# ---------------------------------------------------------------------------- ASGI


@dataclass
class Reply:
    """An answer of the ASGI app: its status, headers and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


async def call(asgi: AdmissionApp, path: str, body: bytes, *, chunk: int = 65536,
               query: bytes = b"", arrived: float | None = None,
               headers: tuple[tuple[bytes, bytes], ...] = ()) -> Reply:
    """One POST through the ASGI app, the body delivered in ``chunk``-sized messages
    (with ``headers`` besides its content type)."""
    parts = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
                for i, p in enumerate(parts)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "query_string": query,
             "headers": [(b"content-type", b"application/json"), *headers],
             "client": ("127.0.0.1", 1)}
    if arrived is not None:
        scope[ARRIVED] = arrived
    await asgi(scope, receive, send)
    start_msg = next(m for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode() for k, v in start_msg["headers"]}
    return Reply(int(start_msg["status"]), headers, data)


def call_sync(asgi: AdmissionApp, path: str, body: bytes, **kw: Any) -> Reply:
    return asyncio.run(call(asgi, path, body, **kw))
