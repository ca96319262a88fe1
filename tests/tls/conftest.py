"""Fixtures for the TLS tests: a CA, a serving pair in a Secret-like volume, and servers
that are stopped when the test ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tlskit import CA, SecretVolume, Server, new_ca, start, stop


@pytest.fixture
def ca(tmp_path: Path) -> CA:
    return new_ca(tmp_path / "ca")


@pytest.fixture
def volume(tmp_path: Path, ca: CA) -> SecretVolume:
    v = SecretVolume(tmp_path / "secret")
    v.put_pair(ca.serving())
    return v


@pytest.fixture
def serve(tmp_path: Path, volume: SecretVolume) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def factory(*flags: str) -> Server:
        s = start(volume.root, *flags, log=tmp_path / f"server{len(started)}.log")
        started.append(s)
        return s

    yield factory
    for s in started:
        stop(s)
