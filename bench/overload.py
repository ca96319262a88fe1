"""What the webhook does at the edge: GPU pod creations arriving faster than it answers.

    .venv/bin/python -m bench.overload                  # ~2 min
    .venv/bin/python -m bench.overload --factor 4 --seconds 20

A real etcd + kube-apiserver and ``gpu-webhook serve`` connected to them, installed as
``bench.apiserver`` installs it (the same policy, mix and configurations: failurePolicy
Fail, ``timeoutSeconds`` as rendered), and real (not dry-run) creations from the
realistic mix:

1. **sustained**: 8 clients in a closed loop for ``--seconds``: the rate R the machine
   answers (every answer counts, admitted or refused);
2. **overload**: an open loop at ``--factor`` x R for ``--seconds``: each request is
   sent at its scheduled time from a pool of connections, whatever became of the ones
   before it, so the load does not ease off as answers slow down (a closed loop would).
   A request's latency is counted from its scheduled time.

Every answer is classified from what the client gets back: ``admitted`` (201),
``refused`` (403, the policy's own answer), ``unavailable`` (403: the quota
commit did not finish within the review's deadline, refused in the policy's words),
``shed`` (the webhook answered 429 or 503
and the API server applied the failurePolicy: the message names the webhook and the
webhook's reason), ``timeout`` (the API server gave up on the webhook:
``context deadline exceeded``), ``apiserver-busy`` (the API server's own 429), ``other``.
The webhook's own overload counter (``gpu_webhook_overload_refusals_total``) is read before and
after. Results: a table on stdout and ``bench/results/overload.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.apiserver import (
    LEDGER_NAMESPACE,
    RESULTS,
    TENANTS,
    Client,
    Conditions,
    Item,
    _kubectl,
    delete_pods,
    items,
    load,
    pct,
)
from bench.scale import Samples, total

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
from controlplane.cluster import ControlPlane, build_binaries

CLASSES = ("admitted", "refused", "unavailable", "shed", "timeout", "apiserver-busy",
           "other")


def classify(status: int, body: bytes) -> str:
    """What became of one creation, from the API server's answer."""
    text = body.decode(errors="replace")
    if status == 201:
        return "admitted"
    if status == 403:
        # Refused by the quota step for want of a commit in time (the ledger's API server
        # as loaded as the rest), or by the policy itself.
        return "unavailable" if "quota ledger cannot be reached" in text else "refused"
    if status == 429:
        return "apiserver-busy"
    if "deadline exceeded" in text or "Timeout" in text or "timed out" in text:
        return "timeout"
    if "failed calling webhook" in text and ("overloaded" in text or "429" in text
                                            or "503" in text or "too many" in text):
        return "shed"
    return "other"


def open_loop(cp: ControlPlane, mixed: list[Item], rate: float, seconds: float,
              pool: int = 96) -> dict[str, Any]:
    """Creations sent at ``rate`` per second for ``seconds``, each at its own time."""
    local = threading.local()
    lock = threading.Lock()
    latencies: list[float] = []  # from its scheduled time
    answered: list[float] = []  # from its sending: what the API server took
    late: list[float] = []  # how long past its time a request was sent (client lag)
    counts = dict.fromkeys(CLASSES, 0)
    samples: dict[str, str] = {}
    conns: list[Client] = []

    def send(n: int, due: float) -> None:
        c = getattr(local, "client", None)
        if c is None:
            c = local.client = Client(cp)
            with lock:
                conns.append(c)
        item = mixed[n % len(mixed)]
        started = time.monotonic()
        try:
            status, body = c.request("POST", f"/api/v1/namespaces/bench-{item.tenant}/pods",
                                     item.body(n))
        except Exception as exc:  # counted, never a hole in the data
            status, body = 0, f"{type(exc).__name__}: {exc}".encode()
        done = time.monotonic()
        what = classify(status, body)
        with lock:
            counts[what] += 1
            latencies.append(done - due)
            answered.append(done - started)
            late.append(started - due)
            samples.setdefault(what, f"{status} {body[:300]!r}")

    t0 = time.monotonic()
    n = 0
    with ThreadPoolExecutor(pool) as ex:
        while True:
            due = t0 + n / rate
            if due >= t0 + seconds:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            ex.submit(send, n, due)
            n += 1
    for c in conns:
        c.close()
    elapsed = time.monotonic() - t0
    return {"rate": rate, "sent": n, "seconds": round(elapsed, 1), "counts": counts,
            "p50_ms": round(pct(latencies, 0.5) * 1000, 1),
            "p99_ms": round(pct(latencies, 0.99) * 1000, 1),
            "answer_p50_ms": round(pct(answered, 0.5) * 1000, 1),
            "answer_p99_ms": round(pct(answered, 0.99) * 1000, 1),
            "late_p99_ms": round(pct(late, 0.99) * 1000, 1), "pool": pool,
            "samples": samples}


