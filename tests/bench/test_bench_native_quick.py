"""``python -m bench.native --quick``: the admission-mode benchmark through a real
kube-apiserver installs each condition it promises (a plain pod voided by the API
server's policy alone, the webhooks each mode calls and no others) and writes what
bench/README.md reads. Not how fast anything is: timings on a shared CI machine prove
nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a control plane, two servers, twenty short load runs (~1 min)
def test_quick_native_bench_measures_every_mode(tmp_path: Path) -> None:
    out = tmp_path / "native.json"
    proc = subprocess.run([sys.executable, "-m", "bench.native", "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["apiserver_version"] == "v1.37.2"
    assert set(res["summary"]) == {"plain x1", "plain x8", "gpu x1", "gpu x8"}
    for row in res["summary"].values():
        assert set(row) >= {"none", "native-alone", "nothing", "webhook", "native", "ratio"}
        # A ratio, or None where its reference added nothing measurable in a 1 s run.
        assert row["ratio"]["value"] is None or row["ratio"]["value"] > 0
    for run in res["runs"]:
        # Every request answered: created (dry run) or refused by a rule, never an error.
        assert set(run["statuses"]) <= {"201", "403"}, run
        assert run["pods"] > 0
        if run["condition"] in ("webhook", "native"):
            assert run["webhook_cpu_ms_per_pod"] >= 0
    assert "native / native-alone" in proc.stdout and "native / nothing" in proc.stdout
