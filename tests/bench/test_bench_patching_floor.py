"""The ``patching`` floor of bench/apiserver.py (``bench.baseline --patch``) answers each
pod of the benchmark's mix with the patch gpu-webhook answers it with: otherwise what
it adds over the do-nothing webhook would not be what applying ours costs the API
server, and the ratio ours/patching would compare different work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Run as the benchmark runs (python -m, from the repository): the bench package is not
# installed with the webhook, and tests/bench would shadow it here.
SCRIPT = """
import base64, json, orjson, yaml
from bench import apiserver
from bench.baseline import patch_like_ours
from bench.mix import run_now
from webhook.admission.webhooks import Cluster, Phase, admit, reply
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text

policy = compile_policy(load_text(yaml.safe_dump(apiserver.policy())))
out = []
for item in apiserver.items():
    for n in (1, 2, 3):  # the unique pods differ in GPUs per request number
        pod = json.loads(item.body(n))
        pod["metadata"]["namespace"] = f"bench-{item.tenant}"
        req = parse_review(orjson.dumps(request_review(pod)))
        decision = run_now(admit(Phase.MUTATE, req, policy, Cluster(), 1.0))
        response = reply(Phase.MUTATE, req.uid, decision, req.api_version)["response"]
        ours = json.loads(base64.b64decode(response["patch"]))
        out.append([f"{item.tenant}/{item.kind}/{n}", patch_like_ours(pod), ours])
print(json.dumps(out))
"""


def test_the_floor_patches_each_pod_of_the_mix_as_gpu_webhook_does() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pods = json.loads(proc.stdout)
    kinds = {name.split("/")[1] for name, _, _ in pods}
    assert kinds == {"replicaset", "job", "unique", "non-gpu-tolerating", "non-gpu",
                     "denied"}
    for name, floor, ours in pods:
        assert floor == ours, name
