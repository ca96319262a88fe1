"""The one module that talks to the Kubernetes API (through the ``kubernetes`` client).

Everything else speaks the product's terms: pods and namespaces arrive as plain dicts
from :class:`Watcher`, the workload of a scale request is read as a plain dict by
:class:`Workloads`, the ledger reads and writes one ConfigMap with a resourceVersion
precondition, self-managed certificates read and write one Secret the same way and set
the ``caBundle`` of named webhook configurations, and API failures become
:class:`Conflict`, :class:`NotFound` or :class:`Unreachable` with a message that says
what was tried.
"""

from __future__ import annotations

import base64
import logging
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from webhook.libs import logs

Event = tuple[str, dict[str, Any]]  # ("ADDED"|"MODIFIED"|"DELETED"|"SYNCED"|"RESET", obj)


class KubeError(Exception):
    """An API call that failed, in the product's words.

    ``str()`` is ``"<what was tried>: <reason>"`` for messages a person reads (a developer's
    denial, ``/readyz``); ``reason`` alone says what happened ("the API server did not
    answer within 2.0s"); ``detail`` keeps the client library's own text (exception type,
    the API server's address, urllib3's retry chain) for the log, and only for the log.
    """

    def __init__(self, what: str, reason: str = "", detail: str = "") -> None:
        super().__init__(f"{what}: {reason}" if reason else what)
        self.what, self.reason, self.detail = what, reason or what, detail


class Conflict(KubeError):
    """The object changed since it was read (HTTP 409): read again and retry."""


class NotFound(KubeError):
    pass


class Unreachable(KubeError):
    """The API server did not answer usefully (network, TLS, auth, 5xx, timeout)."""


def connect(kubeconfig: str | None) -> client.ApiClient:
    """An API client from a kubeconfig file, or the in-cluster service account."""
    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=cfg)
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "the in-cluster service account"
        raise Unreachable(f"load cluster credentials from {where}", str(exc),
                          f"{type(exc).__name__}: {exc}") from None
    cfg.retries = 0  # retries are ours: a webhook has a deadline
    return client.ApiClient(cfg)


# What an HTTP status from the API server means for the webhook, in words.
_STATUS_WORDS = {
    400: "the API server refused the request as malformed",
    401: "the API server did not accept the webhook's credentials",
    403: "the webhook's service account is not allowed to do this (check its RBAC)",
    404: "not found",
    409: "it changed since it was read",
    422: "the API server refused the change as invalid",
    429: "the API server is throttling the webhook's requests",
}


@contextmanager
def translated(what: str, timeout: float | None = None,
               statuses: Mapping[int, type[KubeError]] | None = None) -> Iterator[None]:
    """Run an API call; turn the client library's exceptions into this module's.

    404 is :class:`NotFound`, 409 :class:`Conflict` (a create that finds the name taken,
    a replace with a stale resourceVersion), ``statuses`` adds others (a JSON Patch whose
    ``test`` failed, 422, is a Conflict); any other status and every network, TLS or
    timeout failure is :class:`Unreachable`. The words name what was tried and what
    happened; the library's text, with the API server's address, is only in ``detail``.
    """
    try:
        yield
    except ApiException as exc:
        status = int(exc.status or 0)
        kind = (statuses or {}).get(status) or {404: NotFound, 409: Conflict}.get(
            status, Unreachable)
        words = _STATUS_WORDS.get(status) or (
            "the API server failed" if status >= 500 else "the API server refused it")
        raise kind(what, f"{words} (HTTP {status})",
                   f"HTTP {status} {exc.reason}: {str(exc.body or '')[:500]}") from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise Unreachable(what, _network_words(exc, timeout),
                          f"{type(exc).__name__}: {exc}") from None


