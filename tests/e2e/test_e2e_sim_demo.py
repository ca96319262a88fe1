"""``make demo`` as a newcomer runs it: the README's "After `make demo`" block, pasted
(tests/readmekit.py): ``make demo`` starts its own simulated GPU cluster with the webhook
installed as on a real one (CRDs, the policy ConfigMap, the leader writing GPUQuota
objects and PolicyReports), applies its scripted workloads, checks each outcome (exit 1
otherwise) and prints the table; then the block's ``status``, ``kubectl get gpuquotas``,
``audit`` and ``kubectl get policyreports`` print what it shows, and ``make demo-down``
stops every process the demo left.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import readmekit
from controlplane.cluster import build_binaries

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("make") is None, reason="no make")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie left for init to reap counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def after_make_demo() -> str:
    return readmekit.block("A five-minute tour", after="### After `make demo`")


def test_make_demo_runs_every_scripted_workload_and_the_readme_commands_after_it(
    tmp_path: Path,
) -> None:
    build_binaries()  # the cached binaries, built first if need be
    text = after_make_demo()
    assert text.startswith("make demo ") and text.rstrip().endswith("# stop the cluster")
    tree = readmekit.clone(tmp_path)
    # The demo's directory under $TMPDIR, as the block's `. ${TMPDIR:-/tmp}/...` reads it;
    # a wide terminal: one line per table row.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = readmekit.user_env(tmp_path, TMPDIR=str(tmp), COLUMNS="400")
    work = tmp / "gpu-webhook-demo"
    try:
        done = readmekit.run(tree, text, env, timeout=900)
    finally:
        if (work / "demo.json").exists():  # the block failed before its make demo-down
            readmekit.run(tree, "make demo-down\n", env, timeout=180)
    out = done.stdout
    assert "15 of 15 workloads behaved as expected" in out, out + done.stderr
    rows = {line.split()[0]: line for line in out.splitlines()
            if line.split() and "/" in line.split()[0] and line.count("  ") > 3}
    assert "NVIDIA-H100-80GB-HBM3" in rows["research/pod/trainer-h100"]
    assert "rack-b" in rows["vision/job/resnet"]
    assert "l4-shared-0" in rows["inference/deployment/chat"]
    assert "DENIED at apply: job gang/allreduce" in rows["gang/job/allreduce"]
    assert "WAITED (pod event): waiting for GPU quota" in out  # then released, and run
    assert "untolerated taint" in rows["sim-exempt/pod/no-webhook"]
    assert "Stop it: make demo-down" in out

    # The block's commands on the cluster it left: each found, each printing what the
    # README shows (the status table, the GPUQuota row, the audit, the PolicyReport).
    assert not re.search(r"command not found|No such file or directory|error:",
                         done.stderr), done.stderr
    assert not readmekit.missing(readmekit.shown(text), out), out + done.stderr
    # The candidate's audit: pods admitted in the same second are decided in either
    # order, so which of them and how many go over the lowered cap varies.
    assert re.search(r"\b[1-9]\d* would be refused", done.stderr), done.stderr

    # make demo-down stopped everything the demo left running.
    [kill] = re.findall(r"\(or: kill ([\d ]+)\)", out)
    pids = [int(p) for p in kill.split()]
    # etcd, kube-apiserver, scheduler, controller-manager, kwok, the webhook and the policy
    # ConfigMap's mount (what the kubelet would do for the webhook's pod)
    assert len(pids) == 7
    assert not [pid for pid in pids if alive(pid)]
    assert not work.exists()
