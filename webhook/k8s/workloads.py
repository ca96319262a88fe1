"""Where the pod templates live in each kind of object the webhook is sent, how many pods
each runs at once, and how many must start together (the gang).

A Pod carries its spec at ``/spec``; Deployments, ReplicaSets, StatefulSets, DaemonSets
and Jobs at ``/spec/template/spec``; CronJobs one level deeper. Training workloads hold
several templates, one per role (a Volcano task, a JobSet replicated job, a Kubeflow
replica type, a LeaderWorkerSet's leader and workers, a Ray worker group), each with its
own pod count, and a gang minimum: the pods that must run at once for any to make
progress. Checking the templates when the workload itself is applied is what lets
``kubectl apply`` show the developer a problem that would otherwise only appear as an
event on a ReplicaSet, a Job or a PodGroup.

Each built-in kind has a reader written against the project's own API types (sources in
the readers' docstrings); any other kind is read from JSON Pointers the policy gives
(:class:`KindPaths`), where a ``*`` segment stands for every item of a list or map and
each item is one role.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from webhook.k8s.objects import MalformedObject, child_list, child_map, escape


@dataclass(slots=True)
class PodTemplate:
    """A pod's metadata and spec inside an object, with the JSON Pointers to them."""

    kind: str  # Pod, Deployment, ... (as sent)
    is_pod: bool
    holder: dict[str, Any]  # the mapping that holds "metadata" and "spec"
    pointer: str  # JSON Pointer of ``holder`` ("" for a Pod)
    spec: dict[str, Any]

    @property
    def spec_pointer(self) -> str:
        return self.pointer + "/spec"

    @property
    def metadata(self) -> dict[str, Any] | None:
        return child_map(self.holder, "metadata", self.pointer)


@dataclass(slots=True)
class Role:
    """One pod template of a workload and the pods made from it."""

    name: str | None  # "worker", "launcher", ...; None for a single-template kind
    template: PodTemplate
    pods: int  # pods of this template at once
    minimum: int | None = None  # pods of this role the gang needs (None: no own minimum)
    # False when the "template" is made up from the workload's resource fields (a
    # TrainJob's resourcesPerNode, an Argo step's container): checked, never patched;
    # its pods are completed and pinned when they are created.
    patchable: bool = True


@dataclass(slots=True)
class Workload:
    """What an object of a known kind runs: its roles, and its gang minimum in pods."""

    kind: str
    noun: str  # how messages name the kind: "deployment", "volcano job", "pytorchjob"
    role_word: str  # how messages name a role: "task", "replicated job", "replica type"
    roles: list[Role]
    gang: int | None = None  # pods that must start together; None: no gang
    # Pods at once is an upper bound, not a sum (Argo: steps run one after another or
    # fan out): quota is checked per pod, never for the sum.
    sequential: bool = False
    # Its gang is reserved when it is created. False for a kind that only makes
    # workloads (a Volcano CronJob's Jobs are each reserved when the CronJob makes them).
    reserves: bool = True

    @property
    def pods(self) -> int:
        return sum(r.pods for r in self.roles)


Reader = Callable[[dict[str, Any]], "Workload | None"]


# --- helpers ------------------------------------------------------------------------


