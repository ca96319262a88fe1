"""Long-lived objects kept out of the garbage collector's way.

CPython's full collection (generation 2) walks every object the collector tracks, in one
stop of the whole process: the modules, the kubernetes client's model classes, the
compiled policy, the watch caches. Under admission load the webhook makes and drops
objects quickly, and a full collection comes every few seconds: in ``bench.run``'s
realistic mix 27 of them in one run, 41-69 ms each, during which no review is answered
(the mix's p99 was 40-50 ms while its p50 was 0.8 ms).

``gc.freeze()`` moves every object alive now into a permanent generation that
collections never walk. The webhook settles (collects, then freezes) once it has started
and again when its caches have first listed the cluster, so a full collection walks
only what was made since. A frozen object that is later dropped is still freed by
reference counting; only one caught in a reference cycle would stay, so the heap is
settled afresh (unfrozen, collected, frozen) when a new policy is served, the one large
structure that is replaced while the webhook runs.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable

from webhook.libs import logs

_lock = threading.Lock()  # policy reloads call from their thread, start-up from the loop
# The count at the last settle. gc.get_freeze_count() walks the whole permanent
# generation (CPython keeps it as a list): a few milliseconds of the event loop at each
# metrics scrape for a number that only a settle changes.
_frozen = 0


def settle(why: str) -> int:
    """Collect, then freeze what is left; the number of frozen objects."""
    global _frozen
    with _lock:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        frozen = _frozen = gc.get_freeze_count()
    logs.event("heap settled: long-lived objects frozen out of garbage collection",
               reason=why, frozen_objects=frozen)
    return frozen


async def settle_when(ready: Callable[[], bool], why: str, poll: float = 0.5) -> None:
    """Settle once ``ready()`` (the caches' first list) is true."""
    while not ready():
        await asyncio.sleep(poll)
    settle(why)


def resettle_for_policy() -> None:
    """A new policy is served: the old one may be held only by cycles among frozen
    objects; unfreezing lets the collection free it."""
    settle("policy reloaded")


def frozen() -> int:
    """Objects frozen at the last settle (what ``gpu_webhook_heap_frozen_objects`` shows)."""
    return _frozen
