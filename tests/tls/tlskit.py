"""Helpers for the TLS tests: certificate files, a real ``gpu-webhook serve`` subprocess,
and raw TLS clients that report what the handshake saw."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import orjson
from cryptography import x509
from kit import await_serving, free_port, listening, serve, stop_process

from webhook.libs import certs

NAMES = ["localhost"]
IPS = ["127.0.0.1"]


@dataclass
class CA:
    pem: bytes
    key_pem: bytes
    path: Path

    def serving(self, days: int = 30) -> certs.Issued:
        return certs.issue(NAMES, IPS, days=days, ca_pem=self.pem, ca_key_pem=self.key_pem)

    def client(self, directory: Path, cn: str) -> tuple[str, str]:
        cert, key = certs.issue_client(cn, self.pem, self.key_pem)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{cn}.crt").write_bytes(cert)
        (directory / f"{cn}.key").write_bytes(key)
        return str(directory / f"{cn}.crt"), str(directory / f"{cn}.key")


def new_ca(directory: Path) -> CA:
    """A fresh CA, written to ``directory/ca.pem`` (what a client trusts)."""
    issued = certs.issue(NAMES, IPS)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.pem").write_bytes(issued.ca_pem)
    return CA(issued.ca_pem, issued.ca_key_pem, directory / "ca.pem")


class SecretVolume:
    """A directory laid out like a mounted Kubernetes Secret: ``tls.crt`` -> ``..data/tls.crt``
    and ``..data`` -> a timestamped directory; an update writes a new directory and renames
    a new ``..data`` symlink over the old one, which is atomic."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.generation = 0

    def put(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        d = self.root / f"..gen_{self.generation}"
        d.mkdir()
        for name, data in files.items():
            (d / name).write_bytes(data)
        tmp = self.root / "..data_tmp"
        os.symlink(d.name, tmp)
        os.replace(tmp, self.root / "..data")
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                os.symlink(f"..data/{name}", link)

    def put_pair(self, issued: certs.Issued) -> None:
        self.put({certs.CERT_FILE: issued.cert_pem, certs.KEY_FILE: issued.key_pem})


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start(cert_dir: Path, *flags: str, log: Path) -> Server:
    """Start ``gpu-webhook serve`` and wait until it accepts TCP connections."""
    port = free_port()
    proc = serve(port, cert_dir, log, "--cert-poll-seconds", "0.1", *flags)
    server = Server(proc, port, log)
    try:
        await_serving(proc, listening(port), server.log_text, "listening")
    except AssertionError:
        stop(server)
        raise
    return server


def stop(server: Server) -> None:
    stop_process(server.proc, 25)


def client_context(ca: Path | None = None, *, cert: tuple[str, str] | None = None,
                   max_version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
    if cert:
        ctx.load_cert_chain(*cert)
    if max_version:
        ctx.maximum_version = max_version
    return ctx


@dataclass
class Answer:
    status: int
    body: dict[str, object]
    serial: int
    version: str


def request(server: Server, ctx: ssl.SSLContext, method: str = "GET", path: str = "/healthz",
            body: bytes = b"", *, conn: ssl.SSLSocket | None = None) -> Answer:
    """One HTTP/1.1 request on a new TLS connection (or on ``conn``), read to the end."""
    own = conn is None
    if conn is None:
        conn = connect(server, ctx)
    try:
        conn.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{'Connection: close' if own else ''}\r\n\r\n"
            .encode() + body)
        head, rest = _read_until(conn, b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(v) for k, v in (h.split(": ", 1) for h in lines[1:])
                      if k.lower() == "content-length")
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed mid-body")
            rest += chunk
        return Answer(status, orjson.loads(rest[:length]), serial_of(conn),
                      conn.version() or "")
    finally:
        if own:
            conn.close()


def connect(server: Server, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        return ctx.wrap_socket(raw, server_hostname="localhost")
    except BaseException:
        raw.close()
        raise


def serial_of(conn: ssl.SSLSocket) -> int:
    der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _read_until(conn: ssl.SSLSocket, marker: bytes) -> tuple[bytes, bytes]:
    buf = b""
    while marker not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed after {buf!r}")
        buf += chunk
    head, _, rest = buf.partition(marker)
    return head, rest


def serial_of_pem(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


REVIEW = orjson.dumps({
    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
    "request": {
        "uid": "0b1e5c2a-0000-4000-8000-000000000001",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "research", "operation": "CREATE",
        "userInfo": {"username": "developer"},
        "object": {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "cpu-only", "namespace": "research"},
                   "spec": {"containers": [{"name": "app", "image": "busybox"}]}},
    },
})
