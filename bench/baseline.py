"""The floor to compare with: a bare ASGI app that parses the review with orjson,
echoes the uid and allows, served with the same uvicorn settings as the webhook (our
SSLContext from ``webhook.server.run``, one worker, uvloop, httptools, no access log).

The difference between this and ``gpu-webhook serve`` on the same requests is what the
webhook itself costs: the envelope checks, the engine, metrics and the decision log.

    python -m bench.baseline --host 127.0.0.1 --port P --cert-dir D
"""

from __future__ import annotations

import argparse
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
    if scope["method"] == "POST":
        review = orjson.loads(b"".join(chunks))
        uid = review["request"]["uid"]
    body = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "response": {"uid": uid, "allowed": True}})
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
    settings = Settings.from_args(parser.parse_args(argv))
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
