"""Run the installed ``gpu-webhook`` console script in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def gpu_webhook() -> Run:
    script = Path(sys.executable).with_name("gpu-webhook")
    if not script.exists():
        pytest.skip("the gpu-webhook console script is not installed (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_WEBHOOK_")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(script), *args], capture_output=True, text=True,
                              timeout=120, cwd=ROOT, env=env)

    return run
