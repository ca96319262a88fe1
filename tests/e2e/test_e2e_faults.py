"""The quota cap under faults, through the real API server, with two webhook replicas.

Replica 0 reaches the API server through :class:`StallRelay`, a TCP relay in this test
that can make every connection already open go silent (no FIN, no RST: a dead
load-balancer path) while new connections still work; replica 1 talks to the API server
directly. The policy's reservation TTL is short (8 s) so that reservations expire
within a test. The faults, each with the cap of 8 GPUs:

- a stalled API connection: replica 0's watches go silent while pods are admitted
  through replica 1 and their reservations expire. 0 over-admits, and replica 0
  reports not ready while its watch is not known live;
- a ledger entry edited by hand to a negative amount: it lifts no cap;
- re-creating a pod name that exists: refused at admission (it would fail
  AlreadyExists), nothing recorded, and no GPUs held once that pod goes;
- the API server unreachable from a replica: its denial says so in the product's words.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from controlplane.cluster import ControlPlane
from e2ekit import (
    LEDGER_NAMESPACE,
    Deployment,
    NamespaceFactory,
    RoundRobinProxy,
    capped_policy,
    core_client,
    gpu_pod,
    gpu_webhook,
    pipe,
    sees_free_gpus,
    start_replica,
    wait_ready,
    wait_until,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.k8s.review import request_review

pytestmark = pytest.mark.e2e

TTL = 8
CAP = 8
TENANTS = ("stall", "corrupt", "rename", "unreachable")


class StallRelay:
    """A TCP relay to the API server whose open connections can be made to stall.

    ``stall()`` freezes every connection open at that moment: bytes are no longer
    passed either way and nothing is closed, so the client sees a connection that is
    up and silent. Connections made later pass bytes (unless ``blackhole()``: then
    they are accepted and frozen from the start). ``release()`` closes them all.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._generation = 0  # connections made before the current one are frozen
        self._blackhole = False
        self._frozen: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="stall-relay")
        self._server: asyncio.AbstractServer | None = None

    def start(self) -> StallRelay:
        self._thread.start()

        async def serve() -> asyncio.AbstractServer:
            self._frozen = asyncio.Event()
            return await asyncio.start_server(self._handle, "127.0.0.1", 0)

        self._server = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def _call(self, fn: Any) -> None:
        async def run() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(5)

    def stall(self) -> None:
        def go() -> None:
            self._generation += 1
        self._call(go)

    def blackhole(self, on: bool = True) -> None:
        def go() -> None:
            self._blackhole = on
            self._generation += 1
        self._call(go)

    def release(self) -> None:
        """Close every relayed connection: the frozen ones' clients learn of it only
        now, and the rest reconnect."""
        def go() -> None:
            for w in list(self._writers):
                w.close()
        self._call(go)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Frozen once the generation reaches ``born``: at the next stall(), or at once
        # when the relay is a black hole.
        born = self._generation + (0 if self._blackhole else 1)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def hold() -> None:
            if self._generation >= born:  # frozen: hold the bytes, say nothing
                assert self._frozen is not None
                await self._frozen.wait()  # never set: until release() closes

        await asyncio.gather(pipe(reader, up_writer, hold), pipe(up_reader, writer, hold))
        self._writers.difference_update((writer, up_writer))

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.release()
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


def _policy(workdir: Path) -> Path:
    return capped_policy(workdir, "faults.yaml", TENANTS, CAP, ttl=TTL)


