"""The words every family of messages shares: numbers as people write them, lists,
the rule tag a denial ends with, owners of GPUs, counts of pods and GPUs, and the phrases
that must read the same in every message that says them."""

from __future__ import annotations

from collections.abc import Iterable

# What a message says when the mutating webhook would have made the pod right itself: the
# pod came another way (the mutating webhook off, a reinvocation, an UPDATE).
MUTATOR_DOES = "(the mutating webhook does this when it runs)"
# Why spot capacity needs the pod's consent.
RECLAIMED = "spot nodes can be reclaimed at any time"
# The end of a refusal for a fault of ours, not the pod's (an unreachable API server).
PERSISTS = "Retry in a moment; if it persists, tell the platform team"
# Why the webhook refuses, rather than admits, a GPU pod it cannot count.
FAILS_CLOSED = "(the webhook's quota setting fails closed)"


def num(x: float) -> str:
    """A count as people write it: 2 not 2.0, 0.125 kept."""
    if x == int(x):
        return str(int(x))
    return f"{x:.3f}".rstrip("0").rstrip(".")


def one_of(items: Iterable[str]) -> str:
    items = list(items)
    return ", ".join(items) if items else "none"


def tag(rule: str, policy: str, tenant: str | None) -> str:
    return f"[rule {rule}, tenant {tenant}]" if tenant else f"[rule {rule}, policy {policy}]"


def owners(top: Iterable[tuple[str, float]]) -> str:
    return ", ".join(f"{o} {num(n)}" for o, n in top)


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def gpus_of(n: float) -> str:
    return f"{num(n)} GPU" if n == 1 else f"{num(n)} GPUs"
