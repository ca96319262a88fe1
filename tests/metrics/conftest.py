"""Fixtures for the metrics tests: a running server with its own copy of the policy."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from metricskit import POLICY, Server, serve


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.read_text())
    return path


@pytest.fixture
def server(tmp_path: Path, policy_file: Path) -> Iterator[Server]:
    assert Path(sys.executable).with_name("gpu-webhook").exists(), (
        "the gpu-webhook console script is not installed (pip install -e .)")
    with serve(tmp_path, policy_file) as s:
        yield s
