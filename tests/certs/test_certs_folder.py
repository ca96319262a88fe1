"""The top-level ``certs/`` folder: tracked with its README, and every file that
``gpu-webhook certs`` or ``make run`` writes there is ignored by git, keys first."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU_WEBHOOK = str(Path(sys.executable).with_name("gpu-webhook"))

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs git and a git checkout")


def _ignored(path: str) -> bool:
    # --no-index: ignored by the rules even if such a file were ever committed.
    done = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


def test_every_file_gpu_webhook_certs_writes_is_ignored(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    done = subprocess.run([GPU_WEBHOOK, "certs", "--out", str(out)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in out.iterdir())
    assert {"ca.pem", "tls.crt", "tls.key"} <= set(written)
    # Checked as the names they get under the repository's certs/ (the default --out).
    assert [n for n in written if not _ignored(f"certs/{n}")] == []


def test_the_readme_is_tracked_and_says_what_lands_here() -> None:
    assert not _ignored("certs/README.md")
    readme = (ROOT / "certs" / "README.md").read_text()
    for name in ("ca.pem", "ca-key.pem", "tls.crt", "tls.key", "gpu-webhook certs",
                 "make run", "self-managed", "cert-manager"):
        assert name in readme, name
