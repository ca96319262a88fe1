"""Latency percentiles of the webhook and the baseline at the same fixed offered load
(half the baseline's max), and of the webhook at half its own max, one panel per
endpoint and mix (needs matplotlib: ``pip install -e '.[bench]'``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or CI
import matplotlib.pyplot as plt

PERCENTILES = ("p50", "p75", "p90", "p99", "p99.9")


def render(res: dict[str, Any], path: Path) -> Path:
    mixes = res["http"]["mixes"]
    fig, axes = plt.subplots(1, len(mixes), figsize=(4 * len(mixes), 3.6), sharey=True,
                             squeeze=False)
    for ax, (name, m) in zip(axes[0], mixes.items(), strict=True):
        over = " (overloaded)" if m["ours"]["fixed_overloaded"] else ""
        series = (
            ("baseline", "fixed_latency_us", "o--", f"baseline @ {m['offered_rps']}/s"),
            ("ours", "fixed_latency_us", "s-", f"gpu-webhook @ {m['offered_rps']}/s{over}"),
            ("ours", "own_latency_us", "^:", f"gpu-webhook @ {m['offered_rps_half_ours']}/s"),
        )
        for who, phase, style, label in series:
            ys = [m[who][phase][p] / 1000 for p in PERCENTILES]
            ax.plot(PERCENTILES, ys, style, label=label)
        ax.legend(fontsize=7)
        ax.set_title(f"{name}: throughput ratio {m['throughput_ratio']:.2f}", fontsize=9)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("percentile")
    axes[0][0].set_ylabel("latency (ms, log)")
    m = res["machine"]
    fig.suptitle(f"latency at half the baseline's max and at half gpu-webhook's max; HTTPS "
                 f"keep-alive, 1 worker ({m['nproc']} CPUs, Python {m['python']})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
