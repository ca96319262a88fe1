"""README blocks run as a newcomer pastes them: the block taken from README.md, run by
bash at the root of a copy of the tree, and everything the block shows after a command
(its ``#   `` lines, ``...`` eliding) checked against what the commands print.

The copy's ``.venv`` is the virtualenv running the tests, installed already (by ``make
install``), so the README's ``make`` targets go straight to their work; a fresh clone
installs first, which the blocks wait for either way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def block(heading: str, after: str = "") -> str:
    """The first ```sh block under ``## heading`` (after the text ``after``, if given)."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    if after:
        section = section.split(after, 1)[1]
    return section.split("```sh\n", 1)[1].split("\n```", 1)[0] + "\n"


def own_policy_section() -> str:
    """deploy/README.md's "A policy of your own"."""
    text = (README.parent / "deploy" / "README.md").read_text()
    return text.split("\n## A policy of your own\n", 1)[1].split("\n## ", 1)[0]


def own_policy_overlay(tree: Path, policy: str) -> Path:
    """The section's kustomize overlay, laid out as it says (beside the policy, the
    repository as ``gpu-webhook`` next to it) under ``tree``; its directory."""
    section = own_policy_section()
    kustomization = section.split("```yaml\n", 1)[1].split("\n```", 1)[0] + "\n"
    overlay = tree / "overlay"
    overlay.mkdir(parents=True)
    (tree / "gpu-webhook").symlink_to(README.parent)
    (overlay / "kustomization.yaml").write_text(kustomization)
    (overlay / "policy.yaml").write_text(policy)
    return overlay


def shown(text: str) -> list[str]:
    """The output lines a block shows: the ``#   `` comments right after a command (a
    bare ``#`` inside them is a blank line of that output)."""
    out: list[str] = []
    in_output = False
    for line in text.splitlines():
        if in_output and (line.startswith("#   ") or line == "#"):
            if line != "#":
                out.append(line[4:])
            continue
        in_output = bool(line.strip()) and not line.startswith("#")
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


def clone(tmp_path: Path) -> Path:
    """A copy of the tree (what git tracks and the work in progress, no caches, no
    certificates) whose ``.venv`` is the tests' own, installed."""
    tree = tmp_path / "clone"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(
        ".git", ".venv", "certs", "__pycache__", ".*_cache", ".hypothesis", "*.egg-info"))
    (tree / "certs").mkdir()
    shutil.copy2(ROOT / "certs" / "README.md", tree / "certs" / "README.md")
    venv = Path(sys.prefix)
    stamps = [venv / ".installed-serve", venv / ".installed"]
    if not all(s.exists() for s in stamps):
        pytest.fail(f"{venv} was not made by `make install` (no {stamps[1].name}): the "
                    "README's make targets would install into it")
    (tree / ".venv").symlink_to(venv)
    # Installed already: pyproject.toml older than the stamps asks for no new install.
    before = min(s.stat().st_mtime for s in stamps) - 1
    os.utime(tree / "pyproject.toml", (before, before))
    return tree


def user_env(tmp_path: Path, *, own_home: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a shell on a laptop: no kubeconfig, no make or venv of ours;
    with ``own_home``, an empty home too (no ~/.kube/config; but no build caches either,
    so never for a block that runs ``make controlplane``)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "KUBECONFIG", "VIRTUAL_ENV")}
    if own_home:
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        env["HOME"] = str(home)
    env.update(extra)
    return env


def run(tree: Path, text: str, env: dict[str, str], timeout: float
        ) -> subprocess.CompletedProcess[str]:
    """``text`` pasted into bash at ``tree``; whatever it left in the background (``make
    run &``) is stopped after it."""
    proc = subprocess.Popen(["bash"], cwd=tree, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(text, timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    return subprocess.CompletedProcess(["bash"], proc.returncode, out, err)
