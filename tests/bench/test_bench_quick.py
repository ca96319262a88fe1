"""``make bench-quick`` runs every part of the benchmark and records each in its JSON.

This checks that the benchmark runs (servers start, wrk drives them, every section is
written), not how fast anything is: timings on a shared CI machine prove nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # every part of the benchmark, briefly
def test_quick_bench_writes_every_section(tmp_path: Path) -> None:
    # A missing load generator fails the test, never skips it: a skipped benchmark
    # check would pass CI with the benchmark broken.
    assert shutil.which("wrk"), ("wrk, the load generator, is not installed "
                                 "(`make install` as root, or apt-get install wrk)")
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "latest.json").read_text())
    assert res["errors"] == {}
    assert {"machine", "core", "app", "quota", "watch", "store", "http", "verdicts"
            } <= res.keys()
    assert {"mutate:gpu-needs-mutation", "mutate:non-gpu", "validate:gpu-quota-dryrun",
            "parse-only"} <= res["core"].keys()
    assert set(res["quota"]["sizes"]) == {"1000", "100000"}
    assert set(res["watch"]["sizes"]) == {"0", "50000"} and res["watch"]["ratio"] > 0
    assert res["store"]["pods"] == 100_000
    mixes = res["http"]["mixes"]
    assert set(mixes) == {"mutate/gpu", "mutate/all", "validate/gpu", "validate/all",
                          "realistic"}
    for m in mixes.values():
        assert m["cpu_us_per_request"]["ours"] > 0 and m["cpu_ratio"] > 0
        # The baseline was also paced at the webhook's own maximum rate.
        assert m["cpu_us_per_request"]["baseline_at_ours_rate"] > 0
        assert len(m["baseline"]["runs"]["matched"]) == res["http"]["rounds"]
        for who in ("ours", "baseline"):
            assert m[who]["max_rps"] > 0
            assert m[who]["fixed_latency_us"]["p99"] > 0
            assert m[who]["own_latency_us"]["p99"] > 0
    if res.get("plot"):  # matplotlib is optional (the bench extra)
        assert Path(res["plot"]).stat().st_size > 0
    assert "targets:" in proc.stdout
