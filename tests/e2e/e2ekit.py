"""Helpers for the end-to-end suite: the webhook run as a cluster runs it, and what a user
types.

A "deployment" here is what a cluster would run: ``gpu-webhook certs`` makes the CA and
serving certificate, one or more ``gpu-webhook serve`` replicas share that certificate
directory (as pods share a Secret) and the quota ledger in the ``gpu-webhook``
namespace, and ``gpu-webhook manifests`` renders the webhook configurations the API
server is given. Several replicas sit behind :class:`RoundRobinProxy`, which plays the
Service: it spreads TCP connections and passes TLS through untouched, so the API server
verifies the replicas' own certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import ssl
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from controlplane.cluster import ControlPlane
from kit import answering, await_serving, console_script, free_port, serve
from kubernetes import client, config

from webhook.k8s.review import request_review

E2E = Path(__file__).resolve().parent
ROOT = E2E.parents[1]  # the repository
POLICY = E2E / "policies" / "e2e.yaml"
LEDGER_NAMESPACE = "gpu-webhook"
TENANT_LABEL = "gpu.example.com/tenant"
MUTATED_ANNOTATION = "gpu-webhook.dev/mutated"
START_TIMEOUT = 60.0
# The toleration the webhook gives every GPU pod (the e2e policy's default).
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}




def gpu_webhook(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a ``gpu-webhook`` command as a platform engineer would."""
    proc = subprocess.run([console_script(), *args], capture_output=True, text=True,
                          timeout=60, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"gpu-webhook {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc




def wait_until(what: str, ok: Callable[[], bool], timeout: float = 30.0,
               every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def short_id() -> str:
    return uuid.uuid4().hex[:6]


# --------------------------------------------------------------------------- objects


def gpu_pod(name: str, *, limits: Any = "1", requests: Any = None,
            labels: dict[str, str] | None = None, affinity: dict[str, Any] | None = None,
            container: str = "train") -> dict[str, Any]:
    """A Pod as a developer writes it: one container asking for GPUs."""
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = {"nvidia.com/gpu": limits}
    if requests is not None:
        resources["requests"] = {"nvidia.com/gpu": requests}
    spec: dict[str, Any] = {"containers": [{"name": container, "image": "registry.local/train:1",
                                            "resources": resources}]}
    if affinity is not None:
        spec["affinity"] = affinity
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def gpu_deployment(name: str, limits: str, replicas: int = 2) -> dict[str, Any]:
    """A Deployment of ``replicas`` pods, each :func:`gpu_pod` ``name`` with ``limits``."""
    pod = gpu_pod(name, limits=limits)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}},
    }


def gpu_job(name: str, limits: str | None = None, requests: str | None = None,
            parallelism: int = 1) -> dict[str, Any]:
    """A Job of ``parallelism`` pods at once (as many completions), each :func:`gpu_pod`
    ``name`` with ``limits`` and ``requests``, never restarted."""
    pod = gpu_pod(name, limits=limits, requests=requests)
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": parallelism, "completions": parallelism,
                 "template": {"spec": {**pod["spec"], "restartPolicy": "Never"}}},
    }


def assert_gpu_template_patched(spec: dict[str, Any], gpus: str) -> None:
    """A pod spec as the webhook patched it in research: ``gpus`` GPUs requested and
    limited, the GPU toleration, and node affinity on the product and the rack."""
    assert spec["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    assert GPU_TOLERATION in spec["tolerations"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert {e["key"] for t in terms for e in t["matchExpressions"]} == {
        "nvidia.com/gpu.product", "topology.example.com/gpu-rack"}


def plain_pod(name: str) -> dict[str, Any]:
    """A Pod that asks for no GPU."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "web", "image": "registry.local/web:1"}]}}


def to_yaml(*objects: dict[str, Any]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


# --------------------------------------------------------------------------- processes


@dataclass
class Replica:
    """One ``gpu-webhook serve`` process."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.terminate()
        try:
            # As long as the kubelet waits for the shipped Deployment
            # (terminationGracePeriodSeconds: 30): the server drains for up to 20 s,
            # then releases its Lease.
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def capped_policy(workdir: Path, file: str, tenants: Iterable[str], gpus: int, *,
                  ttl: float | None = None) -> Path:
    """The e2e policy plus one tenant per name, chosen by the namespace label
    ``gpu.example.com/tenant`` and capped at ``gpus`` GPUs (reservations lasting ``ttl``
    seconds when given), written to ``workdir/file``."""
    text = POLICY.read_text()
    if ttl is not None:
        text = text.replace(
            "spec:\n", f"spec:\n  quotaLedger:\n    reservationTTLSeconds: {ttl}\n", 1)
    text += "".join(f"""
    - name: {t}
      namespaceSelector:
        matchLabels: {{gpu.example.com/tenant: {t}}}
      maxGpusPerPod: 8
      quota:
        gpus: {gpus}
""" for t in tenants)
    path = workdir / file
    path.write_text(text)
    return path


