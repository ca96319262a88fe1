"""Helpers for the hostile-input tests: a real ``gpu-webhook serve`` subprocess over TLS,
the same ASGI app driven in-process (no sockets, for speed), and raw HTTP/1.1 requests
for what httpx will not send (a lying Content-Length, a trickled body).

The in-process path runs :class:`webhook.server.web.app.AdmissionApp` itself, not the engine
alone, so a case proves the same outcome the subprocess gives: the HTTP status, the
JSON error or the AdmissionReview reply.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from kit import Server, start_server

from webhook.quota.store import MemoryStore
from webhook.server.sources.reload import PolicySource
from webhook.server.web.app import AdmissionApp, Runtime

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "policies" / "multi-tenant.yaml"


def start(tmp: Path, *flags: str, policy: Path | None = POLICY,
          env: dict[str, str] | None = None) -> Server:
    """``gpu-webhook serve`` on 127.0.0.1 with ``policy`` (None: no ``--policy``), healthy
    over verified TLS before it returns (:func:`kit.start_server`); its clients wait up
    to 30 s."""
    tmp.mkdir(parents=True, exist_ok=True)
    policy_flags = ("--policy", str(policy)) if policy is not None else ()
    return start_server(tmp, *flags, *policy_flags, env=env, client_timeout=30.0)


def rss_kib(pid: int) -> int:
    """Resident set size of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


# ---------------------------------------------------------------------------- in-process


def app(policy: Path = POLICY, **runtime: Any) -> AdmissionApp:
    """The server's ASGI app on ``policy`` with an in-memory usage store."""
    source = PolicySource(str(policy))
    active = source.load()
    return AdmissionApp(Runtime(policy=source,
                                store=MemoryStore(ttl=active.policy.reservation_ttl),
                                **runtime))


def raw_request(server: Server, path: str, head_extra: str, body: bytes, *,
                timeout: float = 30.0) -> tuple[int, bytes]:
    """A POST written by hand over TLS (for what httpx refuses to send: a Content-Length
    that does not match the body). Returns the status and the body as read until the
    server closes or ``timeout``."""
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    with server.context().wrap_socket(raw, server_hostname="localhost") as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\n"
                     f"Content-Type: application/json\r\n{head_extra}\r\n".encode() + body)
        return read_response(conn)


def read_response(conn: socket.socket) -> tuple[int, bytes]:
    """One HTTP response read to the end of its body (Content-Length): its status and
    body; the next response on the connection is then read from its own first byte."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {buf!r}")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                   if line.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, rest[:length]