def _relayed_kubeconfig(cp: ControlPlane, relay: StallRelay, workdir: Path) -> Path:
    text = cp.kubeconfig.read_text().replace(cp.server, f"https://127.0.0.1:{relay.port}")
    assert f":{relay.port}" in text
    path = workdir / "kubeconfig-relayed"
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def faulty(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Deployment, StallRelay]]:
    workdir = tmp_path_factory.mktemp("webhook-faults")
    host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
    relay = StallRelay(host.strip("[]"), int(port)).start()
    cert_dir = workdir / "certs"
    gpu_webhook("certs", "--out", str(cert_dir), "--dns", "localhost", "--ip", "127.0.0.1")
    policy = _policy(workdir)
    d = Deployment(control_plane, workdir, cert_dir, policy)
    try:
        d.replicas.append(start_replica(workdir, cert_dir, policy,
                                        _relayed_kubeconfig(control_plane, relay, workdir), 0))
        d.replicas.append(start_replica(workdir, cert_dir, policy, control_plane.kubeconfig, 1))
        for r in d.replicas:
            wait_ready(r, d.ca_file)
        d.proxy = RoundRobinProxy([r.port for r in d.replicas]).start()
        with d.installed():
            yield d, relay
    finally:
        d.stop()
        relay.stop()


