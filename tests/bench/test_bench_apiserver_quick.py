"""``python -m bench.apiserver --quick``: the admission benchmark through a real
kube-apiserver runs every condition it promises and writes what bench/README.md reads.

It checks that the benchmark works (the control plane starts, each condition's webhooks
are the ones a pod creation calls, clients create pods in dry-run and real runs, the
API server's admission metric is read), not how fast anything is: timings on a shared
CI machine prove nothing. Kyverno is not part of the quick run (CI does not build it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a control plane, two webhook servers and a dozen short load runs
def test_quick_apiserver_bench_measures_every_condition(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.apiserver", "--quick",
                           "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "apiserver.json").read_text())
    assert res["apiserver_version"] == "v1.37.2"
    assert res["conditions"] == ["none", "nothing", "patching", "ours"]
    seen = {(r["condition"], r["mode"], r["clients"]) for r in res["runs"]}
    assert seen == {(c, m, n) for c in ("none", "nothing", "patching", "ours")
                    for m in ("dry-run", "real") for n in (1, 8)}
    for r in res["runs"]:
        assert r["requests"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0
        # Every kind of pod in the mix was sent; only the denied ones may be refused,
        # and only where a webhook judges them.
        assert {"replicaset", "job", "unique", "non-gpu", "non-gpu-tolerating",
                "denied"} <= r["by_kind_p50_ms"].keys() or r["requests"] < 40
        assert set(r["statuses"]) <= {"201", "403"}
        calls = r["apiserver"]["calls"]
        if r["condition"] == "none":
            assert calls == 0  # no webhook was called
        else:
            assert calls > 0 and r["apiserver"]["mean_ms"] > 0
            if r["condition"] == "ours" and r["requests"] >= 40:
                assert "403" in r["statuses"]  # our policy denied the too-big pods
        # Ours' own histogram and its phases: the parse and the pipeline within its
        # whole time, and the ledger's commit in real runs only (a dry run commits none).
        phases = r["ours_phases"]
        if r["condition"] != "ours":
            assert not phases  # not a gpu-webhook: no histogram of its own
            continue
        v = phases["validate"]
        assert v["reviews"] > 0 and v["p99_ms"] >= v["p50_ms"] > 0
        assert v["parse_ms"] > 0 and v["parse_ms"] + v["decide_ms"] <= v["mean_ms"] + 0.01
        assert (v["ledger_writes"] > 0) == (r["mode"] == "real"), v
        assert v["engine_ms"] + v["commit_ms"] <= v["decide_ms"] + 0.01
        assert v["queued_ms"] <= v["commit_ms"]
        if r["mode"] == "real":
            assert v["admissions_per_write"] >= 1 and v["per_write_write_ms"] > 0
    for load in ("dry-run/1", "dry-run/8", "real/1", "real/8"):
        entry = res["summary"][load]
        assert {"added_p50_ms", "added_p99_ms", "apiserver_mean_ms_per_call"} \
            <= entry["ours"].keys()
        assert {"ours/nothing_p50", "ours/patching_p50", "patching/nothing_p50"} <= entry.keys()
    # What one ledger commit costs alone: an empty ledger, and the biggest ours' real
    # runs left (every GPU pod it admitted in the last TTL).
    empty, biggest = res["ledger_write"]
    assert empty["entries"] == 0 and biggest["entries"] > 0
    assert biggest["bytes"] > empty["bytes"]
    assert all(w["p99_ms"] >= w["p50_ms"] > 0 for w in (empty, biggest))
    assert any(n > 0 for r in res["runs"] for n in r["ledger_entries"].values())
    assert "| dry-run/8 |" in proc.stdout and "targets:" in proc.stdout
    assert "where a review's time goes" in proc.stdout
    assert "| real/8 | ours | validate |" in proc.stdout
    assert "one ledger commit alone" in proc.stdout
