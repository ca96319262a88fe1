"""Every hostile AdmissionReview in ``cases`` gets its defined outcome: in-process
through the server's ASGI app (fast, every case), then over TLS from a real
``gpu-webhook serve`` subprocess (the same cases, as the API server would send them).

Never a 5xx, a non-JSON answer or a hang; never ``allowed: true`` for what the policy
refuses; the server stays healthy after the whole corpus.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import jsonpatch
import orjson
import pytest
from cases import CASES, Allow, Case, Deny, Error
from hostilekit import app, raw_request, start
from kit import Reply, Server, call_sync, stop_server

from webhook.server.web.app import AdmissionApp

WEBHOOKS = ("mutate", "validate")
# Generous: the slowest case (5,000 containers) takes a fraction of this on 2 cores.
PER_REQUEST_LIMIT = 10.0


def check(case: Case, webhook: str, status: int, body: bytes) -> None:
    """``status``/``body`` is the outcome ``case`` defines for ``webhook``."""
    expected = case.mutate if webhook == "mutate" else case.validate
    assert status < 500, f"{case.name} /{webhook}: HTTP {status}: {body[:300]!r}"
    doc = orjson.loads(body)  # every answer is JSON, errors included
    if isinstance(expected, Error):
        assert status == expected.status, f"{case.name} /{webhook}: {status} {doc}"
        assert isinstance(doc.get("error"), str) and expected.text in doc["error"], doc
        return
    assert status == 200, f"{case.name} /{webhook}: HTTP {status}: {doc}"
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    resp = doc["response"]
    assert resp["uid"] == case.uid
    assert ("patch" in resp) == ("patchType" in resp)
    if webhook == "validate":
        assert "patch" not in resp
    if isinstance(expected, Deny):
        assert resp["allowed"] is False, f"{case.name} /{webhook} was allowed"
        assert "patch" not in resp
        message = resp["status"]["message"]
        assert any(t in message for t in expected.text.split("|")), \
            f"{case.name} /{webhook}: {message[:500]}"
        assert "could not decide" not in message
        return
    assert isinstance(expected, Allow)
    assert resp["allowed"] is True, f"{case.name} /{webhook}: {resp.get('status')}"
    if expected.patch is not None:
        assert ("patch" in resp) == expected.patch, f"{case.name} /{webhook}: {resp}"
    if "patch" in resp:
        assert resp["patchType"] == "JSONPatch"
        ops = orjson.loads(base64.b64decode(resp["patch"]))
        obj = orjson.loads(case.body)["request"]["object"]
        jsonpatch.apply_patch(obj, ops)  # applies cleanly to the object as sent


@pytest.fixture(scope="module")
def asgi() -> AdmissionApp:
    return app()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_in_process(asgi: AdmissionApp, case: Case) -> None:
    for webhook in WEBHOOKS:
        reply: Reply = call_sync(asgi, f"/{webhook}", case.body)
        check(case, webhook, reply.status, reply.body)


def test_body_over_the_cap_is_refused_before_it_is_read_whole(asgi: AdmissionApp) -> None:
    # Delivered in small chunks with no Content-Length: refused once past the cap.
    big = b"{" + b" " * (5 * 1024 * 1024) + b"}"
    reply = call_sync(asgi, "/mutate", big, chunk=1 << 16)
    assert reply.status == 413 and "larger than" in reply.json()["error"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start(tmp_path_factory.mktemp("hostile"))
    yield s
    assert stop_server(s) in (0, -15)


def test_every_case_over_tls(server: Server) -> None:
    """One keep-alive connection, the whole corpus, both webhooks."""
    c = server.client(timeout=PER_REQUEST_LIMIT)
    for case in CASES:
        for webhook in WEBHOOKS:
            t0 = time.monotonic()
            r = c.post(f"/{webhook}", content=case.body,
                       headers={"content-type": "application/json"})
            assert time.monotonic() - t0 < PER_REQUEST_LIMIT
            check(case, webhook, r.status_code, r.content)
    assert c.get("/healthz").status_code == 200
    assert "Traceback" not in server.log()


def test_a_lying_content_length_is_refused_from_the_header(server: Server) -> None:
    """A Content-Length over the cap is answered 413 at once: the body is never read."""
    status, body = raw_request(server, "/validate",
                               f"Content-Length: {64 * 1024 * 1024}\r\n", b"{}",
                               timeout=PER_REQUEST_LIMIT)
    assert status == 413 and "larger than" in orjson.loads(body)["error"]
    assert server.client().get("/healthz").status_code == 200


def test_corpus_leaves_the_server_answering_normally(server: Server) -> None:
    c = server.client()
    body = next(case.body for case in CASES if case.name == "gpu-quantity-1e15")
    r = c.post("/validate", content=body)
    assert r.status_code == 200 and r.json()["response"]["allowed"] is False
    # No case made the engine fail (a failure is answered as a denial, and counted).
    assert "gpu_webhook_errors_total{" not in c.get("/metrics").text
