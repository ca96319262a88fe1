"""The ``patching`` floor of bench/apiserver.py (``bench.baseline --patch``) answers each
pod of the benchmark's mix with the patch gpu-webhook answers it with: otherwise what
it adds over the do-nothing webhook would not be what applying ours costs the API
server, and the ratio ours/patching would compare different work."""

from __future__ import annotations

import base64
import json

import orjson
import pytest
import yaml

from bench import apiserver
from bench.baseline import patch_like_ours
from bench.mix import run_now
from webhook.admission.webhooks import Cluster, Phase, admit, reply
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text

POLICY = compile_policy(load_text(yaml.safe_dump(apiserver.policy())))


def ours(pod: dict[str, object]) -> list[dict[str, object]]:
    req = parse_review(orjson.dumps(request_review(pod)))
    decision = run_now(admit(Phase.MUTATE, req, POLICY, Cluster(), 1.0))
    response = reply(Phase.MUTATE, req.uid, decision, req.api_version)["response"]
    patch: list[dict[str, object]] = json.loads(base64.b64decode(response["patch"]))
    return patch


@pytest.mark.parametrize("item", apiserver.items()[:10], ids=lambda i: f"{i.tenant}-{i.kind}")
def test_the_floor_patches_each_pod_of_the_mix_as_gpu_webhook_does(
        item: apiserver.Item) -> None:
    for n in (1, 2, 3):  # the unique pods differ in GPUs per request number
        pod = json.loads(item.body(n))
        pod["metadata"]["namespace"] = f"bench-{item.tenant}"
        assert patch_like_ours(pod) == ours(pod)
