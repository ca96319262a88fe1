"""Fixtures for the CLI tests: run the installed ``gpu-webhook`` console script as a user
would, in a subprocess, and hand back its exit code and output."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import kit
import pytest

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def console_script() -> str:
    return kit.console_script()



@pytest.fixture
def gpu_webhook(console_script: str, tmp_path: Path) -> Run:
    """``gpu_webhook("policy", "check", FILE)`` -> CompletedProcess (text, in tmp_path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_WEBHOOK_")}

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([console_script, *args], input=stdin, capture_output=True,
                              text=True, timeout=60, cwd=tmp_path, env=env)

    return run
