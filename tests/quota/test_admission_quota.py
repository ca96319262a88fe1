"""Quota at admission: the validating webhook with the in-memory store, as ``serve``
runs it without a cluster. Atomicity across replicas is tested against a real API
server in tests/e2e."""

from __future__ import annotations

import pytest
from quotakit import POLICY, admit, pod, policy

from webhook.engine.charge import charge_of_pod
from webhook.engine.decision import Decision
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text
from webhook.quota.store import MemoryStore


def store_with(*pods: dict) -> MemoryStore:
    store = MemoryStore(ttl=60)
    p = policy()
    for obj in pods:
        store.pod_seen(obj["metadata"]["uid"], charge_of_pod(obj, p))
    return store


def quota_messages(d: Decision) -> list[str]:
    return [f.message for f in d.findings if f.rule.value == "quota"]


def test_pods_are_admitted_until_the_cap_and_the_message_has_the_numbers() -> None:
    store = store_with(pod("llm-0", gpus=2, owner=("Job", "llm-pretrain")),
                       pod("llm-1", gpus=2, owner=("Job", "llm-pretrain")),
                       pod("notebook-x", gpus=1))
    d = admit(store, policy(), pod("new", gpus=2, product="H100"))
    assert d.allowed, d.message
    d = admit(store, policy(), pod("big", gpus=3, product="H100"))
    assert not d.allowed
    assert d.message == (
        # "exceeded quota": what controllers (Argo Workflows) retry a refused pod on. The
        # h100 cap (2 free) is exceeded too: told once, by the tighter cap (1 free), as
        # "ask for 2 or fewer" would name a pod the GPU cap still refuses.
        "pod team-a/big: exceeded quota: tenant team-a would use 10 of its 8 GPUs (the "
        "tightest of the 2 caps it exceeds): 7 in use "
        "(job/llm-pretrain 4, pod/new 2, pod/notebook-x 1), this pod asks 3. 1 is free now. "
        "Ask for 1 or fewer, wait for running pods to finish, or ask the platform team for "
        "more quota. [rule quota, tenant team-a]"
    )


def test_a_product_cap_suggests_another_product_with_room() -> None:
    store = store_with(*(pod(f"a{i}", gpus=2) for i in range(3)))  # a100: 6 of 6
    d = admit(store, policy(), pod("more", gpus=1))
    assert not d.allowed
    (msg,) = quota_messages(d)
    assert "would use 7 of its 6 a100 GPUs" in msg
    assert "none is free now; h100 has 4 free" in msg.lower()


def test_namespace_cap_inside_the_tenant() -> None:
    store = store_with(pod("dev-1", "team-a-dev", 2))
    d = admit(store, policy(), pod("dev-2", "team-a-dev", 1))
    assert not d.allowed
    assert "namespace team-a-dev would use 3 of its 2 GPUs" in d.message


def test_pod_count_cap() -> None:
    store = store_with(*(pod(f"p{i}", gpus=1, product="H100" if i < 2 else "A100")
                         for i in range(5)))
    d = admit(store, policy(), pod("sixth", gpus=1, product="H100"))
    assert not d.allowed
    assert "would use 6 of its 5 GPU pods" in d.message


def test_per_resource_cap_in_devices() -> None:
    store = store_with(pod("b1", "team-b", 3, product=None))
    assert not admit(store, policy(), pod("b2", "team-b", 2, product=None)).allowed
    assert admit(store, policy(), pod("b3", "team-b", 1, product=None)).allowed


def test_dry_run_is_checked_but_never_reserves() -> None:
    store = store_with()
    p = policy()
    for i in range(20):
        assert admit(store, p, pod(f"dry{i}", gpus=4, product="H100"), dry_run=True).allowed
    assert store.view().tenant("team-a").gpus == 0
    over = admit(store, p, pod("dry-over", gpus=9, product="H100"), dry_run=True)
    # Over the tenant's 8 GPUs and its 4 h100: told by the tighter.
    assert not over.allowed and "would use 9 of its 4 h100 GPUs" in over.message


def test_admitted_pods_are_reserved_so_a_burst_never_exceeds_the_cap() -> None:
    store = store_with()
    p = policy()
    results = [admit(store, p, pod(f"burst{i}", gpus=1, product="H100")).allowed
               for i in range(10)]
    assert results.count(True) == 4  # h100 cap 4 (before the total of 8 or 5 pods)
    assert store.view().tenant("team-a").products == {"h100": 4.0}


def test_a_reservation_expires_when_its_pod_never_appears() -> None:
    now = [1000.0]
    store = MemoryStore(ttl=60, clock=lambda: now[0])
    p = policy()
    assert admit(store, p, pod("ghost", gpus=4, product="H100")).allowed
    assert not admit(store, p, pod("waiting", gpus=4, product="H100")).allowed
    now[0] += 61  # the ghost was refused by a later admission step and never created
    assert store.view().tenant("team-a").gpus == 0
    assert admit(store, p, pod("waiting", gpus=4, product="H100")).allowed


