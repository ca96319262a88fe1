"""Hot reload of the policy file by a running server, and starting/stopping like a user.

The server is started with ``--policy FILE --policy-poll-seconds 0.2``; the tests edit
the file as a platform engineer (or a ConfigMap update) would and watch /readyz and the
decisions: a broken edit keeps the last good policy serving and is reported, a good
edit takes effect and bumps the generation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit import Server, console_script, free_port, stop_server
from serverkit import ServerFactory, pod, review

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "policies" / "multi-tenant.yaml").read_text()
WAIT = 20.0  # the poll interval is 0.2 s; this only bounds a broken reload


def _until(what: str, probe: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _ready(client: httpx.Client) -> dict[str, Any]:
    return dict(client.get("/readyz").json())


def _allowed(client: httpx.Client, namespace: str) -> bool:
    r = client.post("/mutate", json=review(pod(namespace=namespace)))
    assert r.status_code == 200
    return bool(r.json()["response"]["allowed"])


def _replace(path: Path, text: str) -> None:
    """Swap the file in one rename, as a ConfigMap volume update does."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture
def policy_server(tmp_path: Path, serve: ServerFactory) -> tuple[Server, Path]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(EXAMPLE)
    return serve("--policy", str(policy), "--policy-poll-seconds", "0.2"), policy


BROKEN_EDITS = [
    ("unknown-field", EXAMPLE.replace("maxGpusPerPod: 8", "maxGpusPerPods: 8"),
     "unknown field 'maxGpusPerPods'"),
    ("yaml-syntax", EXAMPLE.replace("  tenants:\n", "  tenants: [\n"), "YAML syntax"),
    ("empty", "", "the file is empty"),
    ("unknown-product", EXAMPLE.replace("allowedProducts: [l4]", "allowedProducts: [t4]"),
     "product 't4' is not defined"),
]


@pytest.mark.parametrize(("text", "error"), [b[1:] for b in BROKEN_EDITS],
                         ids=[b[0] for b in BROKEN_EDITS])
def test_broken_edit_keeps_the_last_good_policy(policy_server: tuple[Server, Path],
                                                text: str, error: str) -> None:
    server, policy = policy_server
    c = server.client()
    assert _ready(c)["generation"] == 1
    policy.write_text(text)  # an in-place edit, not an atomic swap
    ready = _until("the reload error", lambda: (r := _ready(c))["lastReloadError"] and r)
    assert error in ready["lastReloadError"]
    assert "keeping generation 1" in ready["lastReloadError"]
    assert ready["generation"] == 1
    assert ready["ready"] is True
    assert ready["policy"] == "shared-gpu-cluster"
    # Still deciding with the old policy: research runs GPU pods, others do not.
    assert _allowed(c, "research")
    assert not _allowed(c, "vision")
    assert "policy reload failed" in server.log()


def test_good_edit_takes_effect_and_bumps_the_generation(
        policy_server: tuple[Server, Path]) -> None:
    server, policy = policy_server
    c = server.client()
    assert not _allowed(c, "vision")
    _replace(policy, EXAMPLE.replace("namespaces: [research, research-dev]",
                                     "namespaces: [research, research-dev, vision]"))
    ready = _until("generation 2", lambda: (r := _ready(c))["generation"] == 2 and r)
    assert ready["lastReloadError"] is None
    assert _allowed(c, "vision")
    # The old policy's objects are let back into the collector (webhook.server.heap):
    # settled at start, and again for the new policy.
    _until("the heap settled for the new policy",
           lambda: '"reason":"policy reloaded"' in server.log())
    assert '"reason":"started"' in server.log()


def test_bad_then_good_edit_clears_the_error(policy_server: tuple[Server, Path]) -> None:
    server, policy = policy_server
    c = server.client()
    policy.write_text("apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\n")
    _until("the reload error", lambda: _ready(c)["lastReloadError"])
    _replace(policy, EXAMPLE.replace("name: shared-gpu-cluster", "name: renamed-policy"))
    ready = _until("generation 2", lambda: (r := _ready(c))["generation"] == 2 and r)
    assert ready["policy"] == "renamed-policy"
    assert ready["lastReloadError"] is None
    metrics = c.get("/metrics").text
    assert 'gpu_webhook_policy_reloads_total{result="failure"} 1.0' in metrics


def test_policy_file_removed_keeps_serving(policy_server: tuple[Server, Path]) -> None:
    server, policy = policy_server
    c = server.client()
    policy.unlink()
    ready = _until("the reload error", lambda: (r := _ready(c))["lastReloadError"] and r)
    assert "missing" in ready["lastReloadError"]
    assert ready["generation"] == 1
    assert _allowed(c, "research")


def test_sigterm_stops_the_server_gracefully(serve: ServerFactory) -> None:
    server = serve()
    assert server.client().get("/healthz").status_code == 200
    # uvicorn shuts down gracefully, then re-raises the signal it caught so the exit
    # status still says "terminated by SIGTERM", as for any other process.
    assert stop_server(server) in (0, -signal.SIGTERM)
    assert "Finished server process" in server.log()
    assert "Traceback" not in server.log()


@pytest.mark.parametrize(("text", "error"), [
    (EXAMPLE.replace("mode: enforce", "mode: enforced"), "spec.mode"),
    ("kind: GPUPolicy\n", "apiVersion: required field is missing"),
    (None, "cannot read the file"),
], ids=["bad-mode", "no-api-version", "missing-file"])
def test_server_refuses_to_start_on_an_invalid_policy(tmp_path: Path, text: str | None,
                                                      error: str) -> None:
    policy = tmp_path / "policy.yaml"
    if text is not None:
        policy.write_text(text)
    done = subprocess.run(
        [console_script(), "serve", "--port", str(free_port()), "--host", "127.0.0.1",
         "--cert-dir", str(tmp_path / "certs"), "--policy", str(policy)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert "cannot start, the policy is invalid" in done.stdout
    assert error in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