def start_replica(workdir: Path, cert_dir: Path, policy: Path, kubeconfig: Path,
                  index: int, args: Sequence[str] = (),
                  env: dict[str, str] | None = None, port: int | None = None) -> Replica:
    """A replica on ``port`` (a free one when None: a restarted replica takes its
    predecessor's, where the installed configurations call it)."""
    port = port or free_port()
    log_path = workdir / f"replica-{index}.log"
    process = serve(port, cert_dir, log_path, "--policy", str(policy),
                    "--kubeconfig", str(kubeconfig), "--namespace", LEDGER_NAMESPACE, *args,
                    env=env, append=True, start_new_session=True)
    return Replica(process, port, log_path)


def wait_ready(replica: Replica, ca_file: Path) -> None:
    """Poll /readyz until the policy is loaded and the pod/namespace caches synced."""
    await_serving(replica.process,
                  answering(f"https://localhost:{replica.port}", ca_file, "/readyz"),
                  lambda: replica.log()[-3000:], "ready", START_TIMEOUT)


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
               hold: Callable[[], Awaitable[None]] | None = None) -> None:
    """Copy ``src`` to ``dst`` until either end closes (then close ``dst``); ``hold``, when
    given, is awaited before each chunk is passed on (a relay that stalls)."""
    try:
        while True:
            data = await src.read(65536)
            if hold is not None:
                await hold()
            if not data:
                break
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            dst.close()


class RoundRobinProxy:
    """A TCP proxy that hands each new connection to the next backend, like a Service.

    Bytes are copied both ways untouched (TLS is end to end between the API server and
    the replica). It runs its own event loop on a thread and counts the connections
    each backend received, so a test can show that both replicas took part.
    """

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.port = 0
        self.connections: Counter[int] = Counter()
        self._next = itertools.cycle(backends)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="round-robin-proxy")

    def start(self) -> RoundRobinProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend = next(self._next)
        self.connections[backend] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backend)
        except OSError:
            writer.close()
            return
        self._open.update((writer, up_writer))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._open.difference_update((writer, up_writer))

    def remove(self, port: int) -> None:
        """Send no new connection to ``port``, as a Service does once a terminating
        replica's endpoint is removed."""
        self.backends = [b for b in self.backends if b != port]
        self._next = itertools.cycle(self.backends)

    def route(self, ports: list[int]) -> None:
        """Send new connections to ``ports`` only (every backend again when given them
        all), and close the open ones so the API server connects anew: a test decides
        which replica answers next."""
        self.backends = list(ports)
        self._next = itertools.cycle(self.backends)
        self.drop_connections()

    def drop_connections(self) -> None:
        """Close every open connection, so that callers must connect (and handshake)
        again, as when a Service's endpoints change."""

        async def drop() -> None:
            for w in list(self._open):
                w.close()

        asyncio.run_coroutine_threadsafe(drop(), self._loop).result(5)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._open):
                w.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


