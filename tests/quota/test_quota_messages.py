"""The quota sentences developers found confusing, as golden files: what a MIG request
asked for, the one binding answer for a workload over several caps, how to ask for the
product that has room, and where a controller's refused pods show up. Run against the
example policy (``policies/multi-tenant.yaml``) with quota enforced for notebooks, and
the in-memory usage store, as ``serve`` runs without a cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from quotakit import admit, pod

from webhook.engine.charge import charge_of_pod
from webhook.engine.messages import EXCEEDED_QUOTA
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text
from webhook.quota.store import MemoryStore

EXAMPLE = Path(__file__).parents[2] / "policies" / "multi-tenant.yaml"
WARN_LINE = "      mode: warn            # rolling out: tell users, do not block them yet\n"
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
MIG = "nvidia.com/mig-3g.40gb"


def enforced() -> CompiledPolicy:
    """The example policy, its notebooks tenant enforced rather than warned."""
    text = EXAMPLE.read_text()
    assert text.count(WARN_LINE) == 1
    return compile_policy(load_text(text.replace(WARN_LINE, ""), str(EXAMPLE)))


def store_with(p: CompiledPolicy, *pods: dict[str, Any]) -> MemoryStore:
    store = MemoryStore(ttl=60)
    for obj in pods:
        store.pod_seen(obj["metadata"]["uid"], charge_of_pod(obj, p))
    return store


def research(name: str, gpus: int, product: str, namespace: str = "research"
             ) -> dict[str, Any]:
    """A research pod as stored after the mutating webhook: pinned to product and rack."""
    obj = pod(name, namespace, gpus, product=product)
    (term,) = obj["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    term["matchExpressions"].append({"key": "topology.example.com/gpu-rack",
                                     "operator": "In", "values": ["rack-a"]})
    return obj


def deployment(name: str, namespace: str, replicas: int, gpus: int, product: str
               ) -> dict[str, Any]:
    assert namespace == "research"
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": research("t", gpus, product)["spec"]}}}


def test_a_mig_request_is_named_as_asked_before_its_gpu_equivalents(
        golden: Callable[[str, str], None]) -> None:
    p = enforced()
    d = admit(store_with(p), p, pod("nb", "notebooks", 3, resource=MIG, product=A100))
    assert not d.allowed
    assert "asks for 3 nvidia.com/mig-3g.40gb (3 x 0.5 = 1.5 GPUs) in all" in d.message
    golden("messages/mig-per-pod-max.txt", d.message + "\n")


def test_a_mig_quota_denial_names_the_slices_and_says_exceeded_quota(
        golden: Callable[[str, str], None]) -> None:
    p = enforced()
    running = [pod(f"nb-{i}", "notebooks", 2, resource=MIG, product=A100) for i in range(4)]
    d = admit(store_with(p, *running), p, pod("nb-new", "notebooks", 2, resource=MIG,
                                               product=A100))
    assert not d.allowed
    assert "this pod asks 2 nvidia.com/mig-3g.40gb (2 x 0.5 = 1 GPU)" in d.message
    golden("messages/quota-mig.txt", d.message + "\n")


def test_every_pod_quota_denial_says_exceeded_quota() -> None:
    # Argo Workflows retries a Forbidden pod creation only when it says "exceeded quota"
    # (as the API server's own ResourceQuota denial does); otherwise the step fails.
    p = enforced()
    full = [research(f"h-{i}", 4, H100) for i in range(2)]
    d = admit(store_with(p, *full), p, research("more", 1, H100))
    assert not d.allowed
    lines = d.message.splitlines()
    assert lines and all(EXCEEDED_QUOTA in line for line in lines)


def test_a_full_product_names_the_label_that_asks_for_the_one_with_room(
        golden: Callable[[str, str], None]) -> None:
    p = enforced()
    busy = [*(research(f"h-{i}", 4, H100) for i in range(2)),
            research("a-0", 2, A100)]
    d = admit(store_with(p, *busy), p, research("more", 1, H100))
    assert not d.allowed
    assert ("None is free now; a100 has 22 free (set label gpu.example.com/product: a100)."
            in d.message)
    golden("messages/quota-other-product.txt", d.message + "\n")


def test_a_pod_over_two_scopes_is_told_once_and_offered_only_what_would_be_admitted(
        golden: Callable[[str, str], None]) -> None:
    p = enforced()
    # 22 of research's 24 a100 in use; a 5-GPU a100 pod in research-dev is over that
    # cap and over research-dev's own 4 GPUs. h100 has 8 free, but research-dev's cap
    # would refuse 5 h100 GPUs as well: it is not offered.
    busy = [research(f"a-{i}", 2, A100) for i in range(11)]
    d = admit(store_with(p, *busy), p, research("big", 5, A100, "research-dev"))
    assert not d.allowed
    (line,) = d.message.splitlines()
    assert ("tenant research would use 27 of its 24 a100 GPUs (the tightest of the 2 caps "
            "it exceeds)") in line
    assert "2 are free now." in line
    assert "h100" not in line
    golden("messages/quota-two-scopes.txt", d.message + "\n")


def test_another_product_is_offered_when_every_cap_admits_it() -> None:
    p = enforced()
    busy = [research(f"a-{i}", 2, A100) for i in range(11)]
    d = admit(store_with(p, *busy), p, research("small", 3, A100, "research-dev"))
    assert not d.allowed
    (line,) = d.message.splitlines()
    assert "h100 has 8 free (set label gpu.example.com/product: h100)" in line


def test_a_workload_over_two_caps_gets_the_one_binding_answer(
        golden: Callable[[str, str], None]) -> None:
    p = enforced()
    # 10 x 4 a100 GPUs: the tenant's 32 GPUs hold 8 such pods, its 24 a100 only 6.
    d = admit(store_with(p), p, deployment("train", "research", 10, 4, A100))
    assert not d.allowed
    assert d.message.count("Run at most") == 1
    assert "Run at most 6 pods of this size (the tightest of the 2 caps it exceeds)" in d.message
    golden("messages/quota-workload-two-caps.txt", d.message + "\n")


def test_a_workload_warned_not_free_says_where_refused_pods_show_up(
        golden: Callable[[str, str], None]) -> None:
    p = enforced()
    busy = [research(f"a-{i}", 4, A100) for i in range(5)]  # 20 of 24 a100
    d = admit(store_with(p, *busy), p, deployment("serve", "research", 2, 4, A100))
    assert d.allowed and len(d.warnings) == 1, d.warnings
    assert ("it shows up as an event on its ReplicaSet (kubectl get events)."
            in d.warnings[0])
    golden("messages/quota-workload-not-free.txt", "\n".join(d.warnings) + "\n")
