"""How GPUs are held (``webhook.engine.holding``), on ``policies/examples/holding.yaml``:
maximum runtime per kind of work, CPU and memory per GPU, routing to a scheduler and
queue, and GPUs chosen by what they can do. Every mutation is checked by the kit: the
patch applies, the result is a valid object, and mutating it again changes nothing.

GPU capability cases read a real H200 node's labels, as GPU Feature Discovery wrote
them (``tests/fixtures/real-gpu/h200-gfd-labels.txt``), and decide whether the pod's
required node affinity admits that node, as the scheduler's nodeaffinity filter does.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from enginekit import (
    PRODUCT_LABEL,
    admitted,
    claim,
    container,
    cronjob,
    deployment,
    device_request,
    gpus,
    holding_policy,
    job,
    mutate_checked,
    node_terms,
    pod,
    pod_spec,
    validated,
)

from webhook.admission.webhooks import Cluster, Phase, admit
from webhook.engine.decision import Decision
from webhook.k8s.review import parse_review, request_review
from webhook.policy.model import Rule

POLICY = holding_policy()
NOTEBOOK = {"app.kubernetes.io/component": "notebook"}
H200_LABELS = Path(__file__).resolve().parents[1] / "fixtures" / "real-gpu" / \
    "h200-gfd-labels.txt"
H200 = "NVIDIA-H200"


def fits(cpu: str = "8", memory: str = "64Gi", n: int = 1) -> dict[str, Any]:
    """One GPU container within the research tenant's 16 CPUs and 128Gi per GPU."""
    return container(limits={**gpus(n), "cpu": cpu, "memory": memory})


def rules(d: Any) -> list[Rule]:
    return [f.rule for f in d.findings]


# --------------------------------------------------------------------------- runtime


@pytest.mark.parametrize(("labels", "spec", "deadline"), [
    (NOTEBOOK, {}, 28800),                                  # kind by label
    ({}, {"priorityClassName": "interactive"}, 14400),      # kind by PriorityClass
    ({}, {}, 604800),                                       # no kind: the tenant's cap
    (NOTEBOOK, {"activeDeadlineSeconds": 600}, 600),        # a shorter one is kept
])
def test_a_gpu_pod_gets_the_deadline_of_its_kind_of_work(
        labels: dict[str, str], spec: dict[str, Any], deadline: int) -> None:
    m = mutate_checked(pod(fits(), labels=labels, **spec), POLICY)
    assert m.decision.allowed, m.decision.message
    assert m.patched["spec"]["activeDeadlineSeconds"] == deadline
    said = m.patched["metadata"]["annotations"]["gpu-webhook.dev/max-runtime"]
    assert f"({deadline}s" in said
    assert "frees its GPUs" in said


def test_a_longer_deadline_is_shortened_with_a_warning() -> None:
    m = mutate_checked(pod(fits(), labels=NOTEBOOK, activeDeadlineSeconds=86400), POLICY)
    assert m.decision.allowed
    assert m.patched["spec"]["activeDeadlineSeconds"] == 28800
    assert any("shortened to 28800" in w for w in m.decision.warnings)


def test_a_longer_deadline_is_refused_where_the_policy_says_deny() -> None:
    m = mutate_checked(pod(namespace="batch", activeDeadlineSeconds=90000), POLICY)
    assert not m.decision.allowed
    assert rules(m.decision) == [Rule.MAX_RUNTIME]
    assert "90000 (1d1h)" in m.decision.message and "86400" in m.decision.message


def test_a_pod_that_skipped_the_mutating_webhook_is_refused_without_a_deadline() -> None:
    d = validated(pod(fits(), nodeSelector={PRODUCT_LABEL: H200},
                      labels={"kueue.x-k8s.io/queue-name": "research"}), POLICY)
    assert not d.allowed
    assert rules(d) == [Rule.MAX_RUNTIME]