def _network_words(exc: BaseException, timeout: float | None) -> str:
    cause: BaseException = exc
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        cause = exc.reason  # the failure itself, under urllib3's retry wrapper
    if isinstance(cause, (urllib3.exceptions.ReadTimeoutError, TimeoutError)):
        within = f" within {timeout:g}s" if timeout else " in time"
        return f"the API server did not answer{within}"
    # NewConnectionError is a ConnectTimeoutError to urllib3: test it first.
    if isinstance(cause, (urllib3.exceptions.NewConnectionError, ConnectionRefusedError)):
        return "cannot connect to the API server"
    if isinstance(cause, urllib3.exceptions.ConnectTimeoutError):
        return "no connection to the API server could be made in time"
    if isinstance(cause, (urllib3.exceptions.SSLError, ssl.SSLError)):
        return "the TLS connection to the API server failed"
    if isinstance(cause, (urllib3.exceptions.ProtocolError, ConnectionError)):
        return "the connection to the API server broke"
    return "the API server could not be reached"


@dataclass(frozen=True, slots=True)
class StoredMap:
    """A ConfigMap's data and the resourceVersion it was read at."""

    data: dict[str, str]
    resource_version: str | None  # None: the object does not exist yet


class ConfigMaps:
    """Read and compare-and-swap write of ConfigMaps in one namespace.

    A ledger commit is on the admission path of every GPU pod, and the client's generated
    API methods cost about a millisecond of CPU per call before any byte is sent
    (argument validation, model objects, serialising them, deserialising the answer).
    So these two calls go straight to the client's connection pool: the request is built
    with the client's own ``param_serialize`` (its URL, its auth headers, a refreshed
    token included), the JSON with orjson, and errors come back as the client's
    ``ApiException``, translated like every other call."""

    def __init__(self, api: client.ApiClient, namespace: str, timeout: float = 2.0) -> None:
        self.api = api
        self.namespace = namespace
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        _, url, headers, _, _ = self.api.param_serialize(
            method, path, header_params=headers, auth_settings=["BearerToken"])
        resp = self.api.rest_client.pool_manager.request(
            method, url, body=orjson.dumps(body) if body is not None else None,
            headers=headers, timeout=urllib3.Timeout(total=self.timeout),
            preload_content=False)
        data = _body(resp)
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=resp.reason,
                               body=data.decode("utf-8", "replace"))
        return data

    def read(self, name: str) -> StoredMap:
        what = f"read configmap {self.namespace}/{name}"
        try:
            with translated(what, self.timeout):
                cm = _json_object(what, self._call(
                    "GET", f"/api/v1/namespaces/{self.namespace}/configmaps/{name}"))
        except NotFound:
            return StoredMap({}, None)
        return StoredMap(_string_map(cm.get("data")), _resource_version(cm))

    def write(self, name: str, data: dict[str, str], resource_version: str | None,
              labels: dict[str, str]) -> str | None:
        """Create (when ``resource_version`` is None) or replace only if unchanged since
        it was read; raise Conflict otherwise. Returns the resourceVersion written (None
        when the answer does not say), against which the next write can be made without
        reading the map again."""
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": labels}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
        collection = f"/api/v1/namespaces/{self.namespace}/configmaps"
        with translated(f"write configmap {self.namespace}/{name}", self.timeout):
            if resource_version is None:  # AlreadyExists (409) is a Conflict too
                answer = self._call("POST", collection, body)
            else:
                answer = self._call("PUT", f"{collection}/{name}", body)
        try:
            return _resource_version(orjson.loads(answer))
        except orjson.JSONDecodeError:
            return None  # written; only the version is unknown: read before the next


def _body(resp: Any) -> bytes:
    """A raw answer's body; its connection back to the pool (urllib3 keeps a connection
    whose content was not preloaded until told), so the next call reuses it."""
    data: bytes = resp.data
    resp.release_conn()
    return data


def _string_map(v: object) -> dict[str, str]:
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}


def _resource_version(obj: object) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None


