"""Markers for the deploy tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: builds a virtualenv from the package (tens of seconds the first time)")
