"""The floor to compare with: a bare ASGI app that parses the review with orjson,
echoes the uid and allows, served with the same uvicorn settings as the webhook (our
SSLContext from ``webhook.server.run``, one worker, uvloop, httptools, no access log).

The difference between this and ``gpu-webhook serve`` on the same requests is what the
webhook itself costs: the envelope checks, the engine, metrics and the decision log.

With ``--patch`` it answers each pod's mutating review with a JSON Patch of the shape
gpu-webhook's (for a GPU pod: the GPU request equal to its limit, the GPU toleration, a
node affinity for the product, the ``mutated`` annotation; for another pod: GPU devices
hidden and the GPU toleration stripped), built from the pod with no policy and no
checks. Through a real API server it is the floor of any webhook that changes pods:
what the API server itself spends applying a patch (bench/apiserver.py, ``patching``).

    python -m bench.baseline --host 127.0.0.1 --port P --cert-dir D [--patch]
"""

from __future__ import annotations

import argparse
import base64
import ssl
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
import uvicorn
import uvloop

from webhook.server.certs import tls
from webhook.server.settings import Settings

Message = MutableMapping[str, Any]
HEADERS = [(b"content-type", b"application/json")]


GPU = "nvidia.com/gpu"
_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [{
        "key": "nvidia.com/gpu.product", "operator": "In",
        "values": ["NVIDIA-A100-SXM4-80GB"]}]}]}}}


def patch_like_ours(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON Patch gpu-webhook returns for the pods bench/apiserver.py and
    bench/scale.py create (single container, no requests, no affinity), made without a
    policy."""
    spec = pod.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    limits = (container.get("resources") or {}).get("limits") or {}

    def annotate(value: str) -> dict[str, Any]:
        # A Job's pods come with the annotations of its template: the key is added.
        if (pod.get("metadata") or {}).get("annotations"):
            return {"op": "add", "path": "/metadata/annotations/gpu-webhook.dev~1mutated",
                    "value": value}
        return {"op": "add", "path": "/metadata/annotations",
                "value": {"gpu-webhook.dev/mutated": value}}

    if GPU in limits:
        toleration = ({"op": "add", "path": "/spec/tolerations/-", "value": _TOLERATION}
                      if "tolerations" in spec else
                      {"op": "add", "path": "/spec/tolerations", "value": [_TOLERATION]})
        return [{"op": "add", "path": "/spec/containers/0/resources/requests",
                 "value": {GPU: limits[GPU]}},
                toleration,
                {"op": "add", "path": "/spec/affinity", "value": _AFFINITY},
                annotate("gpu-requests,gpu-tolerations,gpu-node-affinity")]
    ops: list[dict[str, Any]] = [
        {"op": "remove", "path": f"/spec/tolerations/{i}"}
        for i, t in reversed(list(enumerate(spec.get("tolerations") or [])))
        if t.get("key") == GPU]
    return [*ops, {"op": "add", "path": "/spec/containers/0/env",
                   "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]},
            annotate(("strip-gpu-tolerations," if ops else "") + "gpu-visible-devices")]


PATCH = False  # --patch: answer mutating reviews as patch_like_ours


async def app(scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Message]],
              send: Callable[[Message], Awaitable[None]]) -> None:
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    uid = ""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if scope["method"] == "POST":
        review = orjson.loads(b"".join(chunks))
        response["uid"] = review["request"]["uid"]
        # Pods only: a workload's template (bench/scale.py's Jobs) is let through as
        # sent, and its pods are patched as they are created.
        if (PATCH and scope["path"] == "/mutate" and review["request"].get("object")
                and review["request"].get("kind", {}).get("kind") == "Pod"):
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(
                orjson.dumps(patch_like_ours(review["request"]["object"]))).decode()
    body = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "response": response})
    await send({"type": "http.response.start", "status": 200,
                "headers": [*HEADERS, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class _Config(uvicorn.Config):
    """uvicorn's Config with the webhook's SSLContext in place of the one it would build:
    stock uvicorn TLS (the loop's create_server), where the webhook's own server accepts
    and starts TLS itself to cap connections (webhook.server.web.listen.Acceptor)."""

    def __init__(self, app: Any, context: ssl.SSLContext, **kw: Any) -> None:
        super().__init__(app, **kw)
        self._context = context

    def load(self) -> None:
        super().load()
        self.ssl = self._context


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.baseline", description=__doc__)
    Settings.add_arguments(parser)
    parser.add_argument("--patch", action="store_true",
                        help="answer pods' mutating reviews with a patch shaped like ours")
    args = parser.parse_args(argv)
    global PATCH
    PATCH = args.patch
    settings = Settings.from_args(args)
    cert, key = tls.tls_files(settings)
    context = tls.ssl_context(settings, cert, key)
    # The keyword arguments of serve.run's uvicorn config, with uvicorn's own httptools
    # protocol: the floor is stock uvicorn. The webhook's protocol
    # (webhook.server.web.listen.AdmissionProtocol)
    # adds the ASGI tls extension and the arrival stamp, a cost of the webhook, and
    # writes each response in one TLS record where uvicorn writes two, a saving of the
    # webhook (bench/README.md gives what the baseline would gain from the same).
    config = _Config(
        app, context, host=settings.host, port=settings.port, loop="uvloop", http="httptools",
        lifespan="off", access_log=False, log_config=None, timeout_keep_alive=30,
        timeout_graceful_shutdown=20,
    )
    uvloop.run(uvicorn.Server(config).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
