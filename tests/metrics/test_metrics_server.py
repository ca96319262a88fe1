"""/metrics of a real ``gpu-webhook serve`` moves with real admissions: decisions,
latency, findings, mutations, quota usage; and hot reload keeps serving."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from metricskit import POLICY, Server, pod_review, value, wait_for, write_policy

ADMISSIONS = "gpu_webhook_admission_requests_total"
LATENCY_COUNT = "gpu_webhook_admission_duration_seconds_count"


def test_counters_and_histograms_move_with_admissions(server: Server) -> None:
    before = server.samples()
    assert server.post("/mutate", pod_review("ok-0", "research")).status_code == 200
    denied = server.post("/mutate", pod_review("bad-0", "research", 2, request=1)).json()
    assert denied["response"]["allowed"] is False
    nb = server.post("/mutate", pod_review("nb-0", "notebooks")).json()
    assert nb["response"]["allowed"] is True and nb["response"]["warnings"]
    after = server.samples()

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved(ADMISSIONS, webhook="mutate", decision="allowed") == 1
    assert moved(ADMISSIONS, webhook="mutate", decision="denied") == 1
    assert moved(ADMISSIONS, webhook="mutate", decision="warned") == 1
    assert moved(LATENCY_COUNT, webhook="mutate") == 3
    # Each review's phases, beside its whole time (bench/README.md reads their shares).
    for phase in ("parse", "decide"):
        assert moved("gpu_webhook_admission_phase_seconds_count", webhook="mutate",
                     phase=phase) == 3
    assert value(after, "gpu_webhook_admission_duration_seconds_bucket", webhook="mutate",
                 le="+Inf") >= 3
    # A review answered just inside the longest timeout the API server allows a webhook
    # (timeoutSeconds <= 30) still lands in a finite bucket: its quantile is readable.
    bounds = {float(dict(ls)["le"]) for (n, ls) in after
              if n == "gpu_webhook_admission_duration_seconds_bucket"}
    assert max(b for b in bounds if b != float("inf")) >= 30
    assert {2.5, 5.0} <= bounds  # around the shipped webhooks' timeoutSeconds: 5
    assert moved("gpu_webhook_rule_findings_total", rule="gpu-requests-match-limits",
                 mode="enforce", tenant="research") == 1
    assert moved("gpu_webhook_rule_findings_total", rule="allowed-resources", mode="warn",
                 tenant="notebooks") == 1
    assert moved("gpu_webhook_mutations_total", change="gpu-requests") == 2
    assert moved("gpu_webhook_mutations_total", change="gpu-node-affinity") == 2


def test_quota_used_follows_a_validated_pod(server: Server) -> None:
    def used(name: str) -> float:
        return value(server.samples(), "gpu_webhook_quota_used", tenant="research",
                     scope="tenant", name=name)

    s = server.samples()
    assert value(s, "gpu_webhook_quota_limit", tenant="research", scope="tenant",
                 name="gpus") == 32
    assert value(s, "gpu_webhook_quota_limit", tenant="research", scope="namespace",
                 namespace="research-dev", name="gpus") == 4
    assert value(s, "gpu_webhook_quota_limit", tenant="research", scope="tenant",
                 name="product:h100") == 8
    assert used("gpus") == 0
    reservations = value(s, "gpu_webhook_quota_reservations_total")

    r = server.post("/validate", pod_review("trainer-0", "research", 3, mutated=True)).json()
    assert r["response"]["allowed"] is True, r
    assert used("gpus") == 3
    assert used("product:a100") == 3
    assert used("pods") == 1
    # A dry run is checked, never reserved.
    dry = pod_review("trainer-1", "research", 2, mutated=True, dry_run=True)
    assert server.post("/validate", dry).json()["response"]["allowed"] is True
    s = server.samples()
    assert value(s, "gpu_webhook_quota_used", tenant="research", scope="tenant",
                 name="gpus") == 3
    assert value(s, "gpu_webhook_quota_reservations_total") == reservations + 1
    assert value(s, "gpu_webhook_cache_synced") == 1
    assert value(s, "gpu_webhook_certificate_expiry_timestamp_seconds") > time.time() + 86400


def test_a_broken_policy_edit_keeps_the_old_policy(server: Server, policy_file: Path) -> None:
    generation = server.generation()
    failures = value(server.samples(), "gpu_webhook_policy_reloads_total", result="failure")
    write_policy(policy_file, text=policy_file.read_text().replace("gpus: 32", "gpus: lots"))
    wait_for(lambda: value(server.samples(), "gpu_webhook_policy_reloads_total",
                           result="failure") == failures + 1, "the reload failure")
    ready = server.client.get(server.url + "/readyz").json()
    assert ready["generation"] == generation
    assert "quota.gpus" in ready["lastReloadError"]
    # Still the old policy: research may hold 32 GPUs, so 8 are fine; still denying too.
    r = server.post("/validate", pod_review("big", "research", 8, mutated=True)).json()
    assert r["response"]["allowed"] is True
    assert server.post("/mutate", pod_review("x", "research", 2, request=1)).json()[
        "response"]["allowed"] is False
    assert value(server.samples(), "gpu_webhook_policy_generation") == generation


def test_reloads_during_a_stream_of_requests_lose_none(server: Server, policy_file: Path
                                                       ) -> None:
    swaps = 5
    start = server.generation()
    answers: list[tuple[int, dict[str, object], str]] = []
    done = threading.Event()

    def stream() -> None:
        # At least 300 requests, and on until every swap has been served.
        i = 0
        while i < 300 or not done.is_set():
            review = pod_review(f"p-{i}", "research", 1 + i % 4)
            r = server.post("/mutate" if i % 2 else "/validate", review)
            answers.append((r.status_code, r.json(), review["request"]["uid"]))
            i += 1

    worker = threading.Thread(target=stream)
    worker.start()
    try:
        for n in range(swaps):
            # Alternate research's per-pod cap between 8 and 2: decisions flip each swap.
            text = POLICY.read_text().replace("name: shared-gpu-cluster", f"name: swap-{n}")
            if n % 2 == 0:
                text = text.replace("maxGpusPerPod: 8", "maxGpusPerPod: 2")
            write_policy(policy_file, text=text)
            wait_for(lambda n=n: server.generation() == start + n + 1, f"policy swap {n}")
    finally:
        done.set()
        worker.join(timeout=300)
    assert not worker.is_alive()
    assert len(answers) >= 300
    assert server.generation() == start + swaps
    denied = sum(not body["response"]["allowed"] for _, body, _ in answers)  # type: ignore[index]
    assert 0 < denied < len(answers)  # both policies answered some of the requests
    for status, body, uid in answers:
        assert status == 200, body
        response = body["response"]
        assert isinstance(response, dict) and response["uid"] == uid
        assert isinstance(response["allowed"], bool)
        assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    reloads = value(server.samples(), "gpu_webhook_policy_reloads_total", result="success")
    assert reloads == 1 + swaps