def test_a_job_gets_its_own_deadline_at_apply_and_a_deployment_template_none() -> None:
    j = mutate_checked(job(pod(namespace="batch")), POLICY)
    assert j.decision.allowed and j.patched["spec"]["activeDeadlineSeconds"] == 86400
    c = mutate_checked(cronjob(pod(namespace="batch")), POLICY)
    assert c.patched["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 86400
    # The API server refuses a deadline in a ReplicaSet's template: its pods get theirs.
    d = mutate_checked(deployment(pod(fits(), labels=NOTEBOOK)), POLICY)
    assert d.decision.allowed
    assert "activeDeadlineSeconds" not in pod_spec(d.patched)


def test_a_job_asking_longer_than_allowed_is_refused_at_apply() -> None:
    spec = job(pod(namespace="batch"))
    spec["spec"]["activeDeadlineSeconds"] = 172800
    m = mutate_checked(spec, POLICY)
    assert not m.decision.allowed and rules(m.decision) == [Rule.MAX_RUNTIME]
    assert "spec.activeDeadlineSeconds 172800" in m.decision.message


# --------------------------------------------------------------------------- CPU, memory


@pytest.mark.parametrize(("manifest", "refused"), [
    (pod(fits("64")), "1 GPU with 64 CPUs: at most 16 CPUs per GPU in tenant research"),
    (pod(fits("32", "256Gi", 2)), None),                    # 16 and 128Gi per GPU
    (pod(fits("17")), "1 GPU with 17 CPUs"),
    (pod(fits("2", "200Gi")), "1 GPU with 200Gi of memory: at most 128Gi"),
    # The effective request: a plain init container asking more than the app.
    (pod(fits(), init=[container("fetch", limits={"cpu": "40"})]), "1 GPU with 40 CPUs"),
    # An H200 pod may ask the H200's own ratio (24 CPUs, 256Gi).
    (pod(fits("24", "256Gi"), nodeSelector={PRODUCT_LABEL: H200}), None),
    (pod(fits("25"), nodeSelector={PRODUCT_LABEL: H200}), "per h200 GPU"),
])
def test_cpu_and_memory_per_gpu(manifest: dict[str, Any], refused: str | None) -> None:
    _, d = admitted(manifest, POLICY)
    if refused is None:
        assert d.allowed, d.message
    else:
        assert not d.allowed and rules(d) == [Rule.RESOURCES_PER_GPU]
        assert refused in d.message


@pytest.mark.parametrize(("resources", "container_cpu", "refused"), [
    # Pod-level resources (spec.resources, on by default since 1.34): the scheduler
    # reads the pod-level request where set, whatever the containers ask.
    ({"requests": {"cpu": "64"}}, None, "1 GPU with 64 CPUs: at most 16 CPUs per GPU"),
    ({"requests": {"cpu": "64"}}, "8", "1 GPU with 64 CPUs"),
    ({"requests": {"memory": "512Gi"}}, None, "1 GPU with 512Gi of memory"),
    # A pod-level limit alone is the request where no container asks the resource...
    ({"limits": {"cpu": "64"}}, None, "1 GPU with 64 CPUs"),
    # ... and the containers' requests where they do (the API server's defaulting).
    ({"limits": {"cpu": "64"}}, "8", None),
    ({"requests": {"cpu": "16"}, "limits": {"cpu": "64"}}, None, None),
])
def test_cpu_and_memory_asked_at_pod_level_are_held_to_the_same_caps(
        resources: dict[str, Any], container_cpu: str | None, refused: str | None) -> None:
    limits = {**gpus(1), **({"cpu": container_cpu} if container_cpu else {})}
    _, d = admitted(pod(container(limits=limits), resources=resources), POLICY)
    if refused is None:
        assert d.allowed, d.message
    else:
        assert not d.allowed and rules(d) == [Rule.RESOURCES_PER_GPU]
        assert refused in d.message


def test_a_pod_asking_at_pod_level_is_not_given_the_default_of_that_resource() -> None:
    m = mutate_checked(pod(container(limits=gpus(2)), resources={"limits": {"cpu": "8"}}),
                       POLICY)
    requests = m.patched["spec"]["containers"][0]["resources"]["requests"]
    assert "cpu" not in requests  # under a pod-level limit of 8, 32 would be invalid
    assert requests["memory"] == "128Gi"


def resized(before: dict[str, Any], cpu: str, namespace: str = "research") -> Decision:
    """The validating webhook's decision on the pods/resize UPDATE of ``before`` to
    ``cpu`` in its first container (the API server sends the whole resized pod)."""
    old = copy.deepcopy(before)
    old["metadata"].update(namespace=namespace, uid="6b1c3d0e-0000-4000-8000-000000000002")
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["resources"]["limits"]["cpu"] = cpu
    new["spec"]["containers"][0]["resources"].setdefault("requests", {})["cpu"] = cpu
    payload = request_review(new, operation="UPDATE")
    payload["request"].update(subResource="resize", oldObject=old, namespace=namespace)
    return asyncio.run(admit(Phase.VALIDATE, parse_review(orjson.dumps(payload)), POLICY,
                             Cluster()))


def test_a_running_gpu_pod_resized_past_its_cpu_per_gpu_is_refused() -> None:
    running = pod(fits("8"), name="train", nodeSelector={PRODUCT_LABEL: H200})
    d = resized(running, "64")
    assert not d.allowed and rules(d) == [Rule.RESOURCES_PER_GPU]
    assert d.message == (
        "pod research/train: cannot be resized to 64 CPUs: its 1 GPU allows at most 24 "
        "CPUs per h200 GPU in tenant research, so at most 24 CPUs. Resize to 24 CPUs or "
        "less; a running pod's GPUs cannot be resized, so work that needs more CPU needs "
        "a new pod with more GPUs. [rule resources-per-gpu, tenant research]")
    assert resized(running, "12").allowed
    assert resized(running, "24").allowed


def test_a_pod_without_gpus_or_caps_is_resized_freely() -> None:
    plain = pod(container(limits={"cpu": "1"}), name="web")
    d = resized(plain, "100")
    assert d.allowed and d.skipped == "operation"
    # A namespace of no tenant: no cap to hold a resize to.
    assert resized(pod(fits("8")), "64", namespace="unassigned").allowed


def test_a_gpu_pod_asking_no_cpu_or_memory_is_given_the_defaults_per_gpu() -> None:
    m, d = admitted(pod(container(limits=gpus(2)), container("sidecar")), POLICY)
    assert d.allowed
    main, sidecar = m.patched["spec"]["containers"]
    assert main["resources"]["requests"]["cpu"] == "16"
    assert main["resources"]["requests"]["memory"] == "128Gi"
    assert "resources" not in sidecar  # no GPU: nothing given
    # A pod that asks CPU anywhere is left as it asks.
    m = mutate_checked(pod(container(limits=gpus(2)), container("s", limits={"cpu": "1"})),
                       POLICY)
    assert "cpu" not in m.patched["spec"]["containers"][0]["resources"].get("requests", {})


# --------------------------------------------------------------------------- routing


@pytest.mark.parametrize(("namespace", "scheduler", "labels", "annotations"), [
    ("research", "default-scheduler", {"kueue.x-k8s.io/queue-name": "research"}, {}),
    ("batch", "volcano", {}, {"scheduling.volcano.sh/queue-name": "batch"}),
    ("inference", "kai-scheduler", {"kai.scheduler/queue": "inference"}, {}),
])
def test_every_gpu_pod_of_a_tenant_is_sent_to_its_scheduler_and_queue(
        namespace: str, scheduler: str, labels: dict[str, str],
        annotations: dict[str, str]) -> None:
    # The pod names a queue of its own and the default scheduler (as the API server
    # defaults it): the tenant's win.
    p = pod(fits(), namespace=namespace, schedulerName="default-scheduler",
            labels={"kueue.x-k8s.io/queue-name": "mine", "kai.scheduler/queue": "mine"}
            if labels else None)
    m = mutate_checked(p, POLICY)
    assert m.decision.allowed, m.decision.message
    assert m.patched["spec"]["schedulerName"] == scheduler
    meta = m.patched["metadata"]
    assert labels.items() <= (meta.get("labels") or {}).items()
    assert annotations.items() <= (meta.get("annotations") or {}).items()


def test_a_workload_carries_the_queue_label_itself_at_apply() -> None:
    m = mutate_checked(deployment(pod(fits(), namespace="inference")), POLICY)
    assert m.patched["metadata"]["labels"]["kai.scheduler/queue"] == "inference"
    assert "queue-routing" in m.decision.mutations
    j = mutate_checked(job(pod(fits())), POLICY)
    assert j.patched["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"


# --------------------------------------------------------------------------- capability


def _h200() -> dict[str, str]:
    out = {}
    for line in H200_LABELS.read_text().splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key] = value
    return out


def _admits(terms: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Whether a node of ``labels`` satisfies the terms (ORed; expressions ANDed)."""
    def one(e: dict[str, Any]) -> bool:
        have = labels.get(e["key"])
        op, values = e["operator"], e.get("values", [])
        if op == "In":
            return have in values
        if op == "NotIn":
            return have not in values
        if op == "Exists":
            return have is not None
        if op == "DoesNotExist":
            return have is None
        if have is None:
            return False
        return int(have) > int(values[0]) if op == "Gt" else int(have) < int(values[0])
    return any(all(one(e) for e in t.get("matchExpressions", [])) for t in terms)


@pytest.mark.parametrize(("memory", "compute", "on_h200"), [
    ("80Gi", None, True),
    ("141G", None, True),        # 141e9 bytes = 134468 MiB; the H200 has 143771
    ("144Gi", None, False),      # 147456 MiB
    (None, "9.0", True),
    (None, "8.6", True),         # a higher major
    (None, "9.1", False),        # the same major, a lower minor
    (None, "10.0", False),
    ("80Gi", "9.0", True),
])
def test_a_pod_asking_for_gpu_capability_lands_only_where_gfd_says_so(
        memory: str | None, compute: str | None, on_h200: bool) -> None:
    labels = {}
    if memory:
        labels["gpu-webhook.dev/min-gpu-memory"] = memory
    if compute:
        labels["gpu-webhook.dev/min-compute-capability"] = compute
    m, d = admitted(pod(fits(), labels=labels), POLICY)
    assert d.allowed, d.message
    terms = node_terms(m.patched)
    assert "gpu-capability" in m.decision.mutations
    h200 = _h200()
    assert _admits(terms, h200) is on_h200
    # Within the tenant's products: the same GPU under a product it may not use is out.
    assert not _admits(terms, {**h200, PRODUCT_LABEL: "NVIDIA-L4"})


def test_a_pod_whose_affinity_lost_the_capability_is_refused_by_the_validating_webhook(
        ) -> None:
    p = pod(fits(), labels={"gpu-webhook.dev/min-gpu-memory": "80Gi",
                            "kueue.x-k8s.io/queue-name": "research"},
            activeDeadlineSeconds=60, nodeSelector={PRODUCT_LABEL: H200})
    d = validated(p, POLICY)
    assert not d.allowed and rules(d) == [Rule.GPU_CAPABILITY]


def test_a_gpu_claim_asking_for_capability_gets_cel_selectors_on_dra_attributes() -> None:
    c = claim(device_request())
    c["metadata"]["labels"] = {"gpu-webhook.dev/min-gpu-memory": "80Gi",
                               "gpu-webhook.dev/min-compute-capability": "9.0"}
    m = mutate_checked(c, POLICY)
    assert m.decision.allowed
    selectors = [s["cel"]["expression"]
                 for s in m.patched["spec"]["devices"]["requests"][0]["exactly"]["selectors"]]
    assert ("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('81920Mi')) >= 0"
            in selectors)
    assert ("device.attributes['gpu.nvidia.com'].cudaComputeCapability"
            ".compareTo(semver('9.0.0')) >= 0" in selectors)
    assert "gpu-capability" in m.decision.mutations


def test_a_job_that_skipped_the_mutating_webhook_is_refused_without_its_deadline() -> None:
    d = validated(job(pod(namespace="batch", schedulerName="volcano",
                          nodeSelector={PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"})), POLICY)
    assert not d.allowed and rules(d) == [Rule.MAX_RUNTIME]
    assert "has no spec.activeDeadlineSeconds" in d.message
    _, ok = admitted(job(pod(namespace="batch")), POLICY)
    assert ok.allowed, ok.message
