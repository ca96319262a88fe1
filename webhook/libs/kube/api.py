"""The API client and its failures in the product's words: connecting from a kubeconfig
or the in-cluster service account, and every client exception translated into
:class:`Conflict`, :class:`NotFound` or :class:`Unreachable` with a message that says
what was tried (the client library's own text kept for the log only)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException


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
        raise status_error(what, int(exc.status or 0), exc.reason, exc.body,
                           statuses) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise network_error(what, exc, timeout) from None


def status_error(what: str, status: int, reason: object, body: object,
                 statuses: Mapping[int, type[KubeError]] | None = None) -> KubeError:
    """The error for an answer of HTTP ``status`` to ``what`` (see :func:`translated`)."""
    kind = (statuses or {}).get(status) or {404: NotFound, 409: Conflict}.get(
        status, Unreachable)
    words = _STATUS_WORDS.get(status) or (
        "the API server failed" if status >= 500 else "the API server refused it")
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    return kind(what, f"{words} (HTTP {status})",
                f"HTTP {status} {reason}: {str(body or '')[:500]}")


def network_error(what: str, exc: BaseException, timeout: float | None) -> Unreachable:
    """The error for a network, TLS or timeout failure of ``what``."""
    return Unreachable(what, _network_words(exc, timeout), f"{type(exc).__name__}: {exc}")


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


def body_bytes(resp: Any) -> bytes:
    """A raw answer's body; its connection back to the pool (urllib3 keeps a connection
    whose content was not preloaded until told), so the next call reuses it."""
    data: bytes = resp.data
    resp.release_conn()
    return data


def string_map(v: object) -> dict[str, str]:
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}


def resource_version_of(obj: object) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None


def json_object(what: str, data: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise Unreachable(what, "the API server's answer is not JSON") from None
    if not isinstance(obj, dict):
        raise Unreachable(what, "the API server's answer is not an object")
    return obj
