"""Builders for the quota tests: a small policy with caps, GPU pods as the cluster
stores them, and validating-webhook runs against a usage store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from kit import policy_yaml, validating

from webhook.engine.decision import Decision
from webhook.k8s.review import parse_review, request_review
from webhook.libs.kube import ConfigMaps
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text
from webhook.quota.cache import ClusterState
from webhook.quota.ledger import LedgerStore
from webhook.quota.store import MemoryStore

if TYPE_CHECKING:
    from fakeapi import FakeAPI

LEDGER_NAMESPACE = "gpu-webhook"
NOW = 1_800_000_000.0  # the wall clock of ledger tests: expiries are set against it

POLICY = policy_yaml("quota-test", """\
  gpuResources:
    names: [nvidia.com/gpu]
    patterns: ["nvidia.com/mig-*"]
    weights: {nvidia.com/mig-1g.10gb: 0.125}
  products:
    aliases: {a100: A100, h100: H100}
  tenants:
    - name: team-a
      namespaces: [team-a, team-a-dev]
      allowedProducts: [a100, h100]
      defaultProduct: a100
      quota:
        gpus: 8
        products: {a100: 6, h100: 4}
        pods: 5
        namespaces:
          team-a-dev: {gpus: 2}
    - name: team-b
      namespaces: [team-b]
      quota:
        resources: {nvidia.com/gpu: 4}
""")


def policy() -> CompiledPolicy:
    return compile_policy(load_text(POLICY))


def pod(name: str, namespace: str = "team-a", gpus: int | str = 1, *,
        resource: str = "nvidia.com/gpu", product: str | None = "A100",
        uid: str | None = None, phase: str | None = None,
        init: list[dict[str, Any]] | None = None,
        owner: tuple[str, str] | None = None) -> dict[str, Any]:
    """A pod as the API server stores it after the mutating webhook (pinned, both
    request and limit set)."""
    spec: dict[str, Any] = {"containers": [{
        "name": "main", "image": "x",
        "resources": {"limits": {resource: gpus}, "requests": {resource: gpus}}}]}
    if init:
        spec["initContainers"] = init
    if product:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": [product]}]}]}}}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": owner[0],
                                    "name": owner[1], "uid": "o", "controller": True}]
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if phase:
        out["status"] = {"phase": phase}
    return out


# The admission budget of these tests: a store over the fake API (real HTTP, real
# threads) must not be refused because a loaded machine held a thread for a second.
# The tests of a budget being spent give their own.
BUDGET = 20.0  # under the 30 s a "hang" fault of the fake API lasts


def admit(store: MemoryStore, p: CompiledPolicy, obj: dict[str, Any], *,
          dry_run: bool = False, operation: str = "CREATE",
          old: dict[str, Any] | None = None, budget: float = BUDGET) -> Decision:
    """Run the validating webhook with quota exactly as the server does (within
    ``budget`` seconds)."""
    review = request_review(obj, dry_run=dry_run, operation=operation)
    review["request"]["oldObject"] = old
    req = parse_review(orjson.dumps(review))
    return validating(req, p, store=store, budget=budget)


def ledger_replica(api: FakeAPI, p: CompiledPolicy | None = None, *,
                   timeout: float = 2.0) -> LedgerStore:
    """One webhook replica's store: its own cache (synced, empty) and the ledger shared
    through ``api``, on a wall clock stopped at :data:`NOW`."""
    p = p or policy()
    state = ClusterState(lambda: p)
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    return LedgerStore(state, ConfigMaps(api.api_client(), LEDGER_NAMESPACE,
                                         timeout=timeout), ttl=60, wall=lambda: NOW)
