"""A DRA template (or claim) a pod names before the watch has delivered it is read from
the API server before the pod is decided (``webhook.admission.claimreads``), as
``kubectl apply -f`` of one file with both makes happen: the pod is admitted and charged
the template's devices, not refused as unseen. Only a miss is read; a name the API
server does not know, or a read that fails, is said so in the denial.

The reader here stands in for ``webhook.server.cluster.claim_reader`` (the one read of
``webhook.libs.kube.ResourceClaims``, run against a real API server in
``tests/e2e/test_e2e_dra.py``); the cache is the real watch-fed ``ClaimCache``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from webhook.admission.claimreads import ClaimUnreadable
from webhook.admission.webhooks import Cluster, Phase, admit
from webhook.engine.decision import Decision
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text
from webhook.quota.claims import ClaimCache
from webhook.quota.store import MemoryStore

EXAMPLE = Path(__file__).parents[2] / "policies" / "multi-tenant.yaml"
NS = "research"


def policy() -> CompiledPolicy:
    return compile_policy(load_text(EXAMPLE.read_text(), str(EXAMPLE)))


def template(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": count,
                "selectors": [{"cel": {"expression": (
                    "device.attributes['gpu.nvidia.com'].productName.replace(' ', '-') "
                    "in ['NVIDIA-A100-SXM4-80GB']")}}]}}]}}}}


def dra_pod(name: str, template_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "train", "image": "train:1",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu",
                                         "resourceClaimTemplateName": template_name}],
                     "affinity": {"nodeAffinity": {
                         "requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [
                                 {"key": "topology.example.com/gpu-rack", "operator": "In",
                                  "values": ["rack-a"]}]}]}}}}}


class APIServer:
    """What the API server holds, read as the server's claim reader reads it."""

    def __init__(self, *objects: dict[str, Any], failing: str | None = None,
                 silent: bool = False) -> None:
        self.objects = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o
                        for o in objects}
        self.failing, self.silent = failing, silent
        self.reads: list[tuple[str, str, str]] = []

    async def read(self, kind: str, namespace: str, name: str, timeout: float
                   ) -> Mapping[str, Any] | None:
        self.reads.append((kind, namespace, name))
        if self.silent:
            await asyncio.Event().wait()  # never answers: the reader's deadline ends it
        if self.failing:
            raise ClaimUnreadable(self.failing)
        return self.objects.get((kind, namespace, name))


def decide(phase: Phase, obj: dict[str, Any], cache: ClaimCache, api: APIServer,
           store: MemoryStore | None = None, budget: float = 2.0) -> Decision:
    req = parse_review(orjson.dumps(request_review(obj)))
    cluster = Cluster(store=store, claims=cache.lookup, read_claim=api.read)
    return asyncio.run(admit(phase, req, policy(), cluster, budget))


def empty_cache() -> ClaimCache:
    cache = ClaimCache(policy, lambda ns: None)
    return cache


def test_a_template_the_watch_has_not_delivered_is_read_and_the_pod_admitted() -> None:
    api = APIServer(template("two", 2))
    store = MemoryStore(ttl=60)
    d = decide(Phase.VALIDATE, dra_pod("a", "two"), empty_cache(), api, store)
    assert d.allowed, d.message
    assert api.reads == [("ResourceClaimTemplate", NS, "two")]
    # Charged the template's two devices, as if the watch had delivered it.
    assert store.view().tenant("research").gpus == 2


def test_the_mutating_webhook_reads_it_too_and_pins_the_pod_as_a_gpu_pod() -> None:
    # The mutating webhook sees the pod first: it refused it as unseen before.
    api = APIServer(template("two", 2))
    pod = dra_pod("a", "two")
    del pod["spec"]["affinity"]
    d = decide(Phase.MUTATE, pod, empty_cache(), api)
    assert d.allowed, d.message
    assert api.reads == [("ResourceClaimTemplate", NS, "two")]
    # Decided as the GPU pod it is: tolerated onto GPU nodes, pinned to its racks.
    assert d.mutations == ["gpu-tolerations", "gpu-node-affinity"]


def test_a_template_the_cache_holds_is_not_read() -> None:
    cache = empty_cache()
    cache.event("ResourceClaimTemplate", "ADDED", template("two", 2))
    api = APIServer()
    d = decide(Phase.VALIDATE, dra_pod("a", "two"), cache, api)
    assert d.allowed, d.message
    assert api.reads == []


def test_a_template_the_api_server_has_not_either_is_said_not_to_exist() -> None:
    d = decide(Phase.VALIDATE, dra_pod("a", "nope"), empty_cache(), APIServer())
    assert not d.allowed
    assert ("uses ResourceClaimTemplate nope, which does not exist in its namespace (the "
            "webhook asked the API server), so the GPUs it asks for cannot be counted. "
            "Create the template first, or fix its name in spec.resourceClaims.") in d.message
    assert "[rule unknown-claim, tenant research]" in d.message


def test_a_read_that_fails_says_why() -> None:
    api = APIServer(failing="the webhook's service account is not allowed to do this "
                            "(check its RBAC) (HTTP 403)")
    d = decide(Phase.VALIDATE, dra_pod("a", "two"), empty_cache(), api)
    assert not d.allowed
    assert ("which the webhook has not seen yet and could not read from the API server "
            "(the webhook's service account is not allowed to do this (check its RBAC) "
            "(HTTP 403)), so the GPUs it asks for cannot be counted. Retry in a moment"
            in d.message)


def test_an_api_server_that_does_not_answer_is_given_up_within_the_budget() -> None:
    d = decide(Phase.VALIDATE, dra_pod("a", "two"), empty_cache(), APIServer(silent=True),
               budget=0.4)
    assert not d.allowed
    assert "could not read from the API server (the API server did not answer within 0.2s)" \
        in d.message
