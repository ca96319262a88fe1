"""Helpers every test folder shares: the installed console script and a free port.

``tests/`` is on ``sys.path`` while the suite runs (pytest puts the directory of the
root ``conftest.py`` there), so any test module can ``from kit import ...``.
"""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

import pytest


def console_script() -> str:
    """The ``gpu-webhook`` script installed next to the interpreter running the tests:
    the tests run the command exactly as a user does."""
    beside = Path(sys.executable).with_name("gpu-webhook")
    if beside.exists():
        return str(beside)
    found = shutil.which("gpu-webhook")
    if found is None:
        pytest.fail("the gpu-webhook console script is not installed (pip install -e .)")
    return found


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
