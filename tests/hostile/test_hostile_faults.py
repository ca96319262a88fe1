"""Faults while serving: SIGTERM in the middle of load (requests in flight complete, the
process exits 0 within the grace period), and the policy file corrupted in ways the
loader must survive (the last good policy keeps serving, /readyz shows the error).
Startup refusals for missing or corrupt certificates are in tests/tls; a deleted policy
file and a schema-invalid edit are in tests/server.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest
from cases import gpu_pod, review
from hostilekit import POLICY, start
from kit import stop_server

BODY = orjson.dumps(review(gpu_pod(2)))
GRACE = 25.0  # uvicorn's graceful shutdown is 20 s


def test_sigterm_during_load_completes_in_flight_requests_and_exits_0(tmp_path: Path) -> None:
    server = start(tmp_path)
    # A request in flight: headers and half its body sent before the signal.
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    conn = server.context().wrap_socket(raw, server_hostname="localhost")
    conn.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                 b"\r\nContent-Length: " + str(len(BODY)).encode() + b"\r\n\r\n"
                 + BODY[:100])
    answers: list[int | str] = []
    stop_flood = threading.Event()

    def flood() -> None:
        with httpx.Client(base_url=server.base_url, verify=server.context(), timeout=30) as c:
            while not stop_flood.is_set():
                try:
                    answers.append(c.post("/validate", content=BODY).status_code)
                except httpx.HTTPError as exc:  # refused or closed once shutdown began
                    answers.append(type(exc).__name__)
                    time.sleep(0.05)

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for t in threads:
        t.start()
    # Ordered by events, not sleeps: the load is being answered, then the signal is
    # received (uvicorn logs it), then the in-flight request's body completes.
    _until("answers under load", lambda: answers.count(200) >= 4)
    server.process.terminate()
    _until("the server to begin its shutdown", lambda: "Shutting down" in server.log())
    conn.sendall(BODY[100:])  # the in-flight request finishes after the signal
    head = conn.recv(65536)
    conn.close()
    code = server.process.wait(GRACE)  # uvicorn's grace period ends it by then
    stop_flood.set()
    for t in threads:
        t.join(30)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    assert code == 0, (code, server.log()[-2000:])
    assert answers.count(200) > 0
    assert not [a for a in answers if isinstance(a, int) and a >= 500], answers
    assert "Traceback" not in server.log()


def _until(what: str, ok: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60  # a guard against a hang, never a measurement
    while not ok():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


@pytest.mark.parametrize(("content", "error"), [
    ("[" * 100_000, "nested more than"),
    ("spec: !!python/object/apply:os.system [id]\n", "YAML tags"),
    ("apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\nmetadata: {name: x}\n"
     "spec: {mode: 2024-13-45}\n", "month must be in 1..12"),
    ("\0\0\0", "special characters"),
    ("#" * (2 * 1024 * 1024), "larger than"),
], ids=["deep-nesting", "python-tag", "impossible-date", "nul-bytes", "oversized"])
def test_corrupted_policy_keeps_the_last_good_one_and_readyz_says_why(
        tmp_path: Path, content: str, error: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text())
    server = start(tmp_path, "--policy-poll-seconds", "0.1", policy=policy)
    try:
        c = server.client()
        tmp = tmp_path / "policy.new"
        tmp.write_text(content)
        tmp.replace(policy)  # atomically, as a ConfigMap update is
        deadline = time.monotonic() + 20
        ready = c.get("/readyz").json()
        while not ready["lastReloadError"] and time.monotonic() < deadline:
            time.sleep(0.1)
            ready = c.get("/readyz").json()
        assert error in (ready["lastReloadError"] or ""), ready
        assert ready["generation"] == 1 and ready["ready"] is True
        r = c.post("/validate", content=orjson.dumps(review(gpu_pod(100))))
        assert r.status_code == 200 and r.json()["response"]["allowed"] is False
        assert "Traceback" not in server.log()
    finally:
        stop_server(server)