@dataclass
class Deployment:
    """The webhook as installed in a cluster: certificates, replicas, one address."""

    cp: ControlPlane
    workdir: Path
    cert_dir: Path
    policy: Path
    replicas: list[Replica] = field(default_factory=list)
    proxy: RoundRobinProxy | None = None
    manifests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ca_file(self) -> Path:
        return self.cert_dir / "ca.pem"

    @property
    def port(self) -> int:
        return self.proxy.port if self.proxy else self.replicas[0].port

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def webhook_name(self, kind: str) -> str:
        """The name of the (first) webhook in the installed configuration of ``kind``."""
        for doc in self.manifests:
            if doc.get("kind") == kind:
                return str(doc["webhooks"][0]["name"])
        raise AssertionError(f"no {kind} in the rendered manifests")

    @property
    def mutating(self) -> str:
        return self.webhook_name("MutatingWebhookConfiguration")

    @property
    def validating(self) -> str:
        return self.webhook_name("ValidatingWebhookConfiguration")

    @property
    def scaling(self) -> str:
        """The validating webhook for the scale subresource (kubectl scale, an HPA)."""
        for doc in self.manifests:
            if doc.get("kind") == "ValidatingWebhookConfiguration":
                for hook in doc["webhooks"]:
                    if str(hook["name"]).startswith("scale."):
                        return str(hook["name"])
        raise AssertionError("no scale webhook in the rendered manifests")

    def logs(self) -> str:
        """The tail of each replica's log, for a failure message."""
        return "\n".join(f"--- replica {i} ---\n{r.log()[-4000:]}"
                         for i, r in enumerate(self.replicas))

    def logged(self, text: str) -> bool:
        """Whether any replica ever logged ``text`` (its whole log, not the tail)."""
        return any(text in r.log() for r in self.replicas)

    # -- the configurations the API server calls us by --------------------------------

    def render(self, url: str | None = None) -> str:
        """``gpu-webhook manifests`` for this deployment's address and CA."""
        # A missing or broken command fails here (gpu_webhook checks the exit code):
        # skipping would pass CI with no e2e test run at all.
        out = gpu_webhook("manifests", "--policy", str(self.policy), "--url", url or self.url,
                          "--ca-file", str(self.ca_file)).stdout
        return out

    def install(self, url: str | None = None) -> None:
        text = self.render(url)
        self.manifests = [d for d in yaml.safe_load_all(text) if d]
        self.cp.kubectl("apply", "-f", "-", input=text)

    @contextlib.contextmanager
    def installed(self, docs: list[dict[str, Any]] | None = None, url: str | None = None
                  ) -> Iterator[Deployment]:
        """The webhook configurations (rendered, for ``url`` if given, or ``docs``)
        applied and answering for the block; taken out, and waited out, at its end."""
        if docs is None:
            self.install(url)
        else:
            self.manifests = docs
            self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        try:
            wait_installed(self.cp, self)
            yield self
        finally:
            self.uninstall()
            wait_uninstalled(self.cp)

    def uninstall(self) -> None:
        for doc in self.manifests:
            kind = doc.get("kind", "")
            if kind.endswith("WebhookConfiguration"):
                self.cp.kubectl("delete", kind.lower(), doc["metadata"]["name"],
                                "--ignore-not-found", "--wait=false")

    def stop(self) -> None:
        # Replicas first, all at once, while the proxy still relays their TLS close: a
        # replica's graceful shutdown waits for its connections to close.
        for r in self.replicas:
            r.terminate()
        for r in self.replicas:
            r.stop()
        if self.proxy is not None:
            self.proxy.stop()


@contextlib.contextmanager
def deployed(cp: ControlPlane, workdir: Path, *, replicas: int = 1, proxy: bool = False,
             policy: Path = POLICY, args: Sequence[str] = ()) -> Iterator[Deployment]:
    """Certificates, ``replicas`` serving processes (behind a proxy when more than one,
    or when asked; each with the extra ``serve`` flags ``args``), ready; stopped on
    exit. Installing the configurations is the caller's call."""
    cert_dir = workdir / "certs"
    gpu_webhook("certs", "--out", str(cert_dir), "--dns", "localhost", "--ip", "127.0.0.1")
    d = Deployment(cp, workdir, cert_dir, policy)
    try:
        for i in range(replicas):
            d.replicas.append(start_replica(workdir, cert_dir, policy, cp.kubeconfig, i, args))
        for r in d.replicas:
            wait_ready(r, d.ca_file)
        if replicas > 1 or proxy:
            d.proxy = RoundRobinProxy([r.port for r in d.replicas]).start()
        yield d
    finally:
        d.stop()


