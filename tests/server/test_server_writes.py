"""How replies go on the wire: each response in one TLS record (status line, headers and
body together), with the cases that must not be held back still prompt: an interim
``100 Continue``, and a HEAD reply that has no body to travel with.

The client here speaks TLS through a memory BIO over a plain socket, so it sees the
record layer: every TLS record that arrives is counted before it is decrypted.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

import orjson
import pytest
from kit import Server
from serverkit import pod, review

RECORD_HEADER = 5
APPLICATION_DATA = 23


class RecordClient:
    """A TLS client that counts the application-data records it receives."""

    def __init__(self, server: Server) -> None:
        ctx = ssl.create_default_context(cafile=str(server.ca))
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")
        self.raw = b""  # received bytes not yet split into records
        self.records = 0
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._receive()
        self._flush()

    def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self.sock.sendall(data)

    def _receive(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.raw += chunk
        while len(self.raw) >= RECORD_HEADER:
            size = int.from_bytes(self.raw[3:5], "big")
            if len(self.raw) < RECORD_HEADER + size:
                break
            if self.raw[0] == APPLICATION_DATA:
                self.records += 1
            self.incoming.write(self.raw[:RECORD_HEADER + size])
            self.raw = self.raw[RECORD_HEADER + size:]

    def send(self, data: bytes) -> None:
        self.tls.write(data)
        self._flush()

    def read_some(self) -> bytes:
        """The plaintext that has arrived, waiting for at least one byte."""
        while True:
            try:
                return self.tls.read(65536)
            except ssl.SSLWantReadError:
                self._receive()

    def read_until(self, done: bytes) -> bytes:
        """Plaintext received until it contains ``done``."""
        text = b""
        while done not in text:
            text += self.read_some()
        return text

    def response(self) -> tuple[bytes, bytes]:
        """One whole HTTP response (head, body) by its Content-Length."""
        text = self.read_until(b"\r\n\r\n")
        head, _, body = text.partition(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            body += self.read_some()
        return head, body

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def conn(server: Server) -> Iterator[RecordClient]:
    c = RecordClient(server)
    # A first exchange, so that what TLS 1.3 sends after the handshake (session tickets)
    # is not counted with the response measured next.
    c.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    c.response()
    yield c
    c.close()


def _post(path: str, body: bytes, *extra: bytes) -> bytes:
    return b"\r\n".join([f"POST {path} HTTP/1.1".encode(), b"Host: localhost",
                         b"Content-Type: application/json",
                         f"Content-Length: {len(body)}".encode(), *extra, b"", b""])


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_an_admission_reply_is_one_tls_record(conn: RecordClient, path: str) -> None:
    body = orjson.dumps(review(pod()))
    before = conn.records
    conn.send(_post(path, body) + body)
    head, reply = conn.response()
    assert head.startswith(b"HTTP/1.1 200")
    assert orjson.loads(reply)["response"]["uid"] == review(pod())["request"]["uid"]
    assert conn.records - before == 1


def test_probe_and_metrics_replies_are_one_tls_record_each(conn: RecordClient) -> None:
    # One write each: as few records as TLS allows (a record holds at most 16 KiB of
    # plaintext, and /metrics grows past that as series appear), never a record more.
    for path in ("/healthz", "/readyz", "/metrics"):
        before = conn.records
        conn.send(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        head, reply = conn.response()
        assert head.startswith(b"HTTP/1.1 200") and reply
        sent = len(head) + len(b"\r\n\r\n") + len(reply)
        assert conn.records - before == -(-sent // 16384), (path, sent)


def test_a_head_reply_is_sent_though_it_has_no_body(conn: RecordClient) -> None:
    conn.send(b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    head = conn.read_until(b"\r\n\r\n")
    # The probes answer GET only (the kubelet's method), so HEAD is 405; what this
    # proves is that a reply with no body write is not held back by OneWriteTransport.
    assert head.startswith(b"HTTP/1.1 405")
    # The connection is still usable afterwards.
    conn.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert conn.response()[0].startswith(b"HTTP/1.1 200")


def test_100_continue_is_not_held_back(conn: RecordClient) -> None:
    body = orjson.dumps(review(pod()))
    conn.send(_post("/mutate", body, b"Expect: 100-continue"))
    # A client that waits for the interim answer before sending its body gets it (a
    # held-back "100 Continue" would leave both sides waiting until the socket timeout).
    interim = conn.read_until(b"\r\n\r\n")
    assert interim.startswith(b"HTTP/1.1 100 Continue")
    conn.send(body)
    head, reply = conn.response()
    assert head.startswith(b"HTTP/1.1 200")
    assert orjson.loads(reply)["response"]["uid"] == review(pod())["request"]["uid"]
