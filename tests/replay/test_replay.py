"""``gpu-webhook review --replay``: recorded AdmissionReviews (tests/fixtures/replay.jsonl,
written by tests/fixtures/replay/make_replay.py) against a candidate policy that flips
known decisions."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
Run = Callable[..., subprocess.CompletedProcess[str]]  # the gpu_webhook fixture (conftest.py)

RECORDED = "tests/fixtures/replay.jsonl"
CANDIDATE = "tests/fixtures/replay-candidate.yaml"


def test_the_fixture_is_what_the_script_writes(tmp_path: Path) -> None:
    fresh = tmp_path / "replay.jsonl"
    subprocess.run([sys.executable, "tests/fixtures/replay/make_replay.py", str(fresh)],
                   cwd=ROOT, check=True, timeout=60)
    assert fresh.read_bytes() == (ROOT / RECORDED).read_bytes()


def test_changed_decisions_are_counted_and_listed(gpu_webhook: Run) -> None:
    r = gpu_webhook("review", "--replay", RECORDED, "--policy", CANDIDATE)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("replayed 7 reviews: baseline the embedded policy "
                          "(shared-gpu-cluster), candidate " + CANDIDATE)
    for line in ("allowed->denied:   1", "denied->allowed:   1", "warnings changed:  1",
                 "patch changed:     2", "unchanged:         2", "unreadable lines:  1"):
        assert f"  {line}\n" in out
    assert "line 1: Pod research/pretrain-0 (CREATE by alice): allowed->denied" in out
    assert "tenant research allows at most 4 GPUs per container" in out
    assert "line 2: Pod research/finetune-0 (CREATE by bob): patch changed" in out
    assert ("patched object: add /spec/affinity/nodeAffinity/requiredDuringScheduling"
            "IgnoredDuringExecution/nodeSelectorTerms/0/matchExpressions/1/values/2 "
            '"rack-c"') in out
    assert "line 3: Pod sandbox/try-0 (CREATE by carol): denied->allowed" in out
    # Recorded reviews carry no namespace labels: the selector tenants cannot be tried.
    assert ('was denied: pod sandbox/try-0: namespace "sandbox" is in no tenant\'s '
            "namespaces, and the webhook does not know its labels") in out
    assert "line 4: not an AdmissionReview, skipped" in out
    assert "line 5: Pod notebooks/nb-dave (CREATE by dave): warnings changed" in out
    assert "- warning: pod notebooks/nb-dave" in out
    assert "line 8: Deployment research/eval (CREATE by alice): patch changed" in out
    # Unchanged reviews get no line of their own.
    assert "nb-erin" not in out and "dcgm-probe" not in out


def test_json_report_and_explicit_baseline(gpu_webhook: Run) -> None:
    r = gpu_webhook("review", "--replay", RECORDED, "--policy", CANDIDATE,
                    "--baseline-policy", "policies/multi-tenant.yaml", "-o", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["counts"] == {"allowed->denied": 1, "denied->allowed": 1,
                                "warnings changed": 1, "patch changed": 2, "unchanged": 2,
                                "unreadable": 1}
    first = report["lines"][0]
    assert first["baseline"]["allowed"] is True and first["candidate"]["allowed"] is False
    assert "max-gpus-per-container" in first["candidate"]["rules"]


def test_the_same_policy_changes_nothing(gpu_webhook: Run) -> None:
    r = gpu_webhook("review", "--replay", RECORDED, "--policy", "policies/multi-tenant.yaml")
    assert r.returncode == 0
    assert "unchanged:         7" in r.stdout
    assert "allowed->denied:   0" in r.stdout


def test_unreadable_input_exits_2(gpu_webhook: Run, tmp_path: Path) -> None:
    missing = gpu_webhook("review", "--replay", str(tmp_path / "nope.jsonl"),
                          "--policy", CANDIDATE)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n")
    r = gpu_webhook("review", "--replay", str(junk), "--policy", CANDIDATE)
    assert r.returncode == 2 and "holds no AdmissionReview" in r.stderr
    no_candidate = gpu_webhook("review", "--replay", RECORDED)
    assert no_candidate.returncode == 2 and "--policy CANDIDATE" in no_candidate.stderr
