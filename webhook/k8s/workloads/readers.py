"""The hand-written readers of the built-in kinds: the core kinds' one template, and
the training and serving kinds whose pods data cannot say (TrainJob: no template;
LeaderWorkerSet: a leader standing in for a worker; Ray: counts clamped and suspended;
Argo: steps made of containers), each written against the project's own API types. The
kinds whose pods are a plain function of their templates are read from their
description (:mod:`webhook.k8s.workloads.described`)."""

from __future__ import annotations

from typing import Any

from webhook.k8s.objects import MalformedObject, child_list, child_map
from webhook.k8s.workloads.shapes import (
    PodTemplate,
    Reader,
    Role,
    Workload,
    _count,
    _get,
    _spec,
    _template_at,
)

# --- the built-in kinds ---------------------------------------------------------------

# (API group, kind) -> path of the pod template (metadata + spec) inside the object,
# or () for a Pod, whose own metadata/spec are the "template".
TEMPLATE_PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "Pod"): (),
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("", "ReplicationController"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}


def pod_template(group: str, kind: str, obj: dict[str, Any]) -> PodTemplate | None:
    """The pod template of a single-template kind, or None if the kind carries none or
    it is absent. Raises MalformedObject when a level on the way has the wrong type."""
    path = TEMPLATE_PATHS.get((group, kind))
    if path is None:
        return None
    holder: dict[str, Any] = obj
    ptr = ""
    for key in path:
        nxt = child_map(holder, key, ptr)
        if nxt is None:
            return None
        holder, ptr = nxt, f"{ptr}/{key}"
    spec = child_map(holder, "spec", ptr)
    if spec is None:
        return None
    return PodTemplate(kind, path == (), holder, ptr, spec)


