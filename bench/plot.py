"""Latency percentiles of the webhook and the baseline at the same fixed offered load,
one panel per endpoint and mix (needs matplotlib: ``pip install -e '.[bench]'``)."""

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
        for who, style in (("baseline", "o--"), ("ours", "s-")):
            ys = [m[who]["fixed_latency_us"][p] / 1000 for p in PERCENTILES]
            label = "bare ASGI baseline" if who == "baseline" else "gpu-webhook"
            ax.plot(PERCENTILES, ys, style, label=label)
        ax.set_title(f"{name} @ {m['offered_rps']} req/s\n"
                     f"throughput ratio {m['throughput_ratio']:.2f}", fontsize=9)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("percentile")
    axes[0][0].set_ylabel("latency (ms, log)")
    axes[0][0].legend(fontsize=8)
    m = res["machine"]
    fig.suptitle(f"gpu-webhook vs bare ASGI, HTTPS keep-alive, 1 worker, "
                 f"half the baseline's max load ({m['nproc']} CPUs, Python {m['python']})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