class Watcher:
    """List then watch a collection in a background thread, handing each event to
    ``deliver`` (called from that thread). After the initial list it sends
    ("SYNCED", {}); after a relist (watch expired, 410 Gone) it first sends
    ("RESET", {}) so the consumer can drop state and rebuild.

    A collection the API server does not serve (HTTP 404 on the list) is reported as
    ("ABSENT", {}) and listed again a minute later.

    It also sends ("PROGRESS", {}) whenever the stream shows it is alive without a
    change (a bookmark, the end of a watch window), so the consumer can tell a quiet
    watch from a dead one. Each watch request asks the server to end it after
    ``window()`` seconds (``deliver.window`` when the consumer offers one), so a healthy
    watch shows progress at least that often; a connection silent for three windows is
    given up (the read times out) and the collection is listed again on a new one.
    """

    def __init__(self, api: client.ApiClient, kind: str,
                 deliver: Callable[[str, dict[str, Any]], None],
                 window: Callable[[], float] | None = None,
                 list_fn: Callable[..., Any] | None = None) -> None:
        core = client.CoreV1Api(api)
        self.api = api
        self.kind = kind
        fn: Callable[..., Any]
        if list_fn is not None:  # a collection of its own (the one GPUPolicy served)
            fn = list_fn
        elif kind == "pods":
            fn = core.list_pod_for_all_namespaces
        elif kind == "resourceclaims":
            fn = client.ResourceV1Api(api).list_resource_claim_for_all_namespaces
        elif kind == "resourceclaimtemplates":
            fn = client.ResourceV1Api(api).list_resource_claim_template_for_all_namespaces
        else:
            fn = core.list_namespace

        def raw_list(**kw: Any) -> Any:
            # No docstring on purpose: the client's Watch then skips deserialising every
            # event into model objects, and we read the plain dicts (much cheaper).
            return fn(**kw)

        self.list_fn: Callable[..., Any] = raw_list
        self.deliver = deliver
        self.window: Callable[[], float] = (window or getattr(deliver, "window", None)
                                            or (lambda: DEFAULT_WATCH_WINDOW))
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._relist = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def resync(self) -> None:
        """Relist (and RESET the consumer) when the current watch window ends."""
        self._relist.set()

    def _run(self) -> None:
        backoff = 0.5
        first = True
        while not self._stop.is_set():
            try:
                rv = self._list(first)
                first = False
                backoff = 0.5
                self._watch(rv)
            except NotFound:
                # The API server does not serve this collection (resource.k8s.io/v1 on a
                # cluster older than 1.34): nothing of it exists to watch. Say so, and
                # look again now and then (the API may be turned on).
                self.deliver("ABSENT", {})
                self.synced.set()
                self._stop.wait(ABSENT_RECHECK_SECONDS)
            except Exception as exc:  # any failure: log, back off, relist
                error = (exc.detail or str(exc)) if isinstance(exc, KubeError) else \
                    f"{type(exc).__name__}: {exc}"
                logs.event(f"{self.kind} watch failed; relisting", logging.WARNING,
                           error=error, retry_in=backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _list(self, first: bool) -> str:
        with translated(f"list {self.kind}", 30):
            resp = self.list_fn(_preload_content=False, _request_timeout=30)
            body = _json_object(f"list {self.kind}", resp.data)
        if not first:
            self.deliver("RESET", {})
        for item in body.get("items") or ():
            self.deliver("ADDED", item)
        self.deliver("SYNCED", {})
        self.synced.set()
        return str(body.get("metadata", {}).get("resourceVersion", ""))

    def _watch(self, rv: str) -> None:
        w = watch.Watch()  # type: ignore[no-untyped-call]
        while not self._stop.is_set():
            if self._relist.is_set():
                self._relist.clear()
                return
            window = self.window()
            # The server ends the request after ``window`` (whole seconds); a read that
            # waits three windows for a byte is a stalled connection, not a quiet one.
            with translated(f"watch {self.kind}", 3 * window):
                for ev in w.stream(  # type: ignore[no-untyped-call]
                        self.list_fn, resource_version=rv, allow_watch_bookmarks=True,
                        timeout_seconds=max(1, int(window)), _request_timeout=3 * window):
                    typ = ev.get("type")
                    raw = ev.get("raw_object") or {}
                    if typ == "ERROR":
                        code = raw.get("code")
                        raise KubeError(f"watch {self.kind}", f"error {code}",
                                        str(raw.get("message")))
                    meta = raw.get("metadata") or {}
                    rv = meta.get("resourceVersion", rv)
                    self.deliver("PROGRESS" if typ == "BOOKMARK" else str(typ),
                                 {} if typ == "BOOKMARK" else raw)
                    if self._stop.is_set():
                        return
            # The server closed the watch at its timeout: the stream was alive to the end.
            self.deliver("PROGRESS", {})


DEFAULT_WATCH_WINDOW = 15.0
ABSENT_RECHECK_SECONDS = 60.0


def _json_object(what: str, data: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise Unreachable(what, "the API server's answer is not JSON") from None
    if not isinstance(obj, dict):
        raise Unreachable(what, "the API server's answer is not an object")
    return obj


class Workloads:
    """Read one apps/v1 workload (for a scale request: its pod template) as a plain dict.
    RBAC: get on deployments, statefulsets and replicasets."""

    def __init__(self, api: client.ApiClient) -> None:
        apps = client.AppsV1Api(api)
        self._read: dict[str, Callable[..., Any]] = {
            "deployments": apps.read_namespaced_deployment,
            "statefulsets": apps.read_namespaced_stateful_set,
            "replicasets": apps.read_namespaced_replica_set,
        }

    def read(self, resource: str, namespace: str, name: str, timeout: float
             ) -> dict[str, Any]:
        what = f"read {resource.removesuffix('s')} {namespace}/{name}"
        fn = self._read.get(resource)
        if fn is None:
            raise KubeError(what, "not an apps/v1 workload this webhook reads")
        with translated(what, timeout):
            resp: Any = fn(name, namespace, _preload_content=False, _request_timeout=timeout)
        return _json_object(what, resp.data)


# --- the self-managed serving certificate ----------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredSecret:
    """A Secret's decoded data, its annotations and the resourceVersion it was read at."""

    data: dict[str, bytes]
    annotations: dict[str, str]
    resource_version: str | None  # None: the Secret does not exist yet


class Secrets:
    """Read and compare-and-swap write of one namespace's Secrets (the certificate Secret:
    RBAC allows get/update on that name only, and create)."""

    def __init__(self, api: client.ApiClient, namespace: str, timeout: float = 5.0) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.timeout = timeout

    def read(self, name: str) -> StoredSecret:
        what = f"read secret {self.namespace}/{name}"
        try:
            with translated(what, self.timeout):
                secret = self.core.read_namespaced_secret(name, self.namespace,
                                                          _request_timeout=self.timeout)
        except NotFound:
            return StoredSecret({}, {}, None)
        meta = secret.metadata
        try:
            data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
        except ValueError:
            raise KubeError(what, "its data is not base64") from None
        return StoredSecret(data, dict(meta.annotations or {}) if meta else {},
                            meta.resource_version if meta else None)

    def write(self, name: str, data: dict[str, bytes], annotations: dict[str, str],
              resource_version: str | None, labels: dict[str, str],
              secret_type: str = "kubernetes.io/tls") -> str:
        """Create (``resource_version`` None; AlreadyExists is a Conflict) or replace only
        if unchanged since read (else Conflict). Returns the new resourceVersion."""
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, namespace=self.namespace, labels=labels,
                                         annotations=annotations,
                                         resource_version=resource_version),
            type=secret_type,
            data={k: base64.b64encode(v).decode() for k, v in data.items()},
        )
        what = f"{'create' if resource_version is None else 'update'} secret " \
               f"{self.namespace}/{name}"
        with translated(what, self.timeout):
            out = (self.core.create_namespaced_secret(
                       self.namespace, body, _request_timeout=self.timeout)
                   if resource_version is None else
                   self.core.replace_namespaced_secret(
                       name, self.namespace, body, _request_timeout=self.timeout))
        return str(out.metadata.resource_version) if out.metadata else ""


