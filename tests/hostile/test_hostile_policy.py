"""Hostile policy files: each is refused with a PolicyError that says what is wrong,
promptly, and never with another exception (a RecursionError or a constructor's
KeyError would crash ``policy check`` and, on a hot reload, leave /readyz without the
reason). Complements tests/policy, which covers located schema errors and alias bombs.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from kit import console_script

from webhook.policy.load import MAX_DEPTH, MAX_POLICY_BYTES, PolicyError, load_file

HEAD = """\
apiVersion: gpu-webhook.dev/v1alpha1
kind: GPUPolicy
metadata:
  name: hostile
"""
# Generous bounds on 2 shared cores; the point is "not minutes, not forever".
QUICK = 5.0
SLOW_BUT_BOUNDED = 30.0


def _tenants(n: int) -> str:
    """``n`` tenants in flow style, the most tenants per byte YAML allows."""
    return HEAD + "spec:\n  tenants: [" + ",".join(
        f"{{name: t{i}, namespaces: [n{i}]}}" for i in range(n)) + "]\n"


CASES: list[tuple[str, str | bytes, str, float]] = [
    ("billion-laughs", "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)), "aliases", QUICK),
    ("merge-key-alias", HEAD + "spec: &s {mode: warn}\nx:\n  <<: *s\n", "aliases", QUICK),
    ("deep-flow-100k", "[" * 100_000, f"nested more than {MAX_DEPTH} levels", QUICK),
    ("deep-flow-mapping", "{a: " * 50_000, f"nested more than {MAX_DEPTH} levels", QUICK),
    ("deep-block-mapping", "".join(" " * i + "a:\n" for i in range(200)),
     f"nested more than {MAX_DEPTH} levels", QUICK),
    ("python-object-tag", HEAD + "spec: !!python/object/apply:os.system [ls]\n",
     "YAML tags", QUICK),
    ("binary-tag", HEAD + "spec: {mode: !!binary 'bad base64'}\n", "YAML tags", QUICK),
    ("timestamp-tag", HEAD + "spec: {mode: !!timestamp nope}\n", "YAML tags", QUICK),
    ("bool-tag", HEAD + "spec: {mode: !!bool maybe}\n", "YAML tags", QUICK),
    ("local-tag", HEAD + "spec: !include other.yaml\n", "YAML tags", QUICK),
    ("impossible-date", HEAD + "spec: {mode: 2024-13-45}\n", "month must be in 1..12", QUICK),
    ("unhashable-key", HEAD + "spec:\n  ? [a, b]\n  : c\n", "unhashable key", QUICK),
    ("nul-byte", HEAD + "spec: {mode: warn\0}\n", "special characters", QUICK),
    ("tenants-as-mapping", HEAD + "spec:\n  tenants: {name: a}\n", "spec.tenants", QUICK),
    ("quota-gpus-as-text", HEAD + "spec:\n  tenants:\n    - name: a\n      namespaces: [a]\n"
     "      quota: {gpus: lots}\n", "spec.tenants[0].quota.gpus", QUICK),
    ("quota-gpus-nan", HEAD + "spec:\n  tenants:\n    - name: a\n      namespaces: [a]\n"
     "      quota: {gpus: .nan}\n", "spec.tenants[0].quota.gpus", QUICK),
    ("quota-gpus-inf", HEAD + "spec:\n  tenants:\n    - name: a\n      namespaces: [a]\n"
     "      quota: {gpus: .inf}\n", "spec.tenants[0].quota.gpus", QUICK),
    ("quota-as-list", HEAD + "spec:\n  tenants:\n    - name: a\n      namespaces: [a]\n"
     "      quota: [1]\n", "spec.tenants[0].quota", QUICK),
    ("namespaces-as-string", HEAD + "spec:\n  tenants:\n    - name: a\n      namespaces: a\n",
     "spec.tenants[0].namespaces", QUICK),
    ("unknown-fields", HEAD + "spec:\n  tennants: []\n  mode: enforce\n", "unknown field",
     QUICK),
    ("unknown-top-level", HEAD + "spec: {}\nstatus: {}\n", "unknown field 'status'", QUICK),
    ("huge-name", HEAD.replace("name: hostile", "name: " + "a" * 500_000) + "spec: {}\n",
     "metadata.name", QUICK),
    # Over the tenant cap (the schema's max_length) but under the size cap: the YAML
    # parse of ~330 KB is what takes time, in pure Python.
    ("10k-tenants", _tenants(10_000), "spec.tenants: must have at most 4096 items",
     SLOW_BUT_BOUNDED),
    ("100k-tenants", _tenants(100_000), f"larger than {MAX_POLICY_BYTES} bytes", QUICK),
    ("10mb-file", HEAD + "spec: {}\n" + "#" * (10 * 1024 * 1024), "larger than", QUICK),
    ("not-utf8", HEAD.encode() + b"spec: {mode: \xff\xfe}\n", "not UTF-8", QUICK),
]


@pytest.mark.parametrize(("text", "message", "limit"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_hostile_policy_is_a_clear_error_quickly(tmp_path: Path, text: str | bytes,
                                                 message: str, limit: float) -> None:
    path = tmp_path / "policy.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    started = time.monotonic()
    with pytest.raises(PolicyError) as caught:
        load_file(path)
    elapsed = time.monotonic() - started
    assert message in str(caught.value), str(caught.value)[:500]
    assert str(caught.value).startswith(str(path))
    assert elapsed < limit, f"took {elapsed:.1f} s"


@pytest.mark.parametrize("name", ["deep-flow-100k", "python-object-tag", "impossible-date"])
def test_policy_check_reports_it_without_a_traceback(tmp_path: Path, name: str) -> None:
    text = next(c[1] for c in CASES if c[0] == name)
    path = tmp_path / "policy.yaml"
    path.write_text(text if isinstance(text, str) else text.decode())
    done = subprocess.run([console_script(), "policy", "check", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stdout + done.stderr
    assert str(path) in done.stdout + done.stderr
