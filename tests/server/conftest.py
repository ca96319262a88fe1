"""Fixtures for the server tests: a shared server on the example policy, and a factory
for servers started with their own ``serve`` flags (see ``serverkit``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kit import Server, start_server, stop_server
from serverkit import ServerFactory


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServerFactory]:
    """Start servers with extra ``serve`` flags; each is stopped when the test ends."""
    started: list[Server] = []
    n = 0

    def factory(*extra: str, ca: Path | None = None) -> Server:
        nonlocal n
        n += 1
        d = tmp_path / f"server{n}"
        d.mkdir()
        s = start_server(d, *extra, ca=ca)
        started.append(s)
        return s

    yield factory
    for s in started:
        stop_server(s)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server on the embedded example policy, shared by a module's contract tests."""
    s = start_server(tmp_path_factory.mktemp("server"))
    yield s
    stop_server(s)


@pytest.fixture
def client(server: Server) -> httpx.Client:
    return server.client()