WEBHOOK_KINDS = ("mutating", "validating")


class WebhookConfigurations:
    """The caBundle of named Mutating/ValidatingWebhookConfigurations (RBAC: get and
    patch on those names only)."""

    def __init__(self, api: client.ApiClient, timeout: float = 5.0) -> None:
        self.admission = client.AdmissionregistrationV1Api(api)
        self.timeout = timeout

    def _read(self, kind: str, name: str) -> dict[str, Any]:
        fn = (self.admission.read_mutating_webhook_configuration if kind == "mutating"
              else self.admission.read_validating_webhook_configuration)
        what = f"read {kind}webhookconfiguration {name}"
        with translated(what, self.timeout):
            resp: Any = fn(name, _preload_content=False, _request_timeout=self.timeout)
        return _json_object(what, resp.data)

    def ca_bundles(self, kind: str, name: str) -> dict[str, bytes]:
        """Each webhook's caBundle (decoded; empty when unset), by webhook name."""
        obj = self._read(kind, name)
        return {str(h.get("name")): base64.b64decode((h.get("clientConfig") or {})
                                                     .get("caBundle") or "")
                for h in obj.get("webhooks") or ()}

    def patch_ca_bundle(self, kind: str, name: str, bundle: bytes) -> list[str]:
        """Set ``caBundle`` of every webhook in the configuration that does not already
        hold ``bundle``; returns the names of the webhooks patched.

        A JSON Patch with a ``test`` of each webhook's name before its index is replaced:
        if the list changed between the read and the patch, the API server refuses the
        patch (a Conflict) instead of writing the bundle into the wrong webhook.
        """
        obj = self._read(kind, name)
        encoded = base64.b64encode(bundle).decode()
        ops: list[dict[str, Any]] = []
        patched = []
        for i, hook in enumerate(obj.get("webhooks") or ()):
            if (hook.get("clientConfig") or {}).get("caBundle") == encoded:
                continue
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle",
                        "value": encoded})
            patched.append(str(hook.get("name")))
        if not ops:
            return []
        fn = (self.admission.patch_mutating_webhook_configuration if kind == "mutating"
              else self.admission.patch_validating_webhook_configuration)
        what = f"patch caBundle of {kind}webhookconfiguration {name}"
        # 422, a failed ``test``: the webhooks changed since they were read.
        with translated(what, self.timeout, statuses={422: Conflict}):
            fn(name, ops, _content_type="application/json-patch+json",
               _preload_content=False, _request_timeout=self.timeout)
        return patched