def test_reservations_expire_oldest_first_and_a_name_is_free_again_once_it_goes() -> None:
    now = [1000.0]
    store = MemoryStore(ttl=60, clock=lambda: now[0])
    p = policy()
    assert admit(store, p, pod("a", gpus=2, product="H100", uid="uid-a-1")).allowed
    now[0] += 30
    assert admit(store, p, pod("b", gpus=2, product="H100")).allowed
    # The same name again under a new uid (a retried create): one charge, not two.
    assert admit(store, p, pod("a", gpus=2, product="H100", uid="uid-a-2")).allowed
    assert store.view().tenant("team-a").gpus == 4
    now[0] += 31  # a's reservation is past its TTL, b's is not
    assert store.view().tenant("team-a").gpus == 2
    assert store.expired == 1
    # Its name holds nothing any more: a create under it is a new charge, and fits.
    assert admit(store, p, pod("a", gpus=2, product="H100", uid="uid-a-3")).allowed
    assert store.view().tenant("team-a").gpus == 4
    # b's pod is seen: it counts as itself, and its name holds no reservation either.
    b = pod("b", gpus=2, product="H100")
    store.pod_seen(b["metadata"]["uid"], charge_of_pod(b, p))
    store.pod_seen(b["metadata"]["uid"], None)  # and deleted
    assert admit(store, p, pod("b", gpus=2, product="H100", uid="uid-b-2")).allowed
    assert store.view().tenant("team-a").gpus == 4
    now[0] += 61
    assert store.view().tenant("team-a").gpus == 0


def test_a_seen_pod_replaces_its_reservation_without_double_counting() -> None:
    store = store_with()
    p = policy()
    obj = pod("real", gpus=2, product="H100")
    assert admit(store, p, obj).allowed
    store.pod_seen(obj["metadata"]["uid"], charge_of_pod(obj, p))
    assert store.view().tenant("team-a").gpus == 2
    store.pod_seen(obj["metadata"]["uid"], None)  # deleted
    assert store.view().tenant("team-a").gpus == 0


def _deployment(replicas: int, gpus: int) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "trainer", "namespace": "team-a"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"a": "b"}},
                     "template": {"metadata": {"labels": {"a": "b"}},
                                  "spec": pod("t", gpus=gpus, product="H100")["spec"]}}}


def test_a_gang_that_can_never_fit_is_denied_at_apply_time() -> None:
    d = admit(store_with(), policy(), _deployment(3, 2))  # 6 h100 GPUs > cap 4
    assert not d.allowed
    assert ("deployment team-a/trainer, pod template: asks for 3 pods x 2 = 6 h100 GPUs at "
            "once, but tenant team-a's quota is 4 h100 GPUs: it can never run in full. "
            "Run at most 2 pods of this size, or fewer h100 GPUs per pod.") in d.message


def test_counts_of_one_pod_read_as_one_pod() -> None:
    # 2 pods x 3 GPUs can never fit a cap of 4: at most 1 pod of that size can run.
    d = admit(store_with(), policy(), _deployment(2, 3))
    assert not d.allowed
    assert "Run at most 1 pod of this size, or fewer h100 GPUs per pod." in d.message
    # Scaling 1 -> 2 adds one pod: it is named as one pod, not "1 pods".
    store = store_with(pod("busy", gpus=3, product="H100"), pod("t-1", gpus=1, product="H100"))
    d = admit(store, policy(), _deployment(2, 1), operation="UPDATE", old=_deployment(1, 1))
    assert d.allowed
    assert any("asks for 1 pod x 1 h100 GPUs, but only 0 of" in w for w in d.warnings), \
        d.warnings


def test_a_gang_that_fits_only_later_gets_a_warning() -> None:
    store = store_with(pod("busy", gpus=3, product="H100"))
    d = admit(store, policy(), _deployment(2, 1))
    assert d.allowed
    assert any("only 1 of tenant team-a's 4 h100 GPUs are free now: 1 of its pods can start"
               in w for w in d.warnings), d.warnings


def test_scaling_up_counts_only_the_added_pods() -> None:
    store = store_with(pod("t-1", gpus=1, product="H100"), pod("t-2", gpus=1, product="H100"))
    d = admit(store, policy(), _deployment(4, 1), operation="UPDATE", old=_deployment(2, 1))
    assert d.allowed and not d.warnings  # 2 running + 2 added = 4 of 4


@pytest.mark.parametrize("mode", ["warn", "audit"])
def test_quota_in_warn_or_audit_mode_admits(mode: str) -> None:
    rules = f"  rules:\n    quota: {{mode: {mode}}}\n  tenants:"
    p = compile_policy(load_text(POLICY.replace("  tenants:", rules)))
    store = store_with()
    d = admit(store, p, pod("huge", gpus=5, product="H100"))
    assert d.allowed
    assert bool(d.warnings) == (mode == "warn")
    assert d.findings and d.findings[0].mode.value == mode


def test_what_to_ask_for_is_said_in_whole_devices() -> None:
    # A MIG slice (0.125 GPU) leaves 1.875 of team-a's 8 GPUs free: a whole-GPU pod can
    # ask for 1, a pod of slices for 15 of them; never "1.875".
    store = store_with(pod("a", gpus=4, product="A100", owner=("Job", "big")),
                       pod("b", gpus=2, product="H100", owner=("Job", "mid")),
                       pod("slice", gpus=1, resource="nvidia.com/mig-1g.10gb", product="A100"))
    gpus = admit(store, policy(), pod("whole", gpus=2, product="H100"))
    assert not gpus.allowed
    assert "1.875 are free now. Ask for 1 or fewer," in gpus.message, gpus.message
    slices = admit(store, policy(), pod("slices", gpus=16, resource="nvidia.com/mig-1g.10gb",
                                        product="H100"))
    assert not slices.allowed
    assert "Ask for 15 nvidia.com/mig-1g.10gb or fewer," in slices.message, slices.message
