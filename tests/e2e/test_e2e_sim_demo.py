"""``make demo`` as a newcomer runs it: ``tools/demo.py`` starts its own simulated GPU
cluster, applies its scripted workloads, checks each outcome (exit 1 otherwise), prints
the table, and leaves the cluster up until ``tools/demo.py down`` (``make demo-down``)
stops every process it left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from controlplane.cluster import build_binaries

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tools" / "demo.py"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie left for init to reap counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def test_make_demo_runs_every_scripted_workload_as_expected_and_demo_down_stops_it(
    tmp_path: Path,
) -> None:
    build_binaries()  # the cached binaries, built first if need be
    work = tmp_path / "demo"
    # A wide terminal: one line per table row.
    env = {**os.environ, "COLUMNS": "400"}
    demo = subprocess.run([sys.executable, str(DEMO), "--work-dir", str(work)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    state = work / "demo.json"
    try:
        assert demo.returncode == 0, demo.stdout + demo.stderr
        out = demo.stdout
        assert "12 of 12 workloads behaved as expected" in out
        rows = {line.split()[0]: line for line in out.splitlines()
                if line.split() and "/" in line.split()[0] and line.count("  ") > 3}
        assert "NVIDIA-H100-80GB-HBM3" in rows["research/pod/trainer-h100"]
        assert "rack-b" in rows["vision/job/resnet"]
        assert "l4-shared-0" in rows["inference/deployment/chat"]
        assert "DENIED at apply: job gang/allreduce" in rows["gang/job/allreduce"]
        assert "untolerated taint" in rows["sim-exempt/pod/no-webhook"]
        assert "Stop it: make demo-down" in out

        # What it left up is a cluster to play with.
        info = json.loads(state.read_text())
        nodes = subprocess.run(
            [str(build_binaries() / "kubectl"), f"--kubeconfig={info['kubeconfig']}",
             "get", "nodes", "-o", "name"],
            capture_output=True, text=True, timeout=60, check=True).stdout.split()
        assert len(nodes) == 16
        assert set(info["pids"]) == {"etcd", "kube-apiserver", "kube-scheduler",
                                     "kube-controller-manager", "kwok", "gpu-webhook-0"}
    finally:
        pids = json.loads(state.read_text())["pids"] if state.exists() else {}
        down = subprocess.run([sys.executable, str(DEMO), "down", "--work-dir", str(work)],
                              capture_output=True, text=True, timeout=180, check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    assert pids and not [name for name, pid in pids.items() if alive(pid)]
    assert not work.exists()
