"""``gpu-webhook certs`` as a user runs it: files written, no silent overwrite, and the
caBundle on stdout for scripts. (tests/certs checks the certificates themselves.)"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable
from pathlib import Path

Run = Callable[..., subprocess.CompletedProcess[str]]  # the gpu_webhook fixture

FILES = ["ca-key.pem", "ca.pem", "tls.crt", "tls.key"]


def test_writes_files_and_prints_the_ca_bundle(gpu_webhook: Run, tmp_path: Path) -> None:
    done = gpu_webhook("certs", "--out", "out", "--days", "30")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == FILES
    # stdout is exactly the caBundle, so `CA=$(gpu-webhook certs ...)` works.
    bundle = done.stdout.strip()
    assert "\n" not in bundle
    assert base64.b64decode(bundle, validate=True) == (tmp_path / "out" / "ca.pem").read_bytes()
    assert "wrote out/tls.crt" in done.stderr
    assert "(30 days): renew before then" in done.stderr


def test_refuses_to_overwrite_without_force(gpu_webhook: Run, tmp_path: Path) -> None:
    assert gpu_webhook("certs", "--out", "out").returncode == 0
    before = {n: (tmp_path / "out" / n).read_bytes() for n in FILES}
    again = gpu_webhook("certs", "--out", "out")
    assert again.returncode == 2
    assert "already exist; pass --force to replace them" in again.stderr
    assert again.stdout == ""
    assert {n: (tmp_path / "out" / n).read_bytes() for n in FILES} == before
    forced = gpu_webhook("certs", "--out", "out", "--force")
    assert forced.returncode == 0
    assert (tmp_path / "out" / "tls.crt").read_bytes() != before["tls.crt"]
