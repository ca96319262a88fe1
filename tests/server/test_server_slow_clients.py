"""Connections that hold a slot without using it are closed; working ones keep theirs.

Each test waits for the event it is about (the server closing a connection, an answer),
never for a time: a broken deadline shows as the guard expiring, 30 s on, as a failure.
"""

from __future__ import annotations

import socket
import ssl

import httpx
import pytest
from kit import Server
from serverkit import ServerFactory

GUARD = 30.0  # only reached when a deadline is missing


def tls(server: Server) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(server.ca))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=GUARD)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def closed_by_server(conn: socket.socket) -> bool:
    """Read until the server closes (True) or sends bytes (False)."""
    try:
        data = conn.recv(65536)
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open for {GUARD:.0f}s") from None
    return data == b""


def test_a_tcp_connection_that_never_starts_tls_is_closed(server: Server) -> None:
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=GUARD)
    with conn:
        assert closed_by_server(conn)


def test_a_tls_connection_that_sends_no_request_is_closed(server: Server) -> None:
    with tls(server) as conn:
        assert closed_by_server(conn)


def test_headers_sent_a_byte_at_a_time_are_cut_off(server: Server) -> None:
    with tls(server) as conn:
        conn.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        conn.settimeout(1.0)  # between trickled bytes; the guard counts them
        for _ in range(int(GUARD)):
            try:
                conn.sendall(b"X")
                if conn.recv(1) == b"":
                    return  # closed, as it must be
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                return
        raise AssertionError("a request whose headers never end was kept open")


def test_headers_larger_than_64_kib_are_refused_with_431(server: Server) -> None:
    with tls(server) as conn:
        conn.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        conn.sendall(b"X-Filler: " + b"a" * (70 * 1024) + b"\r\n")
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 431 ")


@pytest.fixture
def capped(serve: ServerFactory) -> Server:
    return serve("--max-connections", "4")


def healthz(server: Server, client: httpx.Client | None = None) -> int:
    ctx = ssl.create_default_context(cafile=str(server.ca))
    c = client or httpx.Client(verify=ctx, timeout=GUARD)
    return c.get(server.base_url + "/healthz").status_code


def test_at_the_cap_a_silent_connection_makes_room_for_a_working_one(capped: Server) -> None:
    silent = [tls(capped) for _ in range(4)]
    try:
        assert healthz(capped) == 200  # took the place of the oldest silent one
        assert closed_by_server(silent[0])
    finally:
        for s in silent:
            s.close()


def test_at_the_cap_with_every_connection_working_a_new_one_is_refused(capped: Server) -> None:
    ctx = ssl.create_default_context(cafile=str(capped.ca))
    working = [httpx.Client(verify=ctx, timeout=GUARD) for _ in range(4)]
    try:
        assert [healthz(capped, c) for c in working] == [200] * 4  # keep-alive: 4 slots
        with pytest.raises(httpx.HTTPError):
            httpx.get(capped.base_url + "/healthz", verify=ctx, timeout=GUARD)
        assert [healthz(capped, c) for c in working] == [200] * 4  # theirs are kept
    finally:
        for c in working:
            c.close()
