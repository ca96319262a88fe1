"""The Makefile's two front doors: ``make run`` installs only what ``serve`` needs (no
dev, bench or plotting extras, no load generator), ``make test`` the extras on top.
Read from ``make -n`` (what make would run) for a virtualenv that does not exist yet,
i.e. a fresh clone."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def _planned(target: str, venv: Path) -> list[str]:
    # As a user runs it, not as a sub-make of `make test` (whose MAKEFLAGS/MAKELEVEL would
    # add "Entering directory" lines to what is planned).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(["make", "--no-print-directory", "-n", f"VENV={venv}", target],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_make_run_installs_the_package_without_extras(tmp_path: Path) -> None:
    lines = _planned("run", tmp_path / "venv")
    installs = [line for line in lines if " install " in line]
    assert [line.split(" install ", 1)[1] for line in installs] == [
        "-q --upgrade pip", "-q -e ."]
    assert not [line for line in lines if "apt-get" in line or "wrk" in line]
    assert lines[-1] == f"{tmp_path / 'venv'}/bin/gpu-webhook serve"


def test_make_unit_adds_the_dev_and_bench_extras(tmp_path: Path) -> None:
    lines = _planned("unit", tmp_path / "venv")
    installs = [line.split(" install ", 1)[1] for line in lines if "/pip install " in line]
    assert installs == ["-q --upgrade pip", "-q -e .", "-q -e '.[dev,bench]'"]


def test_make_test_builds_helm_before_the_suite(tmp_path: Path) -> None:
    # The chart tests need helm; CI starts cold, so `make test` builds (or finds) it first.
    lines = _planned("test", tmp_path / "venv")
    build = lines.index("bash tests/deploy/helm/build.sh")
    assert build < next(i for i, line in enumerate(lines) if line.endswith("/bin/pytest"))


def test_make_test_and_e2e_install_the_image_tools_before_the_suite(tmp_path: Path) -> None:
    # tests/e2e/test_e2e_image.py builds and runs the image with podman on an mmdebstrap
    # base: CI starts cold, so both targets install (or find) them first.
    for target, suite in (("test", "/bin/pytest"), ("e2e", "/bin/pytest -m e2e")):
        lines = _planned(target, tmp_path / "venv")
        tools = next(i for i, line in enumerate(lines) if "apt-get install" in line
                     and "podman runc mmdebstrap" in line)
        assert tools < next(i for i, line in enumerate(lines) if line.endswith(suite))