def shed_counts(conds: Conditions, before: Samples) -> dict[str, float]:
    """The webhook's own refusals for load between ``before`` and now, by reason."""
    after = conds.samples("ours") or []
    name = "gpu_webhook_overload_refusals_total"
    out = {reason: total(after, name, reason=reason) - total(before, name, reason=reason)
           for reason in ("inflight", "deadline", "body-timeout")}
    late = "gpu_webhook_admission_late_answers_total"
    out["late"] = total(after, late) - total(before, late)  # past the API server's timeout
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.overload", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="per phase")
    p.add_argument("--factor", type=float, default=4.0, help="overload rate / sustained rate")
    p.add_argument("--clients", type=int, default=8, help="closed-loop clients (sustained)")
    p.add_argument("--pool", type=int, default=384,
                   help="connections of the open loop: requests in flight at once, at most "
                        "(above the webhook's --max-inflight 256, so that it can be reached)")
    p.add_argument("--out", type=Path, default=RESULTS)
    opts = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="gpu-webhook-bench-overload-"))
    res: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "load_average": os.getloadavg(), "cpus": os.cpu_count(),
                           "factor": opts.factor}
    cp = ControlPlane(build_binaries(), work / "cp")
    conds: Conditions | None = None
    try:
        cp.start()
        for ns in [LEDGER_NAMESPACE] + [f"bench-{t}" for t in TENANTS]:
            _kubectl(cp, "create", "namespace", ns)
        conds = Conditions(cp, work, None)
        conds.start(["ours"])
        conds.install("ours")
        mixed = items()
        load(cp, mixed, opts.clients, 2.0, False)  # warm-up, not measured
        delete_pods(cp)
        run = load(cp, mixed, opts.clients, opts.seconds, False)
        rate = len(run.latencies) / run.seconds
        res["sustained"] = {"clients": opts.clients, "rate": round(rate, 1),
                            "p50_ms": round(pct(run.latencies, 0.5) * 1000, 1),
                            "p99_ms": round(pct(run.latencies, 0.99) * 1000, 1)}
        delete_pods(cp)
        before = conds.samples("ours") or []
        res["overload"] = open_loop(cp, mixed, rate * opts.factor, opts.seconds, opts.pool)
        res["overload"]["webhook_shed"] = shed_counts(conds, before)
        delete_pods(cp)
    finally:
        if conds is not None:
            conds.stop()
        cp.stop()
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "overload.json").write_text(json.dumps(res, indent=1))
    s, o = res["sustained"], res["overload"]
    print(f"sustained: {s['rate']} creations/s ({s['clients']} clients, closed loop), "
          f"p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms")
    print(f"overload: {o['rate']:.1f}/s scheduled ({opts.factor:g}x) for {o['seconds']} s, "
          f"{o['sent']} sent ({o['sent'] / o['seconds']:.1f}/s; client lag p99 "
          f"{o['late_p99_ms']} ms), {o['pool']} connections; from its scheduled time p50 "
          f"{o['p50_ms']} ms, p99 {o['p99_ms']} ms; from its sending p50 "
          f"{o['answer_p50_ms']} ms, p99 {o['answer_p99_ms']} ms")
    print("  " + ", ".join(f"{k} {v}" for k, v in o["counts"].items()))
    print("  the webhook's own sheds (and answers past the API server's timeout): " + ", ".join(
        f"{k} {v:g}" for k, v in o["webhook_shed"].items()))
    for what, sample in o["samples"].items():
        if what not in ("admitted", "refused"):
            print(f"  {what}: {sample}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
