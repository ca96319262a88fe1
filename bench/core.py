"""In-process costs: the pure core per review, the quota check against stores of
1,000 and 100,000 GPU pods, a pod's watch events with and without 50,000 pods ended
before it, and the memory the store takes.

Times are medians of ``timeit.repeat`` runs (the minimum would flatter, the mean is
pulled up by the other engineers' jobs on a shared machine), timed with the process's
CPU clock: time spent waiting for a CPU that another job holds is not the code's cost.
"""

from __future__ import annotations

import gc
import resource
import statistics
import time
import timeit
import tracemalloc
from collections.abc import Callable
from typing import Any

from bench import mix
from bench.population import NAMESPACES, population
from webhook.engine.cost import Ask, Cost
from webhook.engine.decision import Checker
from webhook.engine.validate import OWNED
from webhook.k8s.review import parse_review
from webhook.quota.check import check_pod
from webhook.quota.store import MemoryStore

GPU = "nvidia.com/gpu"


def per_call_us(fn: Callable[[], object], seconds: float, repeat: int = 7) -> dict[str, float]:
    """Median and spread of ``fn``'s cost in microseconds, ``repeat`` runs of about
    ``seconds / repeat`` each."""
    fn()
    clock = time.process_time
    number, t = 1, 0.0
    while t < 0.02:  # calibrate: one run of at least 20 ms
        number *= 2
        t = timeit.timeit(fn, number=number, timer=clock)
    number = max(1, int(number * (seconds / repeat) / t))
    runs = [r / number * 1e6
            for r in timeit.repeat(fn, number=number, repeat=repeat, timer=clock)]
    return {"median_us": round(statistics.median(runs), 2), "min_us": round(min(runs), 2),
            "max_us": round(max(runs), 2), "calls": number * repeat}


def store_of(n: int, **kw: Any) -> MemoryStore:
    s = MemoryStore()
    s.load(population(n, **kw))
    return s


def reviews(seconds: float) -> dict[str, Any]:
    """Per review: parse + engine + reply, what the hot path does minus ASGI, metrics
    and the decision log (those are in the HTTP numbers)."""
    store = store_of(1000)
    mix.check(store)
    out: dict[str, Any] = {}
    per = seconds / len(mix.items())
    for key, item in mix.items().items():
        out[key] = per_call_us(lambda item=item: mix.decide(item, store), per)  # type: ignore[misc]
    body = mix.items()["mutate:gpu-needs-mutation"].body
    out["parse-only"] = per_call_us(lambda: parse_review(body), per)
    return out


def _quota_case(store: MemoryStore, gpus: float) -> Callable[[], bool]:
    policy = mix.policy()
    tenant = policy.by_name["research"]
    ask = Ask(tenant="research", namespace="research", cost=Cost("a100", {GPU: gpus}, gpus),
              pods=1, is_pod=True, pods_added=1, kind="Pod")

    def run() -> bool:
        check = Checker(policy, tenant, "pod research/x", OWNED)
        return check_pod(check, tenant, ask, store.view())

    return run


def quota(seconds: float, sizes: tuple[int, ...] = (1_000, 100_000)) -> dict[str, Any]:
    """The quota check (``check_pod`` on a fresh store view, as the validating webhook
    runs it for a dry run and inside the reservation) at each store size. "allowed" is
    the common case; "denied" builds the message, which ranks the tenant's biggest
    owners, with the tenant holding 1% of all pods as separate owners."""
    out: dict[str, Any] = {"namespaces": NAMESPACES, "sizes": {}}
    per = seconds / (2 * len(sizes))
    for n in sizes:
        allowed = store_of(n)
        assert _quota_case(allowed, 2)()
        denied = store_of(n, focus="research", focus_share=0.01)
        assert not _quota_case(denied, 40)()
        out["sizes"][str(n)] = {
            "allowed": per_call_us(_quota_case(allowed, 2), per),
            "denied": per_call_us(_quota_case(denied, 40), per),
        }
        del allowed, denied
        gc.collect()
    lo, hi = (out["sizes"][str(n)] for n in (sizes[0], sizes[-1]))
    out["ratio"] = {k: round(hi[k]["median_us"] / lo[k]["median_us"], 2) for k in lo}
    return out


def _watched_pod(i: int) -> dict[str, Any]:
    """A GPU pod of the mix as the pod watch shows it: admitted, uid set, bound."""
    pod = mix.mutated(mix.pod(f"trainer-{i}", "research", {GPU: 2}))
    pod["metadata"].update(uid=f"uid-{i}", resourceVersion=str(i))
    pod["spec"]["nodeName"] = "gpu-node-0"
    return pod


