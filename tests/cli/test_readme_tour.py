"""The README's five-minute tour, pasted as a newcomer pastes it (tests/readmekit.py): the
block from README.md run by bash at the root of a copy of the tree, and every line it
shows after a command printed by that command.

The tour serves on https://localhost:8443, as README says, and writes /tmp/pod.yaml,
/tmp/review.json, /tmp/reply.json and /tmp/gpu-webhook.log as printed.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import readmekit

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("make") is None or shutil.which("curl") is None,
                                 reason="no make or curl")]


def tour() -> str:
    return readmekit.block("A five-minute tour")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_tour_shows_output_lines() -> None:
    lines = readmekit.shown(tour())
    assert "Pod research/trainer-0: ALLOWED" in lines and "allowed" in lines
    assert readmekit.missing(["a ... c"], "a b c") == []
    assert readmekit.missing(["c ... a"], "a b c") == ["c ... a"]


def test_the_tour_runs_as_pasted(tmp_path: Path) -> None:
    assert port_free(8443), "something listens on localhost:8443, where the tour serves"
    tree = readmekit.clone(tmp_path)
    planned = subprocess.run(["make", "--no-print-directory", "-n", "run"], cwd=tree,
                             env=readmekit.user_env(tmp_path), capture_output=True, text=True,
                             timeout=60, check=True)
    assert planned.stdout.splitlines() == [".venv/bin/gpu-webhook serve"], planned.stdout

    done = readmekit.run(tree, tour(), readmekit.user_env(tmp_path, own_home=True),
                         timeout=300)
    log = Path("/tmp/gpu-webhook.log")
    server = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    assert not re.search(r"command not found|No such file or directory", done.stderr), (
        done.stderr + server)
    assert not readmekit.missing(readmekit.shown(tour()), done.stdout), (
        f"{done.stdout}\n--- stderr:\n{done.stderr}\n--- server:\n{server}")
    # The server the review was POSTed to ran on the laptop's defaults.
    assert "no cluster configured" in server
