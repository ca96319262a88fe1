"""Fixtures of the quota tests: the API server the shared ledger is kept in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakeapi import FakeAPI, running


@pytest.fixture
def api() -> Iterator[FakeAPI]:
    with running() as fake:
        yield fake