@pytest.fixture(scope="module")
def core(control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    with core_client(control_plane) as api:
        yield api


REFUSALS: list[str] = []  # the messages of refused creates, for a failing test's report


def create(core: client.CoreV1Api, namespace: str, name: str, gpus: int = 1) -> int:
    """Create a GPU pod; the HTTP status (201, or the refusal's)."""
    try:
        core.create_namespaced_pod(namespace, gpu_pod(name, limits=str(gpus)))
    except ApiException as exc:
        REFUSALS.append(f"{name}: {exc.status} {exc.body}")
        return int(exc.status)
    return 201


def gpus_admitted(core: client.CoreV1Api, namespace: str) -> int:
    pods = core.list_namespaced_pod(namespace).items
    return sum(int(c.resources.limits.get("nvidia.com/gpu", 0)) for p in pods
               for c in p.spec.containers)


def tenant_namespace(d: Deployment, namespace: NamespaceFactory, tenant: str) -> str:
    """A new namespace of ``tenant``, once both replicas' namespace caches know it (a
    replica that has not seen its labels yet would find no tenant for it)."""
    ns = namespace(tenant)
    wait_until(f"both replicas to see namespace {ns}", lambda: sees_free_gpus(d, ns, 1),
               timeout=60, every=0.2)
    return ns


def readyz(d: Deployment, index: int) -> int:
    ctx = ssl.create_default_context(cafile=str(d.ca_file))
    with httpx.Client(verify=ctx, timeout=5) as http:
        return http.get(f"https://localhost:{d.replicas[index].port}/readyz").status_code


def test_a_stalled_api_connection_over_admits_nothing_and_is_not_ready(
        faulty: tuple[Deployment, StallRelay], core: client.CoreV1Api,
        namespace: NamespaceFactory) -> None:
    d, relay = faulty
    ns = tenant_namespace(d, namespace, "stall")
    states: list[int] = []
    stop = threading.Event()

    def watch_readiness() -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                states.append(readyz(d, 0))
            stop.wait(0.1)

    poller = threading.Thread(target=watch_readiness, daemon=True)
    relay.stall()  # replica 0's watches and pooled connections go silent
    poller.start()
    statuses: list[int] = []
    try:
        # 1. Fill the cap (through either replica: replica 0 fails closed while it
        # cannot reach the ledger or its watch is not known live).
        wait_until("the cap to be reached", lambda: statuses.append(
            create(core, ns, f"s{len(statuses)}")) or statuses.count(201) == CAP,
            timeout=120, every=0.2)
        # 2. Every reservation of those pods expires: from now on only a cache that saw
        # the pods counts them. Replica 0's first watch is still stalled.
        last = max(e["expires"] for e in orjson.loads(core.read_namespaced_config_map(
            "gpu-webhook-ledger-stall", LEDGER_NAMESPACE).data["reservations"]).values())
        wait_until("the reservations to expire", lambda: time.time() > last + 1,
                   timeout=3 * TTL)
        # 3. More creates, half of them sent to replica 0 by the round-robin proxy.
        statuses += [create(core, ns, f"late{i}") for i in range(CAP)]
        wait_until("replica 0 to be ready again", lambda: bool(states) and states[-1] == 200,
                   timeout=60)
    finally:
        stop.set()
        poller.join(10)
        relay.release()
    assert gpus_admitted(core, ns) == CAP, (statuses, REFUSALS[-3:], d.logs())
    assert statuses.count(201) == CAP
    assert 503 in states  # not ready while its watch was not known live


def test_a_negative_ledger_entry_lifts_no_cap(faulty: tuple[Deployment, StallRelay],
                                              core: client.CoreV1Api,
                                              namespace: NamespaceFactory) -> None:
    d, _ = faulty
    ns = tenant_namespace(d, namespace, "corrupt")
    assert [create(core, ns, f"c{i}") for i in range(4)] == [201] * 4, REFUSALS[-4:]
    ledger = "gpu-webhook-ledger-corrupt"
    cm = core.read_namespaced_config_map(ledger, LEDGER_NAMESPACE)
    entries = orjson.loads(cm.data["reservations"])
    any_entry = next(iter(entries.values()))
    entries["forged"] = {**any_entry, "gpus": -4, "resources": {"nvidia.com/gpu": -4},
                         "name": f"{ns}/forged"}
    cm.data["reservations"] = orjson.dumps(entries).decode()
    core.replace_namespaced_config_map(ledger, LEDGER_NAMESPACE, cm)
    statuses = [create(core, ns, f"more{i}") for i in range(6)]
    assert statuses == [201] * 4 + [403] * 2
    assert gpus_admitted(core, ns) == CAP
    assert d.logged("quota ledger entry is invalid"), d.logs()


def test_re_creating_an_existing_pod_name_holds_no_gpus(faulty: tuple[Deployment, StallRelay],
                                                        core: client.CoreV1Api,
                                                        namespace: NamespaceFactory) -> None:
    d, _ = faulty
    ns = tenant_namespace(d, namespace, "rename")
    assert [create(core, ns, f"r{i}") for i in range(7)] == [201] * 7
    # Each would fail AlreadyExists after admission: refused at admission instead, in
    # words that say why, and nothing recorded that could hold a GPU once r0 goes.
    assert [create(core, ns, "r0") for _ in range(3)] == [403, 403, 403]
    assert "a pod named 'r0' already exists in namespace" in REFUSALS[-1], REFUSALS[-1]
    holder = core.read_namespaced_pod("r0", ns).metadata.uid
    cm = core.read_namespaced_config_map("gpu-webhook-ledger-rename", LEDGER_NAMESPACE)
    named = [k for k, e in orjson.loads(cm.data["reservations"]).items()
             if e.get("name") == f"{ns}/r0"]
    assert set(named) <= {holder}, named  # r0's own reservation at most
    assert create(core, ns, "r7") == 201  # the 8th GPU was not held by the failed creates
    assert create(core, ns, "r8") == 403
    core.delete_namespaced_pod("r0", ns, grace_period_seconds=0)
    wait_until("both replicas to see r0's GPU free", lambda: sees_free_gpus(d, ns, 1),
               timeout=60, every=0.2)
    assert create(core, ns, "r8") == 201
    assert create(core, ns, "r9") == 403
    assert gpus_admitted(core, ns) == CAP


def test_an_unreachable_api_server_is_said_in_the_products_words(
        faulty: tuple[Deployment, StallRelay], namespace: NamespaceFactory) -> None:
    d, relay = faulty
    ns = tenant_namespace(d, namespace, "unreachable")
    review = request_review(gpu_pod("p", limits="1", requests="1"), namespace=ns)
    ctx = ssl.create_default_context(cafile=str(d.ca_file))
    relay.blackhole()
    try:
        with httpx.Client(verify=ctx, timeout=15) as http:
            reply = http.post(f"https://localhost:{d.replicas[0].port}/validate",
                              content=orjson.dumps(review)).json()["response"]
    finally:
        relay.blackhole(False)
        relay.release()
    assert not reply["allowed"]
    message = reply["status"]["message"]
    assert "the GPU quota ledger cannot be reached (" in message
    for internal in ("MaxRetryError", "HTTPSConnectionPool", "127.0.0.1", "urllib3",
                     str(relay.port)):
        assert internal not in message
    wait_until("replica 0 ready again", lambda: readyz(d, 0) == 200, timeout=60)
