"""GPU shares asked outside Kubernetes' own types, read from a pod template.

KAI-Scheduler (NVIDIA/KAI-Scheduler, ``pkg/common/constants``; docs/gpu-sharing) takes a
pod's share of a GPU from annotations, the pod asking no GPU resource: ``gpu-fraction``
(0-1 of one device's memory) or ``gpu-memory`` (MiB of one device), on
``gpu-fraction-num-devices`` devices (default 1), given to the container
``gpu-fraction-container-name`` names (default: the first container).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.policy.compiled import CompiledPolicy

GPU_FRACTION = "gpu-fraction"
GPU_MEMORY = "gpu-memory"
NUM_DEVICES = "gpu-fraction-num-devices"
CONTAINER_NAME = "gpu-fraction-container-name"
KAI_ANNOTATIONS = (GPU_FRACTION, GPU_MEMORY)


@dataclass(frozen=True, slots=True)
class KAIAsk:
    """What a template's KAI annotations ask: device-equivalents (at most 1 per device),
    the container given them (None: the first), and what is wrong with them."""

    gpus: float
    container: str | None
    problem: str | None = None


def kai_ask(policy: CompiledPolicy, metadata: Mapping[str, Any] | None) -> KAIAsk | None:
    """The KAI share the template's annotations ask, or None (none asked, or KAI
    fractions off). A value that cannot be read is charged a whole device each, and
    says why, for the validating webhook to refuse it."""
    kai = policy.kai
    annotations = metadata.get("annotations") if metadata else None
    if kai is None or not isinstance(annotations, Mapping):
        return None
    if not any(a in annotations for a in KAI_ANNOTATIONS):
        return None
    container = annotations.get(CONTAINER_NAME)
    container = container if isinstance(container, str) and container else None
    problems: list[str] = []
    shares: list[float] = []
    fraction = annotations.get(GPU_FRACTION)
    if fraction is not None:
        f = _number(fraction)
        if f is None or not 0 < f <= 1:
            problems.append(f"annotation {GPU_FRACTION} {fraction!r} is not a fraction "
                            "of a GPU over 0 and at most 1 (e.g. \"0.5\")")
        else:
            shares.append(f)
    memory = annotations.get(GPU_MEMORY)
    if memory is not None:
        m = _number(memory)
        if m is None or m <= 0 or m != int(m):
            problems.append(f"annotation {GPU_MEMORY} {memory!r} is not a whole number "
                            "of MiB over 0 (e.g. \"20480\")")
        else:
            shares.append(1.0 if kai.device_memory is None else min(1.0, m / kai.device_memory))
    raw_n = annotations.get(NUM_DEVICES)
    n = 1.0
    if raw_n is not None:
        got = _number(raw_n)
        if got is None or got < 1 or got != int(got) or got > 1024:
            problems.append(f"annotation {NUM_DEVICES} {raw_n!r} is not a whole number "
                            "of devices from 1 to 1024")
        else:
            n = got
    share = 1.0 if problems or not shares else max(shares)
    return KAIAsk(share * n, container, "; ".join(problems) or None)


def _number(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        f = float(value)
    except ValueError:
        return None
    return f if math.isfinite(f) else None
