"""The namespace -> tenant series the DCGM join needs, from the policy and the
namespaces the cluster cache knows (with their labels), as a scrape reads it."""

from __future__ import annotations

from metricskit import POLICY

from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text
from webhook.quota.store import MemoryStore
from webhook.server.metrics import StateCollector, namespace_tenants


def test_named_and_selected_namespaces_each_have_their_tenant() -> None:
    policy = compile_policy(load_text(POLICY.read_text(), str(POLICY)))
    known = {
        "serving-eu": {"gpu.example.com/tenant": "inference"},  # selected by label
        "serving-old": {},  # no label: no tenant, no series
        "research": {},  # named by the policy
        "kube-system": {},
    }
    assert namespace_tenants(policy, known) == [
        ("notebooks", "notebooks", "a100"),  # named, though the cache has not seen it
        ("research", "research", ""),  # two products allowed: none pinned
        ("research-dev", "research", ""),
        ("serving-eu", "inference", "l4"),
    ]


def test_the_series_follows_the_cache_at_each_scrape() -> None:
    policy = compile_policy(load_text(POLICY.read_text(), str(POLICY)))
    known: dict[str, dict[str, str]] = {}
    state = StateCollector(MemoryStore(), lambda: policy, lambda: known)

    def selected() -> set[str]:
        (family,) = [m for m in state.collect() if m.name == "gpu_webhook_namespace_tenant"]
        return {s.labels["namespace"] for s in family.samples
                if s.labels["tenant"] == "inference"}

    assert selected() == set()
    known["serving-eu"] = {"gpu.example.com/tenant": "inference"}
    assert selected() == {"serving-eu"}
