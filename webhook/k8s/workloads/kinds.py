"""The built-in kinds described: where their templates are, what the webhook
configurations need, the labels on their pods, which reserve a gang, and the reader of
each: derived from the kind's :class:`Roles` when its pods are a plain function of its
templates (Volcano, JobSet, Kubeflow), else hand-written (:mod:`.readers`)."""

from __future__ import annotations

from dataclasses import dataclass

from webhook.k8s.identity import ObjectId
from webhook.k8s.workloads.described import Roles, Templates
from webhook.k8s.workloads.readers import (
    TEMPLATE_PATHS,
    _argo,
    _ray,
    _single,
    leaderworkerset,
    trainjob,
)
from webhook.k8s.workloads.shapes import Reader


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
    # Its description, when ``read`` and ``templates`` are derived from one.
    roles: Roles | None = None


def _described(group: str, kind: str, resource: str, versions: tuple[str, ...],
               roles: Roles, reserves: bool = True, pod_label: str | None = None
               ) -> BuiltIn:
    """A built-in kind whose reader and templates are derived from ``roles``."""
    return BuiltIn(group, kind, resource, versions, roles.reader(kind, reserves),
                   roles.templates(), reserves, pod_label, roles)


def _ray_templates(*at: str) -> Templates:
    extra = (("spec", "submitterPodTemplate"),) if at == ("spec", "rayClusterSpec") else ()
    return Templates(((*at, "headGroupSpec", "template"),
                      (*at, "workerGroupSpecs", "*", "template"), *extra))


_KUBEFLOW = (("PyTorchJob", "pytorchjobs", "pytorchReplicaSpecs", ("v1",)),
             ("TFJob", "tfjobs", "tfReplicaSpecs", ("v1",)),
             ("XGBoostJob", "xgboostjobs", "xgbReplicaSpecs", ("v1",)),
             ("PaddleJob", "paddlejobs", "paddleReplicaSpecs", ("v1",)),
             ("JAXJob", "jaxjobs", "jaxReplicaSpecs", ("v1",)),
             ("MPIJob", "mpijobs", "mpiReplicaSpecs", ("v1", "v2beta1")))
_KUBEFLOW_LABEL = "training.kubeflow.org/job-name"
_JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


def _volcano(noun: str, *at: str) -> Roles:
    return Roles(noun, "task", (*at, "tasks"), default_replicas=0, count_first=True,
                 minimum="minAvailable", gang_minimum=("minAvailable",), zero_is_all=True)


def _kubeflow(kind: str, key: str) -> Roles:
    return Roles(kind.lower(), "replica type", ("spec", key), shape="map",
                 gang_minimum=("runPolicy", "schedulingPolicy", "minAvailable"))


# The training and serving kinds known without configuration (core kinds: TEMPLATE_PATHS).
CRD_KINDS: tuple[BuiltIn, ...] = (
    # volcano-sh/apis pkg/apis/batch/v1alpha1/job.go: tasks[] of template, replicas
    # (omitted means 0) and minAvailable (default: the task's replicas); the gang,
    # spec.minAvailable, defaults to (and at 0 is) every task's replicas.
    _described("batch.volcano.sh", "Job", "jobs", ("v1alpha1",),
               _volcano("volcano job", "spec"), pod_label="volcano.sh/job-name"),
    # volcano-sh/volcano config/crd/volcano/bases/batch.volcano.sh_cronjobs.yaml:
    # spec.jobTemplate.spec is the JobSpec of the Jobs it makes on schedule, checked at
    # apply as such a Job; each Job is reserved when it is created, not the CronJob.
    _described("batch.volcano.sh", "CronJob", "cronjobs", ("v1alpha1",),
               _volcano("volcano cronjob", "spec", "jobTemplate", "spec"), False),
    # kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go: replicatedJobs[] of
    # replicas (default 1) Jobs of template (a JobTemplateSpec), each running
    # min(parallelism, completions) pods; its Jobs start together: the gang is all.
    _described("jobset.x-k8s.io", "JobSet", "jobsets", ("v1alpha2",),
               Roles("jobset", "replicated job", ("spec", "replicatedJobs"),
                     ("template", "spec", "template"), count_first=True, job=True),
               pod_label=_JOBSET_LABEL),
    # kubeflow/training-operator pkg/apis/kubeflow.org/v1 common_types.go (ReplicaSpec,
    # RunPolicy, SchedulingPolicy; mpi-operator v2beta1 has the same fields):
    # spec.<key>.<ReplicaType> of replicas (default 1) and template; the gang is
    # runPolicy.schedulingPolicy.minAvailable, else every pod (the operators make a
    # PodGroup of all replicas).
    *(_described("kubeflow.org", k, r, v, _kubeflow(k, key), pod_label=_KUBEFLOW_LABEL)
      for k, r, key, v in _KUBEFLOW),
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


def owned_by_reserving(obj: ObjectId) -> bool:
    """Whether a controller of a reserving kind made ``obj`` (a TrainJob's JobSet): its
    pods are that workload's, already reserved with it."""
    return any((ref.group, ref.kind) in RESERVING for ref in obj.owners)


READERS: dict[tuple[str, str], Reader] = {
    **{gk: _single(*gk) for gk in TEMPLATE_PATHS},
    **{(b.group, b.kind): b.read for b in CRD_KINDS},
}
