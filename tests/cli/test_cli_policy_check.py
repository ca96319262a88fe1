"""``gpu-webhook policy check FILE...``: what a platform engineer sees in CI.

Good files print ``ok`` and exit 0; a bad file exits 1 and prints
``file:line: field.path: message`` on stderr for each problem, never a traceback.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

Run = Callable[..., subprocess.CompletedProcess[str]]  # the gpu_webhook fixture

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "policies" / "multi-tenant.yaml").read_text()


def _edit(old: str, new: str) -> str:
    assert EXAMPLE.count(old) == 1, f"{old!r} must occur once in the example policy"
    return EXAMPLE.replace(old, new)


def _line_of(text: str, fragment: str) -> int:
    return text[: text.index(fragment)].count("\n") + 1


# (id, file text, fragment on the expected line, field path, message fragment)
BAD: list[tuple[str, str, str, str, str]] = [
    ("unknown-field", _edit("maxGpusPerPod: 8", "maxGpusPerPods: 8"), "maxGpusPerPods",
     "spec.tenants[0].maxGpusPerPods", "unknown field 'maxGpusPerPods'"),
    ("wrong-type", _edit("gpus: 32", "gpus: lots"), "gpus: lots",
     "spec.tenants[0].quota.gpus", "must be a number (got 'lots')"),
    ("negative-number", _edit("maxGpusPerContainer: 2", "maxGpusPerContainer: -2"),
     "maxGpusPerContainer: -2", "spec.tenants[1].maxGpusPerContainer",
     "must be 0 or more (got -2)"),
    ("unknown-product", _edit("allowedProducts: [l4]", "allowedProducts: [t4]"),
     "allowedProducts: [t4]", "spec.tenants[1].allowedProducts[0]",
     "product 't4' is not defined; add it under spec.products.aliases"),
    ("namespace-in-two-tenants",
     _edit("namespaces: [notebooks]", "namespaces: [notebooks, research-dev]"),
     "namespaces: [notebooks, research-dev]", "spec.tenants[2].namespaces[1]",
     "namespace 'research-dev' already belongs to tenant 'research'"),
    ("bad-mode", _edit("mode: warn ", "mode: warning "), "mode: warning",
     "spec.tenants[2].mode", "'enforce', 'warn' or 'audit'"),
]

# (id, file bytes, line or None, message fragment): problems with the file as a whole.
BAD_FILES: list[tuple[str, bytes, int | None, str]] = [
    ("yaml-syntax", _edit("  tenants:\n", "  tenants: [\n").encode(),
     _line_of(EXAMPLE, "  tenants:\n") + 1, "YAML syntax:"),
    ("yaml-alias",
     b"apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\nmetadata: {name: x}\n"
     b"spec:\n  tenants:\n    - name: a\n      namespaces: &ns [a]\n"
     b"    - name: b\n      namespaces: *ns\n", 9, "YAML aliases (*name) are not allowed"),
    ("empty-file", b"", None, "the file is empty; expected a GPUPolicy document"),
    ("non-utf8", EXAMPLE.replace("shared-gpu-cluster", "caf\xe9").encode("latin-1"), None,
     "not UTF-8 text"),
]


def test_good_file(gpu_webhook: Run) -> None:
    done = gpu_webhook("policy", "check", str(ROOT / "policies" / "multi-tenant.yaml"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(
        "multi-tenant.yaml: ok (policy shared-gpu-cluster, 3 tenants)")
    assert done.stderr == ""


@pytest.mark.parametrize(("text", "fragment", "path", "message"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_bad_field_is_located(gpu_webhook: Run, tmp_path: Path, text: str, fragment: str,
                              path: str, message: str) -> None:
    f = tmp_path / "team-policy.yaml"
    f.write_text(text)
    done = gpu_webhook("policy", "check", "team-policy.yaml")
    assert done.returncode == 1
    assert done.stdout == ""
    first = done.stderr.splitlines()[0]
    line = _line_of(text, fragment)
    assert first.startswith(f"team-policy.yaml:{line}: {path}: "), first
    assert message in first
    assert "1 of 1 policy files invalid" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("content", "line", "message"), [b[1:] for b in BAD_FILES],
                         ids=[b[0] for b in BAD_FILES])
def test_bad_file_is_located(gpu_webhook: Run, tmp_path: Path, content: bytes,
                             line: int | None, message: str) -> None:
    (tmp_path / "p.yaml").write_bytes(content)
    done = gpu_webhook("policy", "check", "p.yaml")
    assert done.returncode == 1
    where = f"p.yaml:{line}: " if line else "p.yaml: "
    first = done.stderr.splitlines()[0]
    assert first.startswith(where), first
    assert message in first
    assert "Traceback" not in done.stderr


def test_missing_file(gpu_webhook: Run) -> None:
    done = gpu_webhook("policy", "check", "no-such-policy.yaml")
    assert done.returncode == 1
    assert "no-such-policy.yaml: cannot read the file: No such file or directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_several_files_report_each(gpu_webhook: Run, tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(EXAMPLE)
    (tmp_path / "typo.yaml").write_text(_edit("maxGpusPerPod: 8", "maxGpusPerPods: 8"))
    (tmp_path / "empty.yaml").write_text("")
    done = gpu_webhook("policy", "check", "good.yaml", "typo.yaml", "empty.yaml", "gone.yaml")
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["good.yaml: ok (policy shared-gpu-cluster, 3 tenants)"]
    named = [m.group(1) for m in re.finditer(r"^([\w.-]+\.yaml)[:]", done.stderr, re.M)]
    assert named == ["typo.yaml", "empty.yaml", "gone.yaml"]
    assert done.stderr.splitlines()[-1] == "3 of 4 policy files invalid"


def test_several_good_files(gpu_webhook: Run, tmp_path: Path) -> None:
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text(EXAMPLE)
    done = gpu_webhook("policy", "check", "a.yaml", "b.yaml")
    assert done.returncode == 0
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["a.yaml", "b.yaml"]


def test_no_file_is_a_usage_error(gpu_webhook: Run) -> None:
    done = gpu_webhook("policy", "check")
    assert done.returncode == 2
    assert "FILE" in done.stderr


def test_one_tenant_is_one_tenant(gpu_webhook: Run, tmp_path: Path) -> None:
    one = tmp_path / "one.yaml"
    one.write_text("apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\n"
                   "metadata: {name: solo}\nspec:\n  tenants:\n"
                   "    - {name: team, namespaces: [team]}\n")
    done = gpu_webhook("policy", "check", str(one))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{one}: ok (policy solo, 1 tenant)"]


def test_admission_mode_says_which_rules_stay_in_the_webhook(gpu_webhook: Run) -> None:
    # With the stateless rules in the API server, what still needs a replica up is said,
    # rule by rule, with its tenants and why (the same lines `manifests` prints).
    from webhook.admission.native.policies import kept
    from webhook.policy.load import load_file

    path = ROOT / "policies" / "multi-tenant.yaml"
    done = gpu_webhook("policy", "check", "--admission-mode", "native", str(path))
    assert done.returncode == 0, done.stderr
    said = [line.split(": stays in the webhook: ", 1)[1] for line in done.stdout.splitlines()
            if ": stays in the webhook: " in line]
    assert said == kept(load_file(path))
    assert "quota (research, inference, notebooks): usage across pods and replicas" in (
        done.stdout)
    # Without the option nothing more is said.
    plain = gpu_webhook("policy", "check", str(path))
    assert "stays in the webhook" not in plain.stdout
