"""Borrowing in /metrics: a server running policies/examples/cohorts.yaml, sent the
reviews the API server would send, shows what each tenant borrows and lends, and what
the cohort is overdrawn by once a lender takes its GPUs back."""

from __future__ import annotations

import base64
import copy
import uuid
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
from metricskit import ROOT, Server, serve, value

from webhook.k8s.review import request_review

COHORTS = ROOT / "policies" / "examples" / "cohorts.yaml"


def create(server: Server, name: str, namespace: str, gpus: int) -> dict[str, Any]:
    """Mutate, apply the patch, validate: the validating reply."""
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": namespace},
                           "spec": {"containers": [{"name": "main", "image": "cuda",
                                    "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}
    m = server.post("/mutate", request_review(pod, uid=str(uuid.uuid4()))).json()["response"]
    assert m["allowed"], m
    final = copy.deepcopy(pod)
    if m.get("patch"):
        final = jsonpatch.apply_patch(final, orjson.loads(base64.b64decode(m["patch"])))
    final["metadata"]["uid"] = str(uuid.uuid4())
    v: dict[str, Any] = server.post("/validate", request_review(
        final, uid=str(uuid.uuid4()))).json()["response"]
    return v


def test_borrowed_lendable_and_overdrawn_gpus_per_cohort(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(COHORTS.read_text())
    with serve(tmp_path, policy) as server:
        before = server.samples()
        # Nothing borrowed; speech lends 6 of its idle 8 (lendingLimit), vision all 8.
        assert value(before, "gpu_webhook_cohort_lendable_gpus", tenant="speech") == 6
        assert value(before, "gpu_webhook_cohort_lendable_gpus", tenant="vision") == 8
        assert value(before, "gpu_webhook_cohort_borrowed_gpus", cohort="research") == 0

        assert create(server, "own", "vision", 8)["allowed"]
        assert create(server, "extra", "vision", 4)["allowed"]  # borrowed
        now = server.samples()
        assert value(now, "gpu_webhook_cohort_borrowed_gpus", tenant="vision") == 4
        assert value(now, "gpu_webhook_cohort_lendable_gpus", tenant="vision") == 0
        assert value(now, "gpu_webhook_mutations_total", change="borrowed") == 1

        # speech takes its 8 back and nlp its 4: nothing is lendable, 4 overdrawn.
        assert create(server, "asr", "speech", 8)["allowed"]
        assert create(server, "bert", "nlp", 4)["allowed"]
        after = server.samples()
        assert value(after, "gpu_webhook_cohort_overdrawn_gpus", cohort="research") == 4
