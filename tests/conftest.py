"""Fixtures shared by the whole suite: the realistic AdmissionReview in ``tests/fixtures``
and golden-file comparison.

Golden files pin text a person reads (denial messages, warnings) and patches the API
server applies. A change in wording shows up as a diff to review; when the change is
intended, regenerate them with ``UPDATE_GOLDEN=1 pytest tests/engine`` and commit the
diff with the change that caused it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kit
import pytest

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
GOLDEN = TESTS / "golden"

GoldenCheck = Callable[[str, str], None]


@pytest.fixture
def admission_review() -> dict[str, Any]:
    """A Pod creation as the API server sends it: made by a ReplicaSet, with the fields
    defaulting and earlier admission plugins add (service account volume, not-ready
    tolerations, managedFields), a GPU limit without a request, a product label and a
    two-term node affinity. A fresh copy per test."""
    data: dict[str, Any] = json.loads((FIXTURES / "admission-review-pod.json").read_text())
    return data


@pytest.fixture
def golden() -> GoldenCheck:
    """``golden(relative_path, actual)``: compare with ``tests/golden/<relative_path>``;
    with ``UPDATE_GOLDEN=1`` (re)write the file instead."""

    def check(name: str, actual: str) -> None:
        path = GOLDEN / name
        if not actual.endswith("\n"):
            actual += "\n"
        if os.environ.get("UPDATE_GOLDEN") == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual)
            return
        if not path.exists():
            pytest.fail(f"golden file {path.relative_to(TESTS.parent)} is missing: "
                        "run with UPDATE_GOLDEN=1 to create it, then review and commit it")
        assert actual == path.read_text(), (
            f"output differs from {path.relative_to(TESTS.parent)}; if the change is "
            "intended, regenerate with UPDATE_GOLDEN=1 and review the diff")

    return check


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def gpu_webhook() -> Run:
    """``gpu_webhook(*args)``: the installed console script in a subprocess, run from the
    repository root with no GPU_WEBHOOK_* settings inherited. (tests/cli has its own,
    run from a temporary directory.)"""
    script = kit.console_script()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_WEBHOOK_")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([script, *args], capture_output=True, text=True, timeout=120,
                              cwd=TESTS.parent, env=env)

    return run