def _count(value: Any, ptr: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedObject(ptr, "a non-negative integer")
    return value


def _get(obj: Mapping[str, Any], path: tuple[str, ...]) -> tuple[Any, str]:
    """The value at ``path`` (None when a level is absent) and its JSON Pointer."""
    ptr = "".join("/" + escape(k) for k in path)
    cur: Any = obj
    at = ""
    for key in path:
        if cur is None:
            return None, ptr
        if isinstance(cur, list) and key.isdigit():  # an item a ``*`` was bound to
            cur = cur[int(key)] if int(key) < len(cur) else None
        elif isinstance(cur, dict):
            cur = cur.get(key)
        else:
            raise MalformedObject(at, "a mapping")
        at = f"{at}/{escape(key)}"
    return cur, ptr


def _template_at(kind: str, holder_parent: dict[str, Any], key: str, ptr: str
                 ) -> PodTemplate | None:
    """The pod template at ``holder_parent[key]`` (metadata + spec), None when absent."""
    holder = child_map(holder_parent, key, ptr)
    if holder is None:
        return None
    hptr = f"{ptr}/{escape(key)}"
    spec = child_map(holder, "spec", hptr)
    if spec is None:
        return None
    return PodTemplate(kind, False, holder, hptr, spec)


def _items(parent: dict[str, Any], key: str, ptr: str) -> Iterator[tuple[str, dict[str, Any],
                                                                          str]]:
    """(name, item, pointer) of each item of a list (name: its ``name`` or index) or a map."""
    value = parent.get(key)
    base = f"{ptr}/{escape(key)}"
    if value is None:
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise MalformedObject(f"{base}/{i}", "a mapping")
            name = item.get("name")
            yield (name if isinstance(name, str) and name else str(i)), item, f"{base}/{i}"
    elif isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(item, dict):
                raise MalformedObject(f"{base}/{escape(str(k))}", "a mapping")
            yield str(k), item, f"{base}/{escape(str(k))}"
    else:
        raise MalformedObject(base, "a list or a mapping")


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    return child_map(obj, "spec", "") or {}


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


def _job_pods(job_spec: dict[str, Any], ptr: str) -> int:
    """Pods a batch/v1 Job spec runs at once: parallelism (default 1), at most its
    completions."""
    par = _count(job_spec.get("parallelism"), ptr + "/parallelism", 1)
    comp = job_spec.get("completions")
    if comp is not None:
        par = min(par, _count(comp, ptr + "/completions", 1))
    return par


def volcano_job(obj: dict[str, Any]) -> Workload | None:
    """batch.volcano.sh/v1alpha1 Job (volcano-sh/apis pkg/apis/batch/v1alpha1/job.go):
    ``spec.tasks[]`` each with ``template``, ``replicas`` (omitted means 0) and
    ``minAvailable`` (defaults to the task's replicas); ``spec.minAvailable``, the gang,
    defaults to the sum of the tasks' replicas."""
    return _volcano("Job", "volcano job", _spec(obj), "/spec")


def volcano_cronjob(obj: dict[str, Any]) -> Workload | None:
    """batch.volcano.sh/v1alpha1 CronJob (volcano-sh/volcano
    config/crd/volcano/bases/batch.volcano.sh_cronjobs.yaml): ``spec.jobTemplate.spec``
    is the JobSpec of the Volcano Jobs it makes on schedule. Checked at apply as such a
    Job; nothing is reserved for it, since each Job is reserved when it is created."""
    template = child_map(_spec(obj), "jobTemplate", "/spec")
    spec = child_map(template, "spec", "/spec/jobTemplate") if template is not None else None
    if spec is None:
        return None
    w = _volcano("CronJob", "volcano cronjob", spec, "/spec/jobTemplate/spec")
    if w is not None:
        w.reserves = False
    return w


def _volcano(kind: str, noun: str, spec: dict[str, Any], at: str) -> Workload | None:
    roles = []
    for name, task, ptr in _items(spec, "tasks", at):
        n = _count(task.get("replicas"), ptr + "/replicas", 0)
        t = _template_at(kind, task, "template", ptr)
        if t is not None:
            minimum = _count(task.get("minAvailable"), ptr + "/minAvailable", n)
            roles.append(Role(name, t, n, min(minimum, n)))
    if not roles:
        return None
    total = sum(r.pods for r in roles)
    gang = _count(spec.get("minAvailable"), at + "/minAvailable", 0) or total
    return Workload(kind, noun, "task", roles, min(gang, total))


def jobset(obj: dict[str, Any]) -> Workload | None:
    """jobset.x-k8s.io/v1alpha2 JobSet (kubernetes-sigs/jobset
    api/jobset/v1alpha2/jobset_types.go): ``spec.replicatedJobs[]`` each with ``name``,
    ``replicas`` (default 1) Jobs of ``template`` (a JobTemplateSpec); each Job runs
    min(parallelism, completions) pods of ``template.spec.template``. A JobSet's Jobs
    start together: the gang is every pod."""
    spec = _spec(obj)
    roles = []
    for name, rj, ptr in _items(spec, "replicatedJobs", "/spec"):
        jobs = _count(rj.get("replicas"), ptr + "/replicas", 1)
        job = child_map(rj, "template", ptr)
        job_spec = child_map(job, "spec", ptr + "/template") if job is not None else None
        if job_spec is None:
            continue
        jptr = ptr + "/template/spec"
        t = _template_at("JobSet", job_spec, "template", jptr)
        if t is not None:
            roles.append(Role(name, t, jobs * _job_pods(job_spec, jptr)))
    if not roles:
        return None
    return Workload("JobSet", "jobset", "replicated job", roles, sum(r.pods for r in roles))


def _kubeflow(kind: str, key: str) -> Reader:
    """kubeflow.org/v1 jobs (kubeflow/training-operator pkg/apis/kubeflow.org/v1
    common_types.go ReplicaSpec, RunPolicy, SchedulingPolicy; mpi-operator v2beta1 has
    the same fields): ``spec.<key>.<ReplicaType>`` with ``replicas`` (default 1) and
    ``template``; the gang is ``spec.runPolicy.schedulingPolicy.minAvailable``, else
    every pod (the operators make a PodGroup of all replicas)."""

    def read(obj: dict[str, Any]) -> Workload | None:
        spec = _spec(obj)
        roles = []
        for name, rs, ptr in _items(spec, key, "/spec"):
            t = _template_at(kind, rs, "template", ptr)
            if t is not None:
                roles.append(Role(name, t, _count(rs.get("replicas"), ptr + "/replicas", 1)))
        if not roles:
            return None
        total = sum(r.pods for r in roles)
        minimum, mptr = _get(spec, ("runPolicy", "schedulingPolicy", "minAvailable"))
        gang = _count(minimum, "/spec" + mptr, total)
        return Workload(kind, kind.lower(), "replica type", roles, min(gang, total))
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


@dataclass(frozen=True, slots=True)
class Templates:
    """Where a kind's pod specs are, as token paths from the object to each template
    (the mapping that holds ``spec``), for what reads them outside this module (the API
    server's match conditions, :mod:`webhook.tools.manifests`). A ``*`` token is every
    item of a list (``shape`` list) or every value of a map (map). ``made_of`` says what
    is at a path when it is no pod template: a TrainJob's ``resources`` (one container's
    resources) or an Argo ``steps`` list (templates whose containers make up a spec)."""

    paths: tuple[tuple[str, ...], ...]
    shape: Literal["list", "map"] = "list"
    made_of: Literal["template", "resources", "steps"] = "template"


@dataclass(frozen=True, slots=True)
class BuiltIn:
    """A built-in kind: how to read it, and what the webhook configurations need."""

    group: str
    kind: str
    resource: str  # plural, for webhook rules
    versions: tuple[str, ...]
    read: Reader
    templates: Templates  # the same places ``read`` finds the pod templates at
    reserves: bool = True  # a gang may be reserved for it (and released at its DELETE)
    # The label its controllers put on its pods, valued with the workload's name.
    pod_label: str | None = None


def _ray_templates(*at: str) -> Templates:
    extra = (("spec", "submitterPodTemplate"),) if at == ("spec", "rayClusterSpec") else ()
    return Templates(((*at, "headGroupSpec", "template"),
                      (*at, "workerGroupSpecs", "*", "template"), *extra))


_KUBEFLOW = (("PyTorchJob", "pytorchjobs", "pytorchReplicaSpecs"),
             ("TFJob", "tfjobs", "tfReplicaSpecs"),
             ("XGBoostJob", "xgboostjobs", "xgbReplicaSpecs"),
             ("PaddleJob", "paddlejobs", "paddleReplicaSpecs"),
             ("JAXJob", "jaxjobs", "jaxReplicaSpecs"))
_KUBEFLOW_LABEL = "training.kubeflow.org/job-name"
_JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"

# The training and serving kinds known without configuration (core kinds: TEMPLATE_PATHS).
CRD_KINDS: tuple[BuiltIn, ...] = (
    BuiltIn("batch.volcano.sh", "Job", "jobs", ("v1alpha1",), volcano_job,
            Templates((("spec", "tasks", "*", "template"),)), pod_label="volcano.sh/job-name"),
    BuiltIn("batch.volcano.sh", "CronJob", "cronjobs", ("v1alpha1",), volcano_cronjob,
            Templates((("spec", "jobTemplate", "spec", "tasks", "*", "template"),)), False),
    BuiltIn("jobset.x-k8s.io", "JobSet", "jobsets", ("v1alpha2",), jobset,
            Templates((("spec", "replicatedJobs", "*", "template", "spec", "template"),)),
            pod_label=_JOBSET_LABEL),
    *(BuiltIn("kubeflow.org", k, r, ("v1",), _kubeflow(k, key),
              Templates((("spec", key, "*", "template"),), "map"), pod_label=_KUBEFLOW_LABEL)
      for k, r, key in _KUBEFLOW),
    BuiltIn("kubeflow.org", "MPIJob", "mpijobs", ("v1", "v2beta1"),
            _kubeflow("MPIJob", "mpiReplicaSpecs"),
            Templates((("spec", "mpiReplicaSpecs", "*", "template"),), "map"),
            pod_label=_KUBEFLOW_LABEL),
    # A TrainJob's pods: TrainJob -> JobSet of the TrainJob's name (kubeflow/trainer
    # pkg/runtime/framework/plugins/jobset) -> Job -> Pod, labelled with the JobSet's name.
    BuiltIn("trainer.kubeflow.org", "TrainJob", "trainjobs", ("v1alpha1",), trainjob,
            Templates((("spec", "trainer", "resourcesPerNode"),), made_of="resources"),
            pod_label=_JOBSET_LABEL),
    BuiltIn("leaderworkerset.x-k8s.io", "LeaderWorkerSet", "leaderworkersets", ("v1",),
            leaderworkerset,
            Templates(tuple(("spec", "leaderWorkerTemplate", t)
                            for t in ("leaderTemplate", "workerTemplate"))),
            pod_label="leaderworkerset.sigs.k8s.io/name"),
    BuiltIn("ray.io", "RayCluster", "rayclusters", ("v1",), _ray("RayCluster", None),
            _ray_templates("spec"), False),
    BuiltIn("ray.io", "RayJob", "rayjobs", ("v1",), _ray("RayJob", "rayClusterSpec"),
            _ray_templates("spec", "rayClusterSpec"), False),
    BuiltIn("ray.io", "RayService", "rayservices", ("v1",),
            _ray("RayService", "rayClusterConfig"),
            _ray_templates("spec", "rayClusterConfig"), False),
    BuiltIn("argoproj.io", "Workflow", "workflows", ("v1alpha1",),
            _argo("Workflow", ("spec",)), Templates((("spec", "templates"),), made_of="steps"),
            False),
    BuiltIn("argoproj.io", "WorkflowTemplate", "workflowtemplates", ("v1alpha1",),
            _argo("WorkflowTemplate", ("spec",)),
            Templates((("spec", "templates"),), made_of="steps"), False),
    BuiltIn("argoproj.io", "CronWorkflow", "cronworkflows", ("v1alpha1",),
            _argo("CronWorkflow", ("spec", "workflowSpec")),
            Templates((("spec", "workflowSpec", "templates"),), made_of="steps"), False),
)

# Labels the controllers put on their pods, naming the workload: (group, kind) -> key.
POD_LABELS: dict[tuple[str, str], str] = {
    (b.group, b.kind): b.pod_label for b in CRD_KINDS if b.pod_label}

# The kinds whose gang is reserved when they are created.
RESERVING: frozenset[tuple[str, str]] = frozenset(
    (b.group, b.kind) for b in CRD_KINDS if b.reserves)


def owned_by_reserving(obj: Mapping[str, Any]) -> bool:
    """Whether a controller of a reserving kind made ``obj`` (a TrainJob's JobSet): its
    pods are that workload's, already reserved with it."""
    meta = obj.get("metadata")
    for ref in (meta.get("ownerReferences") or () if isinstance(meta, dict) else ()):
        if isinstance(ref, dict) and isinstance(ref.get("apiVersion"), str):
            group = ref["apiVersion"].rpartition("/")[0]
            if (group, ref.get("kind")) in RESERVING:
                return True
    return False


READERS: dict[tuple[str, str], Reader] = {
    **{gk: _single(*gk) for gk in TEMPLATE_PATHS},
    **{(b.group, b.kind): b.read for b in CRD_KINDS},
}


# --- kinds the policy configures ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RolePaths:
    """One kind of role of a configured kind, as pointer token paths; ``*`` in
    ``template`` is every item of a list or map, and the other paths share its prefix
    up to the last ``*`` (the same item)."""

    template: tuple[str, ...]
    replicas: tuple[str, ...] | None = None
    name: tuple[str, ...] | None = None
    default_replicas: int = 1


@dataclass(frozen=True, slots=True)
class KindPaths:
    """A kind the policy configures: where its templates, counts and gang are."""

    kind: str
    roles: tuple[RolePaths, ...]
    gang_minimum: tuple[str, ...] | None = None
    gang_all: bool = False
    noun: str = ""
    role_word: str = "role"

    def read(self, obj: dict[str, Any]) -> Workload | None:
        roles: list[Role] = []
        for rp in self.roles:
            for tokens, ptr, holder in _expand(obj, rp.template):
                spec = child_map(holder, "spec", ptr)
                if spec is None:
                    continue
                t = PodTemplate(self.kind, False, holder, ptr, spec)
                name = "/".join(tokens) if tokens else None
                if rp.name is not None:
                    value, _ = _get(obj, _bind(rp.name, tokens))
                    if isinstance(value, str) and value:
                        name = value
                pods = rp.default_replicas
                if rp.replicas is not None:
                    value, vptr = _get(obj, _bind(rp.replicas, tokens))
                    pods = _count(value, vptr, rp.default_replicas)
                roles.append(Role(name, t, pods))
        if not roles:
            return None
        total = sum(r.pods for r in roles)
        gang = total if self.gang_all else None
        if self.gang_minimum is not None:
            value, vptr = _get(obj, self.gang_minimum)
            if value is not None:
                gang = min(_count(value, vptr, total), total)
        return Workload(self.kind, self.noun or self.kind.lower(), self.role_word, roles, gang)


def _bind(path: tuple[str, ...], tokens: tuple[str, ...]) -> tuple[str, ...]:
    """``path`` with its ``*`` replaced, in order, by the item keys of one role."""
    out, it = [], iter(tokens)
    for p in path:
        out.append(next(it, p) if p == "*" else p)
    return tuple(out)


def _expand(obj: Any, path: tuple[str, ...], ptr: str = "", tokens: tuple[str, ...] = ()
            ) -> Iterator[tuple[tuple[str, ...], str, dict[str, Any]]]:
    """(item keys, pointer, mapping) for every match of ``path`` in ``obj``."""
    if not path:
        if obj is None:
            return
        if not isinstance(obj, dict):
            raise MalformedObject(ptr, "a mapping")
        yield tokens, ptr, obj
        return
    if obj is None:
        return
    head, rest = path[0], path[1:]
    if head == "*":
        if isinstance(obj, list):
            for i, item in enumerate(obj):
                yield from _expand(item, rest, f"{ptr}/{i}", (*tokens, str(i)))
        elif isinstance(obj, dict):
            for k, item in obj.items():
                yield from _expand(item, rest, f"{ptr}/{escape(str(k))}", (*tokens, str(k)))
        else:
            raise MalformedObject(ptr, "a list or a mapping")
        return
    if not isinstance(obj, dict):
        raise MalformedObject(ptr, "a mapping")
    yield from _expand(obj.get(head), rest, f"{ptr}/{escape(head)}", tokens)


def read_workload(group: str, kind: str, obj: dict[str, Any],
                  configured: Mapping[tuple[str, str], KindPaths] | None = None
                  ) -> Workload | None:
    """The roles of ``obj``, or None when its kind is unknown or it holds no template.
    Raises MalformedObject when a level on the way has the wrong JSON type."""
    reader = READERS.get((group, kind))
    if reader is not None:
        return reader(obj)
    paths = configured.get((group, kind)) if configured else None
    return paths.read(obj) if paths is not None else None
