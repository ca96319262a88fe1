"""Training workloads, read from real manifests of each project (``tests/fixtures/
workloads``, each with its source): the templates found, the pods each runs, the gang
minimum; then both webhooks on them: every template is completed, tolerated and pinned
at its own pointer (idempotent), and the whole workload is checked against quota.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
import pytest
import yaml
from enginekit import (
    GPU_TOLERATION,
    K8S_VERSION,
    example_policy,
    namespace_labels,
    validated,
)

from webhook.admission.webhooks import mutating
from webhook.k8s.objects import MalformedObject
from webhook.k8s.review import parse_review, request_review
from webhook.k8s.workloads import CRD_KINDS, read_workload

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "workloads"


def fixture(name: str, kind: str | None = None) -> dict[str, Any]:
    """The first document of a fixture (of ``kind`` when given), in namespace research."""
    docs = [d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d]
    doc = next(d for d in docs if kind is None or d["kind"] == kind)
    doc.setdefault("metadata", {})["namespace"] = "research"
    doc["metadata"].setdefault("name", doc["metadata"].get("generateName", "x") + "abcde")
    return dict(doc)


def group_of(obj: dict[str, Any]) -> str:
    api = obj["apiVersion"]
    return api.split("/")[0] if "/" in api else ""


# fixture, kind, [(role, pods, template pointer)], gang
CASES: list[tuple[str, str, list[tuple[str | None, int, str]], int | None]] = [
    ("volcano-job-mindspore-gpu.yaml", "Job",
     [("mpimaster", 1, "/spec/tasks/0/template"), ("mpiworker", 2, "/spec/tasks/1/template")],
     3),
    # a Volcano Job's spec one level down, in the jobTemplate
    ("volcano-cronjob-example.yaml", "CronJob",
     [("task-1", 1, "/spec/jobTemplate/spec/tasks/0/template")], 1),
    ("pytorchjob-mnist-nccl.yaml", "PyTorchJob",
     [("Master", 1, "/spec/pytorchReplicaSpecs/Master/template"),
      ("Worker", 1, "/spec/pytorchReplicaSpecs/Worker/template")], 2),
    ("mpijob-tensorflow-mnist.yaml", "MPIJob",
     [("Launcher", 1, "/spec/mpiReplicaSpecs/Launcher/template"),
      ("Worker", 2, "/spec/mpiReplicaSpecs/Worker/template")], 3),
    # parallelism 4, completions 4, one replica (the default)
    ("jobset-pytorch-resnet.yaml", "JobSet",
     [("workers", 4, "/spec/replicatedJobs/0/template/spec/template")], 4),
    # 2 groups of size 2: a leader and a worker each; each group is a gang of 2
    ("lws-vllm-gpu.yaml", "LeaderWorkerSet",
     [("leader", 2, "/spec/leaderWorkerTemplate/leaderTemplate"),
      ("worker", 2, "/spec/leaderWorkerTemplate/workerTemplate")], 2),
    ("rayjob-pytorch-text-classifier.yaml", "RayJob",
     [("head", 1, "/spec/rayClusterSpec/headGroupSpec/template")], None),
    ("raycluster-verl.yaml", "RayCluster", [("head", 1, "/spec/headGroupSpec/template")], None),
    # no template of its own: numNodes x resourcesPerNode
    ("trainjob-volcano.yaml", "TrainJob", [("trainer", 4, "/spec/trainer")], 4),
    ("argo-workflow-dns-config.yaml", "Workflow", [("hello-world", 1, "/spec/templates/0")],
     None),
]


@pytest.mark.parametrize(("name", "kind", "roles", "gang"), CASES,
                         ids=[c[0].removesuffix(".yaml") for c in CASES])
def test_roles_pods_and_gang_of_each_kind(name: str, kind: str,
                                          roles: list[tuple[str | None, int, str]],
                                          gang: int | None) -> None:
    obj = fixture(name, kind)
    w = read_workload(group_of(obj), kind, obj)
    assert w is not None
    assert [(r.name, r.pods, r.template.pointer) for r in w.roles] == roles
    assert w.gang == gang


def _with(obj: dict[str, Any], edit: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    edit(out)
    return out


def test_volcano_counts_follow_the_api_defaults() -> None:
    obj = fixture("volcano-job-mindspore-gpu.yaml")
    # spec.minAvailable defaults to the sum of replicas; a task without replicas runs none.
    def drop(o: dict[str, Any]) -> None:
        del o["spec"]["minAvailable"]
        del o["spec"]["tasks"][0]["replicas"]
    w = read_workload("batch.volcano.sh", "Job", _with(obj, drop))
    assert w is not None
    assert [(r.name, r.pods, r.minimum) for r in w.roles] == [("mpimaster", 0, 0),
                                                              ("mpiworker", 2, 2)]
    assert w.gang == 2


def test_kubeflow_gang_is_min_available_when_set() -> None:
    obj = fixture("pytorchjob-mnist-nccl.yaml")
    def gang(o: dict[str, Any]) -> None:
        o["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 1}}
        o["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 3
    w = read_workload("kubeflow.org", "PyTorchJob", _with(obj, gang))
    assert w is not None and w.pods == 4 and w.gang == 1


def test_ray_worker_groups_are_clamped_and_multiplied_by_hosts() -> None:
    obj = fixture("raycluster-verl.yaml")
    worker = copy.deepcopy(obj["spec"]["headGroupSpec"])
    obj["spec"]["workerGroupSpecs"] = [
        {**worker, "groupName": "gpu", "replicas": 1, "minReplicas": 2, "maxReplicas": 4,
         "numOfHosts": 2},
        {**worker, "groupName": "big", "replicas": 9, "maxReplicas": 3},
        {**worker, "groupName": "off", "replicas": 3, "suspend": True},
    ]
    w = read_workload("ray.io", "RayCluster", obj)
    assert w is not None
    assert [(r.name, r.pods) for r in w.roles] == [("head", 1), ("gpu", 4), ("big", 3),
                                                   ("off", 0)]


def test_lws_without_leader_template_runs_workers_only() -> None:
    obj = fixture("lws-vllm-gpu.yaml", "LeaderWorkerSet")
    del obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    w = read_workload("leaderworkerset.x-k8s.io", "LeaderWorkerSet", obj)
    assert w is not None
    assert [(r.name, r.pods) for r in w.roles] == [("worker", 4)]


@pytest.mark.parametrize(("group", "kind", "obj", "pointer"), [
    ("batch.volcano.sh", "Job", {"spec": {"tasks": [{"replicas": "2", "template": {}}]}},
     "/spec/tasks/0/replicas"),
    ("batch.volcano.sh", "Job", {"spec": {"tasks": {"a": 1}}}, "/spec/tasks/a"),
    ("kubeflow.org", "PyTorchJob", {"spec": {"pytorchReplicaSpecs": {"Worker": {
        "replicas": -1, "template": {"spec": {}}}}}}, "/spec/pytorchReplicaSpecs/Worker/replicas"),
    ("jobset.x-k8s.io", "JobSet", {"spec": {"replicatedJobs": [{"name": "w", "template": {
        "spec": {"parallelism": True, "template": {"spec": {}}}}}]}},
     "/spec/replicatedJobs/0/template/spec/parallelism"),
    ("ray.io", "RayCluster", {"spec": {"workerGroupSpecs": ["x"]}}, "/spec/workerGroupSpecs/0"),
])
def test_bad_input_names_the_pointer(group: str, kind: str, obj: dict[str, Any],
                                     pointer: str) -> None:
    with pytest.raises(MalformedObject) as exc:
        read_workload(group, kind, obj)
    assert exc.value.pointer == pointer


# --- both webhooks on the fixtures ------------------------------------------------------


def mutate_workload(obj: dict[str, Any], **kw: Any) -> tuple[Any, dict[str, Any]]:
    """The mutating webhook on a workload; the patch must apply, give every template a
    valid pod template, and a second run must change nothing."""
    payload = request_review(copy.deepcopy(obj), **kw)
    decision = mutating(parse_review(orjson.dumps(payload)), example_policy(), namespace_labels)
    patched = jsonpatch.apply_patch(obj, decision.patch, in_place=False)
    w = read_workload(group_of(patched), patched["kind"], patched)
    assert w is not None
    for r in w.roles:
        if r.patchable:
            kubernetes_validate.validate(
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                 "template": r.template.holder}, K8S_VERSION, strict=True)
    again = mutating(parse_review(orjson.dumps(request_review(copy.deepcopy(patched), **kw))),
                     example_policy(), namespace_labels)
    assert again.patch == [], f"not idempotent: {again.patch}"
    return decision, patched


GPU_KINDS = ["volcano-job-mindspore-gpu.yaml", "pytorchjob-mnist-nccl.yaml",
             "lws-vllm-gpu.yaml", "rayjob-pytorch-text-classifier.yaml",
             "raycluster-verl.yaml"]


@pytest.mark.parametrize("name", GPU_KINDS)
def test_every_gpu_template_is_completed_tolerated_and_pinned(name: str) -> None:
    obj = fixture(name)
    decision, patched = mutate_workload(obj)
    assert decision.allowed, decision.message
    w = read_workload(group_of(patched), patched["kind"], patched)
    assert w is not None
    gpu_roles = 0
    for r in w.roles:
        c = r.template.spec["containers"][0]
        if "nvidia.com/gpu" not in (c.get("resources", {}).get("limits") or {}):
            assert "affinity" not in r.template.spec  # a CPU template is left alone
            continue
        gpu_roles += 1
        assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"][
            "nvidia.com/gpu"]
        assert GPU_TOLERATION in r.template.spec["tolerations"]
        terms = r.template.spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {e["key"] for t in terms for e in t["matchExpressions"]} == {
            "nvidia.com/gpu.product", "topology.example.com/gpu-rack"}
    assert gpu_roles >= 1
    # Every patch op is inside a template of the workload.
    pointers = [r.template.pointer for r in w.roles]
    assert all(any(op["path"].startswith(p + "/") for p in pointers) for op in decision.patch)


def test_mutated_volcano_job_passes_validation() -> None:
    decision, patched = mutate_workload(fixture("volcano-job-mindspore-gpu.yaml"))
    assert decision.allowed
    assert validated(patched).allowed


def test_a_bad_template_is_refused_naming_the_task() -> None:
    obj = fixture("volcano-job-mindspore-gpu.yaml")
    obj["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] = "500m"
    decision, _ = mutate_workload(obj)
    assert not decision.allowed
    assert decision.message.startswith(
        'volcano job research/mindspore-gpu, task mpiworker, pod template, container '
        '"mpiworker": nvidia.com/gpu limit 0.5 is not a whole number.')


def test_trainjob_and_argo_are_checked_not_patched() -> None:
    tj = fixture("trainjob-volcano.yaml", "TrainJob")
    tj["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = "2"
    decision, _ = mutate_workload(tj)
    assert decision.allowed and decision.patch == []
    tj["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = "1.5"
    decision, _ = mutate_workload(tj)
    assert not decision.allowed
    assert decision.message.startswith("trainjob research/volcano-example, trainer, "
                                       'container "trainer": nvidia.com/gpu limit')


def _matches(pointer: str, path: tuple[str, ...]) -> bool:
    tokens = pointer.split("/")[1:]
    return len(tokens) == len(path) and all(
        p in ("*", t) for p, t in zip(path, tokens, strict=True))


@pytest.mark.parametrize(("name", "kind", "roles", "gang"), CASES,
                         ids=[c[0].removesuffix(".yaml") for c in CASES])
def test_each_kind_says_where_its_templates_are_where_its_reader_finds_them(
        name: str, kind: str, roles: list[tuple[str | None, int, str]],
        gang: int | None) -> None:
    # The API server's match conditions are written from BuiltIn.templates
    # (webhook.policy.apiserver.webhooks): a reader that found a template elsewhere would let the
    # webhook check pods the API server never sends it.
    obj = fixture(name, kind)
    built_in = next(b for b in CRD_KINDS if (b.group, b.kind) == (group_of(obj), kind))
    w = read_workload(group_of(obj), kind, obj)
    assert w is not None
    for role in w.roles:
        pointer = role.template.pointer
        paths = built_in.templates.paths
        if built_in.templates.made_of == "steps":  # an Argo step: an item of the list
            pointer = pointer.rsplit("/", 1)[0]
        elif built_in.templates.made_of == "resources":  # a TrainJob's, in its trainer
            paths = tuple(p[:-1] for p in paths)
        assert any(_matches(pointer, p) for p in paths), (
            f"{kind}: {role.template.pointer} is not among {built_in.templates.paths}")
