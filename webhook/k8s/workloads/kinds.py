"""The built-in kinds described: where their templates are, what the webhook
configurations need, the labels on their pods, which reserve a gang, and the reader of
each."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from webhook.k8s.workloads.readers import (
    TEMPLATE_PATHS,
    _argo,
    _kubeflow,
    _ray,
    _single,
    jobset,
    leaderworkerset,
    trainjob,
    volcano_cronjob,
    volcano_job,
)
from webhook.k8s.workloads.shapes import Reader


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