# --- GPUPolicy objects -------------------------------------------------------------------

POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL = "gpu-webhook.dev", "v1alpha1", "gpupolicies"


class GPUPolicies:
    """One named GPUPolicy (cluster-scoped): read it, watch it, and replace its status
    subresource only if unchanged since it was read. RBAC: get, list and watch on
    gpupolicies; update on gpupolicies/status."""

    def __init__(self, api: client.ApiClient, name: str, timeout: float = 5.0) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.name = name
        self.timeout = timeout

    def read(self) -> dict[str, Any]:
        """The object as a plain dict; NotFound when there is none of that name (or no
        GPUPolicy CRD at all)."""
        what = f"read gpupolicy {self.name}"
        with translated(what, self.timeout):
            resp: Any = self.custom.get_cluster_custom_object(
                POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, self.name,
                _preload_content=False, _request_timeout=self.timeout)
        return _json_object(what, resp.data)

    def replace_status(self, obj: dict[str, Any]) -> None:
        """Write ``obj["status"]``; ``obj["metadata"]["resourceVersion"]`` is the
        precondition (a Conflict when the object changed since)."""
        with translated(f"update the status of gpupolicy {self.name}", self.timeout):
            self.custom.replace_cluster_custom_object_status(
                POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, self.name, obj,
                _preload_content=False, _request_timeout=self.timeout)

    def watcher(self, deliver: Callable[[str, dict[str, Any]], None]) -> Watcher:
        """A :class:`Watcher` of this one object (a field selector on its name)."""
        custom, name = self.custom, self.name

        def list_one(**kw: Any) -> Any:
            return custom.list_cluster_custom_object(
                POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL,
                field_selector=f"metadata.name={name}", **kw)

        return Watcher(self.api, POLICY_PLURAL, deliver, list_fn=list_one)


