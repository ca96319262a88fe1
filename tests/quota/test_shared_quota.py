"""``quota.sharedGpus``: a tenant's cap on GPUs held as shares of devices (time-sliced
units, HAMi vGPUs, KAI fractions), apart from its whole GPUs, counted in the same
totals, ledger entries and commit as every other cap."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fakeapi import FakeAPI
from kit import policy_yaml
from quotakit import admit

from webhook.engine.charge import charge_of_pod
from webhook.libs.kube import ConfigMaps
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text
from webhook.quota import status
from webhook.quota.cache import ClusterState
from webhook.quota.entries import LEDGER_PREFIX, decode
from webhook.quota.ledger import LedgerStore
from webhook.quota.store import MemoryStore
from webhook.quota.usage import Usage

NS = "gpu-webhook"
NOW = 1_800_000_000.0
SHARED = "nvidia.com/gpu.shared"

POLICY = policy_yaml("shared-quota", """\
  gpuResources:
    names: [nvidia.com/gpu]
    timeSlicing: {nvidia.com/gpu.shared: 4}
    kai: {deviceMemory: 81920}
  tenants:
    - name: team-a
      namespaces: [team-a, team-a-dev]
      quota:
        gpus: 4
        sharedGpus: 1
        namespaces:
          team-a-dev: {sharedGpus: 0.5}
""")


def policy() -> CompiledPolicy:
    return compile_policy(load_text(POLICY))


def pod(name: str, namespace: str = "team-a", *, units: int = 0, whole: int = 0,
        fraction: str | None = None) -> dict[str, Any]:
    limits = {**({SHARED: units} if units else {}), **({"nvidia.com/gpu": whole} if whole else {})}
    c: dict[str, Any] = {"name": "main", "image": "x"}
    if limits:
        c["resources"] = {"limits": limits, "requests": dict(limits)}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if fraction is not None:
        meta["annotations"] = {"gpu-fraction": fraction}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [c]}}


def test_shares_are_charged_apart_from_whole_gpus() -> None:
    p = policy()
    assert charge_of_pod(pod("s", units=2), p).shared == 0.5  # type: ignore[union-attr]
    assert charge_of_pod(pod("k", fraction="0.25"), p).shared == 0.25  # type: ignore[union-attr]
    whole = charge_of_pod(pod("w", whole=2), p)
    assert whole is not None and whole.shared == 0.0 and whole.gpus == 2.0


def test_the_shared_cap_refuses_shares_and_leaves_whole_gpus_to_the_gpu_cap() -> None:
    p, store = policy(), MemoryStore(ttl=60)
    decisions = [admit(store, p, pod(f"s{i}", units=1)) for i in range(4)]
    assert all(d.allowed for d in decisions), [d.message for d in decisions]
    fifth = admit(store, p, pod("s4", units=1))
    assert not fifth.allowed
    assert "would use 1.25 of its 1 shared GPUs: 1 in use" in fifth.message
    kai = admit(store, p, pod("k", fraction="0.5"))
    assert not kai.allowed and "shared GPUs" in kai.message
    # Whole GPUs are not shares: 1 (the shares) + 3 fits the cap of 4 GPUs.
    assert admit(store, p, pod("w", whole=3)).allowed


def test_a_namespace_cap_on_shares_binds_its_namespace() -> None:
    p, store = policy(), MemoryStore(ttl=60)
    assert admit(store, p, pod("d0", "team-a-dev", units=2)).allowed
    d = admit(store, p, pod("d1", "team-a-dev", units=1))
    assert not d.allowed
    assert "namespace team-a-dev" in d.message and "shared GPUs" in d.message


def replica(api: FakeAPI, p: CompiledPolicy) -> LedgerStore:
    state = ClusterState(lambda: p)
    state.pod_event("SYNCED", {})
    state.namespace_event("SYNCED", {})
    return LedgerStore(state, ConfigMaps(api.api_client(), NS, timeout=10.0), ttl=60,
                       wall=lambda: NOW)


def test_the_ledger_entry_carries_the_share_and_another_replica_counts_it(
        api: FakeAPI) -> None:
    p = policy()
    one, two = replica(api, p), replica(api, p)
    assert admit(one, p, pod("s0", units=3)).allowed
    data = api.data(NS, LEDGER_PREFIX + "team-a")
    assert orjson.loads(data["reservations"])["uid-s0"]["shared"] == 0.75
    assert decode("team-a", data, NOW)["uid-s0"].charge.shared == 0.75
    # The other replica decides on the ledger: 0.75 + 0.5 is over the cap of 1.
    d = admit(two, p, pod("k", fraction="0.5"))
    assert not d.allowed
    assert "0.75 in use" in d.message


def entry(**extra: Any) -> dict[str, Any]:
    return {"ns": "team-a", "owner": "pod/x", "product": None,
            "resources": {SHARED: 2}, "gpus": 0.5, "expires": NOW + 30, **extra}


@pytest.mark.parametrize("shared", [-0.5, "0.5", True, 2.0, 1e12])
def test_a_ledger_entry_with_an_impossible_share_is_refused(shared: Any) -> None:
    # Negative, not a number, or more than the entry's GPUs: never taken as valid.
    data = {"reservations": orjson.dumps(
        {"good": entry(shared=0.5), "bad": entry(shared=shared)}).decode()}
    assert list(decode("team-a", data, NOW)) == ["good"]


def test_the_status_report_has_a_row_for_the_shared_cap() -> None:
    p = policy()
    used, held = Usage(), Usage()
    used.put("a", charge_of_pod(pod("a", units=2), p))
    held.put("b", charge_of_pod(pod("b", fraction="0.25"), p))
    report = status.of(p.tenants, used, held)
    row = next(r for r in report.rows if r.scope == "tenant" and r.cap == "shared")
    assert (row.used, row.reserved, row.limit) == (0.5, 0.25, 1.0)
