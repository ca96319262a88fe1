"""The README's five-minute tour, pasted as a newcomer pastes it: the block is taken from
README.md and run by bash at the root of a copy of the tree, and everything it shows
after a command (its ``#   `` lines, ``...`` eliding) is what the commands print.

The copy's ``.venv`` is the virtualenv running the tests, already installed, so ``make
run`` goes straight to serving (a fresh clone installs first; the tour waits for
readiness either way). The tour serves on https://localhost:8443, as README says, and
writes /tmp/pod.yaml, /tmp/review.json and /tmp/reply.json as printed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("make") is None or shutil.which("curl") is None,
                                 reason="no make or curl")]


def tour() -> str:
    """The first ```sh block of the tour section."""
    section = README.read_text().split("\n## A five-minute tour\n", 1)[1]
    return section.split("```sh\n", 1)[1].split("\n```", 1)[0] + "\n"


def shown(block: str) -> list[str]:
    """The output lines the block shows (``#   `` comments right after a command)."""
    out: list[str] = []
    after_command = False
    for line in block.splitlines():
        if line.startswith("#   ") and after_command:
            out.append(line[4:])
            continue
        after_command = bool(line.strip()) and not line.startswith("#")
    return out


def missing(lines: list[str], printed: str) -> list[str]:
    """The shown lines whose parts (split at ``...``) are not printed, in order."""
    at = 0
    absent = []
    for line in lines:
        for part in (p.strip() for p in line.split("...")):
            if not part:
                continue
            found = printed.find(part, at)
            if found < 0:
                absent.append(line)
                break
            at = found + len(part)
    return absent


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_tour_shows_output_lines() -> None:
    lines = shown(tour())
    assert "Pod research/trainer-0: ALLOWED" in lines and "allowed" in lines
    assert missing(["a ... c"], "a b c") == [] and missing(["c ... a"], "a b c") == ["c ... a"]


def test_the_tour_runs_as_pasted(tmp_path: Path) -> None:
    assert port_free(8443), "something listens on localhost:8443, where the tour serves"
    tree = tmp_path / "clone"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(
        ".git", ".venv", "certs", "__pycache__", ".*_cache", ".hypothesis", "*.egg-info"))
    (tree / "certs").mkdir()
    shutil.copy2(ROOT / "certs" / "README.md", tree / "certs" / "README.md")
    venv = Path(sys.prefix)
    stamp = venv / ".installed-serve"
    if not stamp.exists():
        pytest.fail(f"{venv} was not made by `make install` (no {stamp.name}): the tour's "
                    "`make run` would install into it")
    (tree / ".venv").symlink_to(venv)
    # Installed already: older than the stamp, pyproject.toml asks for no new install.
    before = stamp.stat().st_mtime - 1
    os.utime(tree / "pyproject.toml", (before, before))
    planned = subprocess.run(["make", "--no-print-directory", "-n", "run"], cwd=tree,
                             capture_output=True, text=True, timeout=60, check=True)
    assert planned.stdout.splitlines() == [".venv/bin/gpu-webhook serve"], planned.stdout

    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "KUBECONFIG", "VIRTUAL_ENV")}
    env["HOME"] = str(tmp_path / "home")  # no ~/.kube/config: no cluster, as on a laptop
    proc = subprocess.Popen(["bash"], cwd=tree, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(tour(), timeout=300)
    finally:
        # `make run &` and the server it started, still serving: the whole session.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    log = Path("/tmp/gpu-webhook.log")
    server = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    assert not re.search(r"command not found|No such file or directory", err), err + server
    assert not missing(shown(tour()), out), f"{out}\n--- stderr:\n{err}\n--- server:\n{server}"
    # The pod the server was asked about was mutated by it, not by the offline review.
    assert "no cluster configured" in server