def replicas(group: str, kind: str, obj: dict[str, Any]) -> int:
    """How many pods of a single-template kind run at once (replicas, or a Job's
    parallelism)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return 1
    if kind == "CronJob":
        job = spec.get("jobTemplate", {}).get("spec", {}) if isinstance(
            spec.get("jobTemplate"), dict) else {}
        spec = job if isinstance(job, dict) else {}
    key = "parallelism" if kind in ("Job", "CronJob") else "replicas"
    value = spec.get(key, 1)
    if kind in ("Job", "CronJob") and isinstance(spec.get("completions"), int):
        # A Job never runs more pods at once than it has completions left.
        comp = spec["completions"]
        value = min(value, comp) if isinstance(value, int) else comp
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedObject(f"/spec/{key}", "a non-negative integer")
    return value


def _single(group: str, kind: str) -> Reader:
    def read(obj: dict[str, Any]) -> Workload | None:
        template = pod_template(group, kind, obj)
        if template is None:
            return None
        pods = 1 if template.is_pod else replicas(group, kind, obj)
        return Workload(kind, kind.lower(), "", [Role(None, template, pods)])
    return read


def trainjob(obj: dict[str, Any]) -> Workload | None:
    """trainer.kubeflow.org/v1alpha1 TrainJob (kubeflow/trainer
    pkg/apis/trainer/v1alpha1/trainjob_types.go): no pod template of its own; the pods
    come from the (Cluster)TrainingRuntime ``spec.runtimeRef`` names, which the webhook
    cannot read without an API call. What the TrainJob itself says is checked at apply:
    ``spec.trainer.numNodes`` (default 1) nodes of ``spec.trainer.resourcesPerNode``,
    all starting together. The pods, built from the runtime, are completed, pinned and
    counted when they are created."""
    trainer, tptr = _get(obj, ("spec", "trainer"))
    if not isinstance(trainer, dict):
        if trainer is not None:
            raise MalformedObject(tptr, "a mapping")
        return None
    res = child_map(trainer, "resourcesPerNode", tptr)
    if res is None:
        return None
    nodes = _count(trainer.get("numNodes"), tptr + "/numNodes", 1)
    # A made-up spec of one container holding resourcesPerNode: only ever read.
    holder = {"spec": {"containers": [{"name": "trainer", "resources": res}]}}
    t = PodTemplate("TrainJob", False, holder, tptr, holder["spec"])
    return Workload("TrainJob", "trainjob", "",
                    [Role("trainer", t, nodes, patchable=False)], nodes)


def leaderworkerset(obj: dict[str, Any]) -> Workload | None:
    """leaderworkerset.x-k8s.io/v1 (kubernetes-sigs/lws
    api/leaderworkerset/v1/leaderworkerset_types.go): ``spec.replicas`` groups (default
    1) of ``spec.leaderWorkerTemplate.size`` pods (default 1): one leader, from
    ``leaderTemplate`` when given, else from ``workerTemplate``, and size - 1 workers.
    Each group is a gang of ``size`` pods."""
    spec = _spec(obj)
    groups = _count(spec.get("replicas"), "/spec/replicas", 1)
    lwt = child_map(spec, "leaderWorkerTemplate", "/spec")
    if lwt is None:
        return None
    ptr = "/spec/leaderWorkerTemplate"
    size = max(_count(lwt.get("size"), ptr + "/size", 1), 1)
    worker = _template_at("LeaderWorkerSet", lwt, "workerTemplate", ptr)
    leader = _template_at("LeaderWorkerSet", lwt, "leaderTemplate", ptr)
    roles = []
    if leader is not None:
        roles.append(Role("leader", leader, groups, 1))
        if worker is not None:
            roles.append(Role("worker", worker, groups * (size - 1), size - 1))
    elif worker is not None:
        roles.append(Role("worker", worker, groups * size, size))
    if not roles:
        return None
    return Workload("LeaderWorkerSet", "leaderworkerset", "", roles, size)


def _ray_roles(kind: str, cluster: dict[str, Any], ptr: str) -> list[Role]:
    roles = []
    head = child_map(cluster, "headGroupSpec", ptr)
    if head is not None:
        t = _template_at(kind, head, "template", ptr + "/headGroupSpec")
        if t is not None:
            roles.append(Role("head", t, 1))
    groups = child_list(cluster, "workerGroupSpecs", ptr) or []
    for i, g in enumerate(groups):
        gptr = f"{ptr}/workerGroupSpecs/{i}"
        if not isinstance(g, dict):
            raise MalformedObject(gptr, "a mapping")
        t = _template_at(kind, g, "template", gptr)
        if t is None:
            continue
        # KubeRay's GetWorkerGroupDesiredReplicas: replicas clamped to [min, max], times
        # numOfHosts (default 1); a suspended group runs none.
        lo = _count(g.get("minReplicas"), gptr + "/minReplicas", 0)
        hi = _count(g.get("maxReplicas"), gptr + "/maxReplicas", 2**31 - 1)
        n = _count(g.get("replicas"), gptr + "/replicas", lo)
        n = lo if n < lo else min(n, hi)
        if g.get("suspend") is True:
            n = 0
        hosts = _count(g.get("numOfHosts"), gptr + "/numOfHosts", 1)
        name = g.get("groupName")
        roles.append(Role(name if isinstance(name, str) and name else str(i), t, n * hosts))
    return roles


def _ray(kind: str, cluster_key: str | None) -> Reader:
    """ray.io/v1 RayCluster, RayJob, RayService (ray-project/kuberay
    ray-operator/apis/ray/v1): ``headGroupSpec.template`` (one pod) and
    ``workerGroupSpecs[].template`` (replicas x numOfHosts), inside ``spec`` for a
    RayCluster, ``spec.rayClusterSpec`` for a RayJob (plus its ``submitterPodTemplate``)
    and ``spec.rayClusterConfig`` for a RayService. No gang: Ray starts workers as they
    are scheduled."""

    def read(obj: dict[str, Any]) -> Workload | None:
        spec = _spec(obj)
        ptr = "/spec"
        cluster: dict[str, Any] | None = spec
        if cluster_key is not None:
            cluster = child_map(spec, cluster_key, ptr)
            ptr = f"/spec/{cluster_key}"
        roles = _ray_roles(kind, cluster, ptr) if cluster is not None else []
        if kind == "RayJob":
            t = _template_at(kind, spec, "submitterPodTemplate", "/spec")
            if t is not None:
                roles.append(Role("submitter", t, 1))
        if not roles:
            return None
        return Workload(kind, kind.lower(), "group", roles)
    return read


def _argo(kind: str, path: tuple[str, ...]) -> Reader:
    """argoproj.io/v1alpha1 Workflow, WorkflowTemplate, CronWorkflow (argoproj/argo-workflows
    pkg/apis/workflow/v1alpha1/workflow_types.go): no pod spec, but each of
    ``spec.templates[]`` that runs a pod holds its ``container``, ``script`` or
    ``containerSet.containers``. Each such template is a role of one pod, checked
    alone (steps run in sequence or fan out: no sum, no gang). ``podSpecPatch`` (a
    string, possibly templated) is not read: the pods are checked when created."""

    def read(obj: dict[str, Any]) -> Workload | None:
        spec, sptr = _get(obj, path)
        if not isinstance(spec, dict):
            if spec is not None:
                raise MalformedObject(sptr, "a mapping")
            return None
        roles = []
        for i, tmpl in enumerate(child_list(spec, "templates", sptr) or []):
            tptr = f"{sptr}/templates/{i}"
            if not isinstance(tmpl, dict):
                raise MalformedObject(tptr, "a mapping")
            containers: list[Any] = []
            for key in ("container", "script"):
                c = child_map(tmpl, key, tptr)
                if c is not None:
                    containers.append({"name": "main", **c})
            cs = child_map(tmpl, "containerSet", tptr)
            if cs is not None:
                containers.extend(child_list(cs, "containers", tptr + "/containerSet") or [])
            if not containers:
                continue
            holder = {"spec": {"containers": containers}}
            name = tmpl.get("name")
            t = PodTemplate(kind, False, holder, tptr, holder["spec"])
            roles.append(Role(name if isinstance(name, str) and name else str(i), t, 1,
                              patchable=False))
        if not roles:
            return None
        return Workload(kind, kind.lower(), "template", roles, sequential=True)
    return read
