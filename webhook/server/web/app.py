"""The HTTPS server the API server calls.

``POST /mutate`` and ``POST /validate`` are answered by a bare ASGI handler: read the
body (capped), parse it with orjson, run the engine, answer. Everything else (health,
readiness, metrics) goes to a small FastAPI app, off the hot path. Framework request
objects and pydantic models would double the cost of a review, and admission latency
is added to every GPU pod creation in the cluster.

Overload. Every admission request has a deadline: ``--request-timeout``, shortened to
80% of the API server's own ``?timeout=``, counted from the request's first byte (the
protocol stamps it, so time spent queued behind other requests counts). And at most
``--max-inflight`` admission requests are handled at once. Past either limit the answer
is an HTTP error, not an AdmissionReview: 429 at once when too many requests are in
flight; 408 when the body does not arrive in time; 503 when a request waited past its
deadline before the engine could run. The API server treats any non-200 answer as a
failed call and applies the webhook's ``failurePolicy``, which is exactly the platform
team's stated choice for "the webhook cannot answer" (Fail: refuse the pod; Ignore:
admit it unchecked). Answering a fail-closed denial instead would override that choice,
and queueing past the deadline would only make the API server give up on its own,
later, with every queued connection still held. None of these carries ``Retry-After``:
the API server's webhook client retries an answer that does, within the same deadline,
so under sustained overload a shed request came back, queued again, and some timed out
("context deadline exceeded") instead of failing at once with the reason (bench.overload,
bench/README.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from webhook.admission.claimreads import ClaimReader, named
from webhook.admission.groups import GroupMembers, GroupReader, no_members
from webhook.admission.webhooks import (
    Cluster,
    Phase,
    WorkloadReader,
    admit,
    reply,
    validating,
)
from webhook.engine.decision import Decision
from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.routes.sights import Sights, no_sights
from webhook.engine.target import NamespaceLabels, no_labels
from webhook.k8s.reply import error_response
from webhook.k8s.review import MAX_BODY_BYTES, AdmissionRequest, BadReview, parse_review
from webhook.libs import logs
from webhook.quota.budget import Spending, no_spending
from webhook.quota.store import UsageStore
from webhook.server import metrics
from webhook.server.sources.reload import PolicySource
from webhook.server.web import policyhook
from webhook.server.web.asgi import Receive, Scope, Send
from webhook.server.web.forward import RELAYED, Relay
from webhook.server.web.reuse import Reuse

_JSON_HEADERS = [(b"content-type", b"application/json")]


@dataclass(frozen=True)
class Runtime:
    """What the server needs besides the policy: cluster-fed lookups and readiness.
    Built once, before the server starts (``webhook.server.run``), and never changed:
    the policy source swaps policies inside itself, the store keeps its own state."""

    policy: PolicySource
    namespace_labels: NamespaceLabels = no_labels
    # Every namespace the cluster cache knows, with its labels (for the tenant info series).
    namespaces: metrics.Namespaces = metrics.no_namespaces
    store: UsageStore | None = None
    read_workload: WorkloadReader | None = None  # for scale requests; None: no cluster
    claims: ClaimLookup = no_claims  # DRA claims and templates the watches hold
    read_claim: ClaimReader | None = None  # one the watches have not delivered; None: no cluster
    sights: Sights = no_sights  # nodes and PriorityClasses the watches hold
    read_group: GroupReader | None = None  # a PodGroup at its first pod; None: no cluster
    group_members: GroupMembers = no_members  # a PodGroup's pods charged (the pod watch)
    gatekeeper: str | None = None  # who may remove the quota gate (the webhook itself)
    # What each GPU-hour budget has used (webhook.server.gputime); none: no budgets.
    spending: Callable[[], Spending] = no_spending
    ready_checks: Mapping[str, Callable[[], bool]] = field(default_factory=dict)
    # What /readyz says beside its checks without failing the probe (the leader's
    # comparison of the webhook configurations with the policy).
    ready_notes: Mapping[str, Callable[[], str]] = field(default_factory=dict)
    max_body: int = MAX_BODY_BYTES
    max_inflight: int = 256  # admission requests handled at once; more get 429
    request_timeout: float = 8.0  # seconds from a request's first byte to its answer
    # Mutating decisions kept for pods of one shape (webhook.server.web.reuse); 0: none.
    reuse_size: int = 1024
    clock: Callable[[], float] = time.time  # what quota windows are decided by
    # With --quota-commit leader: where reviews that may reserve quota are relayed when
    # another replica leads (webhook.server.web.forward); None: decided here.
    relay: Relay | None = None


_PATHS = {"/mutate": Phase.MUTATE, "/validate": Phase.VALIDATE}


class AdmissionApp:
    """ASGI entry point: admission routes on the fast path, the rest to FastAPI."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.cluster = Cluster(runtime.namespace_labels, runtime.store, runtime.read_workload,
                               runtime.claims, runtime.read_claim, runtime.sights,
                               clock=runtime.clock, gatekeeper=runtime.gatekeeper,
                               read_group=runtime.read_group,
                               group_members=runtime.group_members,
                               spending=runtime.spending)
        # This app's quota gauges and store counters, read when Prometheus scrapes (a
        # second app in the process has its own: nothing here is global).
        self.state = metrics.StateCollector(
            runtime.store,
            lambda: runtime.policy.active.policy if runtime.policy.active else None,
            runtime.namespaces)
        self.other = _control_app(runtime, self.state)
        self.inflight = 0
        self.deadlines = BodyDeadlines()
        self.reuse = Reuse(runtime.reuse_size, self.cluster) if runtime.reuse_size > 0 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            phase = _PATHS.get(scope["path"])
            if phase is not None:
                await self._admit(phase, scope, receive, send)
                return
            if scope["path"] == policyhook.PATH:
                body = await _read_body(scope, receive, self.runtime.max_body)
                status, payload = (policyhook.answer(body) if body is not None else
                                   (413, {"error": "request body is too large"}))
                await _send(send, status, payload)
                return
        await self.other(scope, receive, send)

    async def _admit(self, webhook: Phase, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        if self.inflight >= self.runtime.max_inflight:
            # Checked before any await: refusing costs no body read and no parse.
            await self._overloaded(webhook, scope, send, 429, "inflight",
                                   f"overloaded: {self.inflight} admission requests in flight "
                                   f"(--max-inflight {self.runtime.max_inflight}); retry")
            return
        self.inflight += 1
        metrics.INFLIGHT.inc()
        try:
            await self._admit_within(webhook, scope, receive, send, started)
        finally:
            self.inflight -= 1
            metrics.INFLIGHT.dec()

    async def _admit_within(self, webhook: Phase, scope: Scope, receive: Receive, send: Send,
                            started: float) -> None:
        now = time.monotonic()
        limit = min(self.runtime.request_timeout, _budget(scope))
        arrived = _arrived(scope, now)
        deadline = arrived + limit
        try:
            body = await self.deadlines.read(scope, receive, self.runtime.max_body, deadline)
        except TimeoutError:
            await self._overloaded(webhook, scope, send, 408, "body-timeout",
                                   f"the request body did not arrive within {limit:g} s")
            return
        if time.monotonic() > deadline:
            await self._overloaded(webhook, scope, send, 503, "deadline",
                                   f"overloaded: the review waited past its {limit:g} s "
                                   "deadline before it could be decided; retry")
            return
        try:
            if body is None:
                raise BadReview(f"request body is larger than {self.runtime.max_body} bytes",
                                413)
            parsing = time.perf_counter()
            req = parse_review(body)
            metrics.child(metrics.PHASE, webhook, "parse").observe(
                time.perf_counter() - parsing)
        except BadReview as exc:
            metrics.BAD_REVIEWS.labels(webhook, str(exc.status)).inc()
            logs.event("bad review", logging.WARNING, webhook=webhook, status=exc.status,
                       error=str(exc), client=_client(scope))
            await _send(send, exc.status, {"error": str(exc)})
            return
        if await self._relayed(webhook, scope, send, req, body, deadline, started):
            return
        deciding = time.perf_counter()
        answer = await self.decide(webhook, req, max(0.0, deadline - time.monotonic()))
        metrics.child(metrics.PHASE, webhook, "decide").observe(time.perf_counter() - deciding)
        await _send(send, 200, answer)
        elapsed = time.perf_counter() - started
        metrics.child(metrics.LATENCY, webhook).observe(elapsed)
        if answered_late(scope, arrived, time.monotonic()):
            metrics.child(metrics.LATE, webhook).inc()  # the API server had given up

    async def _relayed(self, webhook: Phase, scope: Scope, send: Send, req: AdmissionRequest,
                       body: bytes, deadline: float, started: float) -> bool:
        """Whether the review was answered by the leader (``--quota-commit leader``): a
        real review, not relayed already, while another replica leads. A dry run
        reserves nothing and is decided here."""
        relay = self.runtime.relay
        if relay is None or req.dry_run or _relayed_already(scope):
            return False
        base = relay.leader()
        if not base:
            return False
        # Most of what is left of the budget: a relay that fails is decided here in time.
        # The leader is told it as the API server tells us (``?timeout=``), so that it
        # answers, or gives up, within it too.
        budget = 0.8 * max(0.0, deadline - time.monotonic())
        got = await relay.send(base, f"{scope['path']}?timeout={budget:.3f}s", body, budget)
        metrics.RELAYS.labels(webhook, "answered" if got is not None else "failed").inc()
        if got is None:
            return False
        headers = [*_JSON_HEADERS, (b"content-length", str(len(got[1])).encode())]
        await send({"type": "http.response.start", "status": got[0], "headers": headers})
        await send({"type": "http.response.body", "body": got[1]})
        metrics.child(metrics.LATENCY, webhook).observe(time.perf_counter() - started)
        return True

    async def _overloaded(self, webhook: Phase, scope: Scope, send: Send, status: int,
                          reason: str, message: str) -> None:
        metrics.OVERLOAD.labels(webhook, reason).inc()
        logs.event("admission request refused", logging.WARNING, webhook=webhook,
                   status=status, reason=reason, client=_client(scope))
        await _send(send, status, {"error": message})

    async def decide(self, webhook: Phase | str, req: AdmissionRequest, budget: float
                     ) -> dict[str, Any]:
        """Decide one parsed review through the admission pipeline and build the reply
        (never raises: a failure to decide is a denial)."""
        phase = Phase(webhook)
        active = self.runtime.policy.active
        assert active is not None, "the server starts only after a policy loaded"
        try:
            # A pod naming DRA claims is never reused (webhook.server.web.reuse), and may
            # need one read from the API server first (webhook.admission.claimreads).
            if phase is Phase.MUTATE and self.reuse is not None and not named(req):
                decision = self.reuse.mutating(req, active.policy, active.generation)
            elif (phase is Phase.VALIDATE and self.reuse is not None and req.kind == "Pod"
                  and req.operation == "CREATE" and not req.sub_resource and not named(req)):
                decision = await validating(req, active.policy, self.cluster, budget,
                                            self.reuse.checked(req, active.policy,
                                                               active.generation))
            else:
                decision = await admit(phase, req, active.policy, self.cluster, budget)
        except Exception as exc:  # a bug must deny (fail closed), never 500 or allow
            metrics.ERRORS.labels(phase).inc()
            logging.getLogger("gpu_webhook").exception(
                "review failed", extra={"fields": {"uid": req.uid, "webhook": phase.value}})
            return error_response(
                req.uid,
                f"gpu-webhook could not decide this request ({type(exc).__name__}); "
                f"it is denied to stay safe. The webhook log has the details (uid {req.uid}).",
                api_version=req.api_version)
        _record(phase, req, decision, active.policy.name, active.generation)
        return reply(phase, req.uid, decision, req.api_version)


_FAULTS = {"ledger-unavailable": metrics.RESERVATIONS_UNAVAILABLE,
           "scale-unchecked": metrics.SCALES_UNCHECKED}


def _record(webhook: Phase, req: AdmissionRequest, d: Decision, policy: str, gen: int
            ) -> None:
    outcome = d.outcome
    for fault in d.faults:
        _FAULTS[fault].inc()
    metrics.child(metrics.ADMISSIONS, webhook, req.operation, req.kind, outcome).inc()
    for f in d.findings:
        metrics.child(metrics.FINDINGS, webhook, f.rule.value, f.mode.value,
                      d.tenant or "").inc()
    if d.allowed:  # a denial's patch is dropped: count only changes that were applied
        for change in d.mutations:
            metrics.child(metrics.MUTATIONS, change).inc()
    if outcome != "skipped" or logs.LOGGER.isEnabledFor(logging.DEBUG):
        logs.decision(
            # Names are cut to the longest a Kubernetes name can be: a hostile review must
            # not turn into a megabyte log line.
            webhook=webhook, uid=req.uid, namespace=req.namespace[:63],
            name=req.name[:253], kind=req.kind[:63], operation=req.operation,
            user=req.username[:253],
            dry_run=req.dry_run, decision=outcome, tenant=d.tenant,
            rules=sorted({f.rule.value for f in d.findings}), changes=d.mutations,
            policy=policy, generation=gen,
        )


SWEEP_SECONDS = 0.05


class BodyDeadlines:
    """Deadlines for reading request bodies, enforced by one sweep every
    ``SWEEP_SECONDS`` rather than a timer per request.

    ``asyncio.timeout`` arms and cancels a loop timer for every admission: about 4 µs on
    uvloop, a twentieth of what the whole review costs, for a guard that fires only when
    a body stalls. Here a read registers its task and deadline in a dict; a sweeper task,
    running only while reads are pending, cancels the overdue ones, which then raise
    ``TimeoutError``. A stalled read ends at most ``SWEEP_SECONDS`` after its deadline.
    """

    def __init__(self) -> None:
        self.reading: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def read(self, scope: Scope, receive: Receive, cap: int, deadline: float
                   ) -> bytes | None:
        """:func:`_read_body`, raising ``TimeoutError`` at ``deadline`` (monotonic)."""
        # With the loop named, current_task skips get_running_loop, whose fork check is a
        # getpid() system call per request; a loop that is no longer running finds no task.
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        if task is None:
            task = asyncio.current_task()
            assert task is not None, "called from a task: uvicorn runs each request in one"
            self._loop = task.get_loop()
        self.reading[task] = deadline
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = task.get_loop().create_task(self._sweep())
        try:
            return await _read_body(scope, receive, cap)
        except asyncio.CancelledError:
            # The task is only ever suspended inside the read while registered, so the
            # sweeper's cancellation always arrives here, never in the code after it.
            if task in self._expired:
                task.uncancel()
                raise TimeoutError from None
            raise
        finally:
            del self.reading[task]
            self._expired.discard(task)

    async def _sweep(self) -> None:
        while self.reading:
            await asyncio.sleep(SWEEP_SECONDS)
            now = time.monotonic()
            for task, deadline in list(self.reading.items()):
                if deadline <= now and task not in self._expired:
                    self._expired.add(task)
                    task.cancel()


async def _read_body(scope: Scope, receive: Receive, cap: int) -> bytes | None:
    """The request body, or None once it exceeds ``cap`` (checked before buffering it)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                if int(value) > cap:
                    return None
            except ValueError:
                pass
            break
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _send(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = orjson.dumps(payload)
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


DEFAULT_BUDGET = 8.0  # seconds; the API server's default webhook timeout is 10 s


def _relayed_already(scope: Scope) -> bool:
    name = RELAYED.encode()
    return any(k == name for k, _ in scope.get("headers", ()))


def _api_timeout(scope: Scope) -> float | None:
    """The API server's timeout for this call, from ``?timeout=`` (``timeout=5s``)."""
    qs = scope.get("query_string", b"")
    if b"timeout=" in qs:
        for part in qs.split(b"&"):
            if part.startswith(b"timeout="):
                value = part[8:].decode("ascii", "replace")
                try:
                    return float(value[:-1]) if value.endswith("s") else float(value)
                except ValueError:
                    return None
    return None


def answered_late(scope: Scope, arrived: float, now: float) -> bool:
    """Whether an answer written at ``now`` comes after the API server's own timeout for
    the call (it has given up and applied the failurePolicy): what an operator must
    know, since the webhook's own deadline (80 % of it) should have answered first."""
    given = _api_timeout(scope)
    return given is not None and now - arrived > given


def _budget(scope: Scope) -> float:
    """Time left for a quota commit: the API server puts its deadline in ``?timeout=``
    (e.g. ``timeout=5s``); keep a margin so the reply arrives before it gives up."""
    seconds = _api_timeout(scope)
    if seconds is None:
        return DEFAULT_BUDGET
    return max(0.2, min(DEFAULT_BUDGET, seconds * 0.8))


ARRIVED = "gpu_webhook.arrived"  # scope key: time.monotonic() of the request's first byte


def _arrived(scope: Scope, now: float) -> float:
    """When the request began to arrive (stamped by the HTTP protocol in ``serve``);
    ``now`` for a server run without that protocol (tests of the bare app)."""
    value = scope.get(ARRIVED)
    return value if isinstance(value, float) else now


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else ""


def _control_app(runtime: Runtime, state: metrics.StateCollector) -> FastAPI:
    app = FastAPI(title="gpu-webhook", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz(response: Response) -> dict[str, Any]:
        active = runtime.policy.active
        checks = {name: bool(check()) for name, check in runtime.ready_checks.items()}
        ready = active is not None and all(checks.values())
        response.status_code = 200 if ready else 503
        return {
            "ready": ready,
            "policy": active.policy.name if active else None,
            "generation": active.generation if active else 0,
            "lastReloadError": runtime.policy.last_error,
            "checks": checks,
            **{name: note() for name, note in runtime.ready_notes.items()},
        }

    @app.get("/metrics")
    async def prom() -> Response:
        # On the event loop, not in FastAPI's thread pool: the scrape reads the usage store
        # (metrics.StateCollector), which only the event loop may touch.
        return Response(generate_latest(metrics.Exposition(state)),
                        media_type=CONTENT_TYPE_LATEST)

    @app.post("/mutate")
    @app.post("/validate")
    def never() -> None:  # pragma: no cover - AdmissionApp answers these paths first
        raise AssertionError

    return app