def watch(seconds: float, ended: tuple[int, ...] = (0, 50_000)) -> dict[str, Any]:
    """One GPU pod's life as the pod watch delivers it (ADDED, MODIFIED to Succeeded,
    DELETED: what a Job's pod sends), applied to the cluster cache
    (``ClusterState.pod_event``, on the event loop of every replica), with ``ended``
    pods ended within the tombstone window before it: a busy cluster ends thousands."""
    from webhook.quota.cache import ClusterState

    policy = mix.policy()
    out: dict[str, Any] = {"sizes": {}}
    for n in ended:
        state = ClusterState(lambda: policy)
        state.pod_event("SYNCED", {})
        state.namespace_event("SYNCED", {})
        for i in range(n):
            state.pod_event("DELETED", _watched_pod(i))
        alive = _watched_pod(n)
        done = _watched_pod(n)
        done["status"] = {"phase": "Succeeded"}

        def life(state: ClusterState = state, alive: dict[str, Any] = alive,
                 done: dict[str, Any] = done) -> None:
            state.pod_event("ADDED", alive)
            state.pod_event("MODIFIED", done)
            state.pod_event("DELETED", done)

        out["sizes"][str(n)] = per_call_us(life, seconds / len(ended))
    lo, hi = (out["sizes"][str(n)]["median_us"] for n in (ended[0], ended[-1]))
    out["ratio"] = round(hi / lo, 2)
    return out


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def store_memory(n: int = 100_000) -> dict[str, Any]:
    """Memory held by a MemoryStore of ``n`` pods: RSS growth while building it, and
    the bytes tracemalloc attributes to it (the exact figure; RSS includes allocator
    slack and is what a container limit sees)."""
    gc.collect()
    before = _rss_bytes()
    store = store_of(n)
    gc.collect()
    rss = _rss_bytes() - before
    del store
    gc.collect()
    tracemalloc.start()
    store = store_of(n)
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"pods": len(store.pods), "namespaces": NAMESPACES,
            "rss_delta_mb": round(rss / 2**20, 1), "traced_mb": round(traced / 2**20, 1)}


def app(seconds: float, keys: tuple[str, ...] = (
        "mutate:gpu-needs-mutation", "mutate:gpu-already-correct", "mutate:non-gpu",
        "validate:gpu-quota-dryrun")) -> dict[str, Any]:
    """The served app's per-review cost without the network: ``AdmissionApp`` called as
    ASGI with the decision log on (info, as served; written to /dev/null) and off
    (warning). Against ``reviews`` this shows what metrics, the decision log and the
    ASGI plumbing add to the pure core."""
    import asyncio
    import logging
    import os

    from webhook.libs import logs
    from webhook.server.sources.reload import PolicySource
    from webhook.server.web.app import AdmissionApp, Runtime

    source = PolicySource(str(mix.POLICY))
    source.load()
    served = AdmissionApp(Runtime(policy=source, store=store_of(1000)))
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    sink = open(os.devnull, "w")  # noqa: SIM115 - closed below, after the handler goes
    out: dict[str, Any] = {}
    try:
        for level in ("info", "warning"):
            logs.setup(level)
            root.handlers[0].setStream(sink)  # type: ignore[attr-defined]
            for key in keys:
                item = mix.items()[key]
                scope = {"type": "http", "method": "POST", "path": item.path, "headers": [],
                         "query_string": b""}
                message = {"type": "http.request", "body": item.body, "more_body": False}

                async def receive(message: dict[str, Any] = message) -> dict[str, Any]:
                    return message

                async def send(_: Any) -> None:
                    return None

                async def batch(k: int, scope: dict[str, Any] = scope,
                                receive: Any = receive) -> None:
                    for _ in range(k):
                        await served(scope, receive, send)

                loop = asyncio.new_event_loop()
                try:
                    out[f"{key} (log {level})"] = per_call_us(
                        lambda loop=loop, batch=batch: loop.run_until_complete(  # type: ignore[misc]
                            batch(100)), seconds / (2 * len(keys)))
                finally:
                    loop.close()
                r = out[f"{key} (log {level})"]  # per batch of 100 -> per review
                for k in ("median_us", "min_us", "max_us"):
                    r[k] = round(r[k] / 100, 2)
                r["calls"] *= 100
    finally:
        root.handlers[:], root.level = saved
        sink.close()
    return out