@contextlib.contextmanager
def core_client(cp: ControlPlane, pool: int = 40) -> Iterator[client.CoreV1Api]:
    """The Kubernetes Python client on ``cp``, as an application creating pods would use
    it (``pool`` connections at most)."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    api = client.ApiClient(cfg)
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


# --------------------------------------------------------------------------- kubectl


def apply(cp: ControlPlane, namespace: str, *objects: dict[str, Any], dry_run: bool = False,
          check: bool = False) -> subprocess.CompletedProcess[str]:
    """``kubectl apply -n NS -f -`` of ``objects`` (``--dry-run=server`` if asked)."""
    args = ["apply", "-n", namespace, "-f", "-"]
    if dry_run:
        args += ["--dry-run=server", "-o", "yaml"]
    return cp.kubectl(*args, input=to_yaml(*objects), check=check)


def get(cp: ControlPlane, namespace: str, kind: str, name: str) -> dict[str, Any]:
    out = cp.kubectl("get", kind, name, "-n", namespace, "-o", "yaml").stdout
    obj: dict[str, Any] = yaml.safe_load(out)
    return obj


def get_if_there(cp: ControlPlane, namespace: str, kind: str, name: str
                 ) -> dict[str, Any] | None:
    """The object as ``get`` returns it, or None when ``kubectl get`` finds none."""
    out = cp.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    if out.returncode != 0:
        return None
    obj: dict[str, Any] = orjson.loads(out.stdout)
    return obj


def absent(cp: ControlPlane, namespace: str, kind: str, name: str) -> bool:
    """Whether ``kubectl get`` finds no ``kind`` ``name`` in ``namespace``."""
    return cp.kubectl("get", kind, name, "-n", namespace, check=False).returncode != 0


def assert_succeeded(out: subprocess.CompletedProcess[str], said: str) -> None:
    """kubectl succeeded and printed exactly ``said`` (e.g. ``pod/x created``)."""
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == said, out.stdout


def assert_refused_at_create(out: subprocess.CompletedProcess[str], webhook: str,
                             message: str) -> None:
    """``kubectl apply`` failed creating its object, printing exactly ``webhook``'s denial
    ``message``."""
    assert out.returncode != 0
    expected = ('Error from server (Forbidden): error when creating "STDIN": '
                + denial_prefix(webhook) + message)
    assert out.stderr.strip() == expected, out.stderr


def assert_denied(out: subprocess.CompletedProcess[str], *said: str,
                  webhook: str | None = None) -> None:
    """kubectl failed, and its stderr holds each of ``said`` (each anywhere in it) and,
    with ``webhook``, that webhook's denial prefix (:func:`denial_prefix`); a failed
    check shows kubectl's whole stderr (its stdout, when kubectl succeeded)."""
    assert out.returncode != 0, f"kubectl succeeded: {out.stdout}"
    if webhook is not None:
        assert denial_prefix(webhook) in out.stderr, out.stderr
    for words in said:
        assert words in out.stderr, out.stderr


def service_account_kubeconfig(cp: ControlPlane, ns: str, path: Path,
                               *rolebinding: str) -> Path:
    """A kubeconfig at ``path`` for a new ServiceAccount ``dev`` of ``ns``, granted only
    the RoleBinding in ``ns`` made by ``kubectl create rolebinding *rolebinding``."""
    cp.kubectl("create", "serviceaccount", "dev", "-n", ns)
    cp.kubectl("create", "rolebinding", *rolebinding, f"--serviceaccount={ns}:dev", "-n", ns)
    token = cp.kubectl("create", "token", "dev", "-n", ns).stdout.strip()
    admin = yaml.safe_load(Path(cp.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": "dev", "user": {"token": token}}],
        "contexts": [{"name": "dev", "context": {"cluster": cluster["name"], "user": "dev",
                                                 "namespace": ns}}],
        "current-context": "dev"}))
    return path


def sees_free_gpus(webhook: Deployment, namespace: str, gpus: int) -> bool:
    """Whether every running replica would now admit a pod of ``gpus`` GPUs in
    ``namespace``: a dry-run review sent to each directly, which reserves nothing (one a
    test killed is passed over)."""
    review = request_review(gpu_pod("probe", limits=str(gpus), requests=str(gpus)),
                            namespace=namespace, dry_run=True)
    ctx = ssl.create_default_context(cafile=str(webhook.ca_file))
    with httpx.Client(verify=ctx, timeout=5) as http:
        for r in webhook.replicas:
            if r.process.poll() is not None:
                continue
            reply = http.post(f"https://localhost:{r.port}/validate", content=orjson.dumps(review))
            if not reply.json()["response"]["allowed"]:
                return False
    return True


def apply_until_counted(cp: ControlPlane, webhook: Deployment, namespace: str,
                        pod: dict[str, Any], what: str, *, refused: int) -> None:
    """Create ``pod`` (kubectl must succeed) and wait, as ``what``, until every replica
    counts it: until none would admit a pod of ``refused`` GPUs in ``namespace``."""
    out = apply(cp, namespace, pod)
    assert out.returncode == 0, out.stderr
    wait_until(what, lambda: not sees_free_gpus(webhook, namespace, refused), timeout=20,
               every=0.2)