def list_objects(api: client.ApiClient, kind: str, namespace: str | None = None,
                 label_selector: str = "", timeout: float = 15.0) -> list[dict[str, Any]]:
    """One list of pods, namespaces, configmaps, deployments, statefulsets or jobs (in
    ``namespace``, or every namespace), as plain dicts: for the one-shot tools
    (``gpu-webhook status``, ``audit``), not the watches."""
    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    calls: dict[str, tuple[Callable[..., Any], Callable[..., Any] | None]] = {
        "pods": (core.list_pod_for_all_namespaces, core.list_namespaced_pod),
        "deployments": (apps.list_deployment_for_all_namespaces, apps.list_namespaced_deployment),
        "statefulsets": (apps.list_stateful_set_for_all_namespaces,
                         apps.list_namespaced_stateful_set),
        "jobs": (batch.list_job_for_all_namespaces, batch.list_namespaced_job),
        "configmaps": (core.list_config_map_for_all_namespaces,
                       core.list_namespaced_config_map),
        "namespaces": (core.list_namespace, None),
    }
    every, one = calls[kind]
    where = f"{kind} in {namespace}" if namespace else f"{kind} in all namespaces"
    kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": timeout}
    if label_selector:
        kw["label_selector"] = label_selector
    with translated(f"list {where}", timeout):
        resp = one(namespace, **kw) if namespace and one else every(**kw)
        body = _json_object(f"list {where}", resp.data)
    return list(body.get("items") or ())


# --- objects the webhook keeps: GPUQuota status, PolicyReports, its leader Lease --------

APPLY = "application/apply-patch+yaml"  # server-side apply (JSON is valid YAML)


class CustomObjects:
    """Server-side apply, list and delete of one namespaced custom resource, as plain
    dicts (the GPUQuota status objects, the audit's PolicyReports).

    An apply is create-or-update in one call, with no read first, and owns only the
    fields it sets under ``field_manager``: forced, because one writer (the leader
    replica) owns these objects and a previous leader's fields are its own too.
    """

    def __init__(self, api: client.ApiClient, group: str, version: str, plural: str,
                 field_manager: str = "gpu-webhook", timeout: float = 5.0) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.group, self.version, self.plural = group, version, plural
        self.field_manager = field_manager
        self.timeout = timeout

    def apply(self, obj: dict[str, Any], status: bool = False) -> None:
        """Apply ``obj`` (its ``status`` subresource alone when ``status``). Applying the
        status of an object that does not exist yet is a NotFound."""
        meta = obj["metadata"]
        ns, name = str(meta["namespace"]), str(meta["name"])
        what = f"apply {self.plural.removesuffix('s')}{' status' if status else ''} {ns}/{name}"
        fn = (self.custom.patch_namespaced_custom_object_status if status
              else self.custom.patch_namespaced_custom_object)
        with translated(what, self.timeout):
            fn(self.group, self.version, ns, self.plural, name, obj,
               field_manager=self.field_manager, force=True, _content_type=APPLY,
               _preload_content=False, _request_timeout=self.timeout)

    def list(self, label_selector: str = "", namespace: str | None = None
             ) -> list[dict[str, Any]]:
        """Every object in every namespace, or in ``namespace`` (with
        ``label_selector``). A resource the API server does not serve (its CRD not
        installed) is a NotFound."""
        what = f"list {self.plural}.{self.group}" + (f" in {namespace}" if namespace else "")
        kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout}
        if label_selector:
            kw["label_selector"] = label_selector
        with translated(what, self.timeout):
            resp: Any = (self.custom.list_namespaced_custom_object(
                self.group, self.version, namespace, self.plural, **kw) if namespace else
                self.custom.list_cluster_custom_object(
                    self.group, self.version, self.plural, **kw))
        return list(_json_object(what, resp.data).get("items") or ())

    def delete(self, namespace: str, name: str) -> None:
        """Delete one object; one already gone is fine."""
        what = f"delete {self.plural.removesuffix('s')} {namespace}/{name}"
        try:
            with translated(what, self.timeout):
                self.custom.delete_namespaced_custom_object(
                    self.group, self.version, namespace, self.plural, name,
                    _preload_content=False, _request_timeout=self.timeout)
        except NotFound:
            pass


