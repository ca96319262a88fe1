"""bench.overload's reading of what became of a creation: the API server's answers as it
words them when the webhook sheds a request (429) and when it gives up waiting for it
(its webhook timeout), taken from bench.overload runs against the real API server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _failed(message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "message": message, "reason": "InternalError", "code": 500}).encode()


SHED = ('Internal error occurred: failed calling webhook "validate.gpu-webhook.dev": failed '
        "to call webhook: the server has received too many requests and has asked us to try "
        "again later")
TIMEOUT = ('Internal error occurred: failed calling webhook "validate.gpu-webhook.dev": failed '
           'to call webhook: Post "https://127.0.0.1:48881/validate?timeout=5s": context '
           "deadline exceeded")


CASES = [
    (201, b"{}", "admitted"),
    (403, _failed("admission webhook denied the request"), "refused"),
    (403, _failed('admission webhook "validate.gpu-webhook.dev" denied the request: the GPU '
                  "quota ledger cannot be reached (no commit within 3.2s (0 conflicts so "
                  "far)), so this GPU pod cannot be counted against its quota."),
     "unavailable"),
    (500, _failed(SHED), "shed"),
    (500, _failed(TIMEOUT), "timeout"),
    (429, _failed("Too many requests, please try again later."), "apiserver-busy"),
    (500, _failed("etcdserver: leader changed"), "other"),
]


def test_each_answer_is_read_for_what_the_user_met() -> None:
    # Run as the benchmark runs (python -m, from the repository): the bench package is
    # not installed with the webhook.
    script = ("import json, sys; from bench.overload import classify; "
              "print(json.dumps([classify(s, b.encode()) for s, b in json.load(sys.stdin)]))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          input=json.dumps([(s, b.decode()) for s, b, _ in CASES]))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [what for _, _, what in CASES]