def denial_prefix(webhook: str) -> str:
    """What kubectl prints before our message when a webhook denies an apply."""
    return f'admission webhook "{webhook}" denied the request: '


# --------------------------------------------------------------------------- namespaces

NamespaceFactory = Callable[[str], str]


def create_namespace(cp: ControlPlane, name: str, tenant: str | None) -> None:
    labels = f"\n  labels:\n    {TENANT_LABEL}: {tenant}" if tenant else ""
    cp.kubectl("apply", "-f", "-",
               input=f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}{labels}\n")


# The API server learns of webhook configurations through a watch: a probe pod in a
# namespace of its own shows when it calls (or stops calling) ours.
_PROBE_NS = "e2e-probe"


def _probe(cp: ControlPlane) -> dict[str, Any] | None:
    if cp.kubectl("get", "namespace", _PROBE_NS, check=False).returncode != 0:
        create_namespace(cp, _PROBE_NS, "research")
    out = apply(cp, _PROBE_NS, gpu_pod(f"probe-{short_id()}"), dry_run=True)
    if out.returncode != 0:
        return None
    obj: dict[str, Any] = yaml.safe_load(out.stdout)
    return obj


def wait_installed(cp: ControlPlane, d: Deployment) -> None:
    def called() -> bool:
        obj = _probe(cp)
        return bool(obj and MUTATED_ANNOTATION in (obj["metadata"].get("annotations") or {}))

    try:
        wait_until("the API server to call the webhook", called, timeout=30, every=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{d.logs()}") from None


def wait_uninstalled(cp: ControlPlane) -> None:
    def quiet() -> bool:
        obj = _probe(cp)
        return bool(obj and MUTATED_ANNOTATION not in (obj["metadata"].get("annotations") or {}))

    wait_until("the API server to stop calling the webhook", quiet, timeout=30, every=0.2)


# --------------------------------------------------------------------------- CRDs

NUDGE_ANNOTATION = "gpu-webhook.dev/e2e-requeue"


def crd_gone(cp: ControlPlane, name: str) -> bool:
    """Whether the CRD ``name`` is gone; while it is terminating, nudge its finalizer.

    The API server's CRD finalizer lists the custom resources through their storage, made
    for the deletion when nothing had served them yet; until its watch cache has listed it
    answers "storage is (re)initializing", and each refusal doubles the finalizer's retry
    delay (5 ms up to 1,000 s, forgotten only on success). On a loaded machine a CRD can
    so stay Terminating for minutes after its storage is ready. Any change to the
    terminating CRD but its Terminating condition requeues the finalizer at once: an
    annotation, at most every 5 s, does that. Nothing is removed by hand, so a custom
    resource that does hold the deletion (a finalizer) still keeps the CRD, and the
    caller's wait still fails.
    """
    out = cp.kubectl("get", f"crd/{name}", "-o", "json", check=False)
    if out.returncode != 0:
        return "NotFound" in out.stderr or "not found" in out.stderr
    obj = orjson.loads(out.stdout)
    if obj["metadata"].get("deletionTimestamp"):
        tick = str(int(time.time()) // 5)
        if (obj["metadata"].get("annotations") or {}).get(NUDGE_ANNOTATION) != tick:
            cp.kubectl("annotate", "--overwrite", f"crd/{name}", f"{NUDGE_ANNOTATION}={tick}",
                       check=False)
    return False


def crd_state(cp: ControlPlane, name: str) -> str:
    """What holds a CRD that should be gone: its Terminating condition and finalizers."""
    out = cp.kubectl("get", f"crd/{name}", "-o", "json", check=False)
    if out.returncode != 0:
        return f"{name}: gone"
    obj = orjson.loads(out.stdout)
    conditions = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
    term = conditions.get("Terminating", {})
    return (f"{name}: deletionTimestamp {obj['metadata'].get('deletionTimestamp')}, "
            f"finalizers {obj['metadata'].get('finalizers')}, Terminating "
            f"{term.get('reason')}: {term.get('message')}")


def delete_crds(cp: ControlPlane, *names: str, timeout: float = 120.0) -> None:
    """Delete the CRDs (if there) and wait until they are gone, naming what holds one."""
    cp.kubectl("delete", "--ignore-not-found", "--wait=false", *(f"crd/{n}" for n in names))
    try:
        wait_until(f"the CRDs {', '.join(names)} to be gone",
                   lambda: all([crd_gone(cp, n) for n in names]), timeout=timeout, every=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {'; '.join(crd_state(cp, n) for n in names)}") from None