@dataclass(frozen=True, slots=True)
class StoredLease:
    """A coordination.k8s.io Lease as leader election reads it."""

    holder: str  # "" when released
    duration: float  # leaseDurationSeconds
    transitions: int
    resource_version: str


class Leases:
    """Read and compare-and-swap write of Leases in one namespace (the leader Lease:
    RBAC get/update on that name, and create)."""

    def __init__(self, api: client.ApiClient, namespace: str, timeout: float = 5.0) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.timeout = timeout

    def read(self, name: str) -> StoredLease | None:
        what = f"read lease {self.namespace}/{name}"
        try:
            with translated(what, self.timeout):
                resp: Any = self.coordination.read_namespaced_lease(
                    name, self.namespace, _preload_content=False,
                    _request_timeout=self.timeout)
        except NotFound:
            return None
        obj = _json_object(what, resp.data)
        spec = obj.get("spec") or {}
        return StoredLease(str(spec.get("holderIdentity") or ""),
                           float(spec.get("leaseDurationSeconds") or 0),
                           int(spec.get("leaseTransitions") or 0),
                           str((obj.get("metadata") or {}).get("resourceVersion") or ""))

    def write(self, name: str, holder: str, duration: int, transitions: int,
              renewed: datetime, resource_version: str | None) -> None:
        """Create (``resource_version`` None; AlreadyExists is a Conflict) or replace only
        if unchanged since read (else Conflict)."""
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=name, namespace=self.namespace,
                                         labels={"app.kubernetes.io/name": "gpu-webhook"},
                                         resource_version=resource_version),
            spec=client.V1LeaseSpec(holder_identity=holder or None,
                                    lease_duration_seconds=duration,
                                    lease_transitions=transitions, renew_time=renewed))
        what = f"{'create' if resource_version is None else 'update'} lease " \
               f"{self.namespace}/{name}"
        with translated(what, self.timeout):
            if resource_version is None:
                self.coordination.create_namespaced_lease(
                    self.namespace, body, _preload_content=False,
                    _request_timeout=self.timeout)
            else:
                self.coordination.replace_namespaced_lease(
                    name, self.namespace, body, _preload_content=False,
                    _request_timeout=self.timeout)


AUDITED_WORKLOADS = ("deployments", "statefulsets", "jobs")
_TYPES = {"pods": ("v1", "Pod"), "deployments": ("apps/v1", "Deployment"),
          "statefulsets": ("apps/v1", "StatefulSet"), "jobs": ("batch/v1", "Job")}


def list_typed(api: client.ApiClient, kind: str, namespace: str | None = None,
               timeout: float = 30.0) -> list[dict[str, Any]]:
    """:func:`list_objects` of pods or a workload kind, each item with the apiVersion
    and kind a list leaves out (what the audit hands the admission pipeline)."""
    api_version, typ = _TYPES[kind]
    items = list_objects(api, kind, namespace, timeout=timeout)
    for item in items:
        item["apiVersion"], item["kind"] = api_version, typ
    return items
