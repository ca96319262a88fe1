"""A training workload against quota at apply: the sum over its roles of pods x GPUs per
pod, for every cap. Refused when its gang can never fit, warned when not all its pods can
ever run at once or when it does not fit what is free now; the texts are golden files
(``tests/golden/messages/gang-*.txt``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quotakit import admit, pod, policy

from webhook.engine.charge import charge_of_pod
from webhook.quota.store import MemoryStore


def template(gpus: int, product: str | None = "A100") -> dict[str, Any]:
    spec = pod("t", gpus=gpus, product=product)["spec"]
    if not gpus:
        spec["containers"][0]["resources"] = {}
    return {"metadata": {"labels": {"app": "train"}}, "spec": spec}


def vcjob(*tasks: tuple[str, int, int], min_available: int | None = None,
          namespace: str = "team-a", name: str = "llm") -> dict[str, Any]:
    """A Volcano Job of (task, replicas, GPUs per pod) as stored after mutation."""
    spec: dict[str, Any] = {"tasks": [{"name": t, "replicas": n, "template": template(g)}
                                      for t, n, g in tasks]}
    if min_available is not None:
        spec["minAvailable"] = min_available
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": spec}


def busy(store: MemoryStore, gpus: int, n: int = 1) -> None:
    """Running pods of another job holding ``gpus`` A100s each."""
    p = policy()
    for i in range(n):
        obj = pod(f"other-{i}", gpus=gpus, owner=("Job", "other"))
        store.pod_seen(obj["metadata"]["uid"], charge_of_pod(obj, p))


def test_a_gang_that_fits_is_allowed_quietly() -> None:
    d = admit(MemoryStore(), policy(), vcjob(("master", 1, 0), ("worker", 2, 2)))
    assert d.allowed and d.warnings == [], d.message


def test_a_gang_that_can_never_fit_is_refused(golden: Callable[[str, str], None]) -> None:
    d = admit(MemoryStore(), policy(), vcjob(("master", 1, 0), ("worker", 4, 2)))
    assert not d.allowed
    golden("messages/gang-never-fits.txt", d.message + "\n")


def test_the_gang_minimum_is_what_must_fit() -> None:
    # 7 workers x 1 A100 exceed the tenant's 6 A100s (and its 5 GPU pods), but a gang
    # of 4 fits: allowed, warned that it can never run whole.
    d = admit(MemoryStore(), policy(), vcjob(("worker", 7, 1), min_available=4))
    assert d.allowed, d.message
    (warning,) = d.warnings  # both caps say so: told once, by the tighter (5 pods)
    assert "its gang of 4 pods" in warning
    assert "quota is 5 GPU pods (the tightest of the 2 caps it exceeds)" in warning


def test_a_gang_over_two_caps_is_refused_once_with_the_tighter() -> None:
    # 4 workers x 4 A100: 16 GPUs over the tenant's 8 and its 6 a100 GPUs. "At most 8"
    # would name a gang the a100 cap still refuses.
    d = admit(MemoryStore(), policy(), vcjob(("worker", 4, 4)))
    assert not d.allowed
    (line,) = d.message.splitlines()
    assert ("quota is 6 a100 GPUs (the tightest of the 2 caps it exceeds): it can never "
            "start. Make the gang need at most 6 a100 GPUs (fewer pods") in line
    assert "at most 8" not in line


def test_a_pytorchjob_over_two_caps_is_refused_once() -> None:
    spec = template(3)
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "ddp", "namespace": "team-a", "uid": "uid-ddp"},
           "spec": {"pytorchReplicaSpecs": {
               "Master": {"replicas": 1, "template": spec},
               "Worker": {"replicas": 3, "template": spec}}}}
    d = admit(MemoryStore(), policy(), job)
    assert not d.allowed
    (line,) = d.message.splitlines()
    assert "need 12 a100 GPUs at once" in line
    assert "quota is 6 a100 GPUs (the tightest of the 2 caps it exceeds)" in line


def test_not_all_at_once_is_a_warning(golden: Callable[[str, str], None]) -> None:
    d = admit(MemoryStore(), policy(), vcjob(("worker", 7, 1), min_available=4))
    golden("messages/gang-not-all-at-once.txt", "\n".join(d.warnings) + "\n")


def test_a_gang_that_does_not_fit_now_is_warned(golden: Callable[[str, str], None]) -> None:
    store = MemoryStore()
    busy(store, 2, 2)  # 4 of the 6 A100s in use
    d = admit(store, policy(), vcjob(("master", 1, 0), ("worker", 2, 2)))
    assert d.allowed
    assert d.warnings
    golden("messages/gang-not-free.txt", "\n".join(d.warnings) + "\n")


def test_a_role_without_gpus_holds_no_gpu_quota() -> None:
    # 3 masters without GPUs and 2 GPU workers: 2 GPU pods of the tenant's 5, not 5.
    store = MemoryStore()
    busy(store, 1, 3)  # 3 GPU pods running: 2 more fit the pod cap
    d = admit(store, policy(), vcjob(("master", 3, 0), ("worker", 2, 1)))
    assert d.allowed and d.warnings == [], d.warnings


def test_a_dry_run_is_checked_the_same() -> None:
    d = admit(MemoryStore(), policy(), vcjob(("worker", 4, 2)), dry_run=True)
    assert not d.allowed


def test_an_update_is_warned_only_for_the_pods_it_adds() -> None:
    store = MemoryStore()
    busy(store, 1, 3)  # 3 A100 in use; 3 free
    old = vcjob(("worker", 2, 1))
    # 3 GPU pods of the 5 in use: growing 2 -> 4 adds 2, which fit; 2 -> 5 adds 3, which
    # do not (the 5 pods of the whole job would fit the cap: a warning, not a denial).
    d = admit(store, policy(), vcjob(("worker", 4, 1)), operation="UPDATE", old=old)
    assert d.allowed and d.warnings == [], d.warnings
    d = admit(store, policy(), vcjob(("worker", 5, 1)), operation="UPDATE", old=old)
    assert d.allowed
    assert [w.split(": ", 1)[1].split(" [")[0] for w in d.warnings] == [
        "asks for task worker 3 x 1 = 3 GPU pods, but only 2 of tenant team-a's 5 GPU pods "
        "are free now (3 in use): its gang of 5 pods needs 5 GPU pods and cannot start until quota "
        "frees up. A refused pod is not shown at kubectl apply: it shows up as an event on "
        "the Job (kubectl get events)."]


def test_a_namespace_cap_is_summed_too() -> None:
    d = admit(MemoryStore(), policy(), vcjob(("worker", 2, 2), namespace="team-a-dev"))
    assert not d.allowed
    assert "namespace team-a-dev's quota is 2 GPUs" in d.message


def test_argo_steps_are_checked_one_pod_at_a_time() -> None:
    def wf(gpus: int) -> dict[str, Any]:
        c = {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                "metadata": {"name": "wf", "namespace": "team-b", "uid": "u"},
                "spec": {"templates": [{"name": "train", "container": c},
                                       {"name": "eval", "container": c}]}}
    # team-b: 4 nvidia.com/gpu. Two 3-GPU steps do not sum (they run in sequence).
    assert admit(MemoryStore(), policy(), wf(3)).allowed
    d = admit(MemoryStore(), policy(), wf(5))
    assert not d.allowed
    assert d.message.startswith("workflow team-b/wf: template train asks for 5 "
                                "nvidia.com/gpu per pod, but tenant team-b's quota is 4")


def test_a_gang_not_free_under_two_caps_is_warned_once_by_the_tighter() -> None:
    store = MemoryStore()
    busy(store, 1, 3)  # 3 of the 6 A100s and 3 of the 5 GPU pods in use
    d = admit(store, policy(), vcjob(("worker", 4, 1)))
    assert d.allowed, d.message
    (warning,) = d.warnings  # a100 has room for 3 of the 4, the pods cap for 2
    assert ("only 2 of tenant team-a's 5 GPU pods (the tightest of the 2 caps it exceeds) "
            "are free now (3 in use)") in warning
