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

Modules: shapes (templates, roles, workloads; the path helpers), readers (the built-in
kinds' readers), kinds (the built-in kinds described), configured (kinds the policy
configures, and ``read_workload``).
"""

from webhook.k8s.workloads.configured import KindPaths, RolePaths, read_workload
from webhook.k8s.workloads.kinds import (
    CRD_KINDS,
    POD_LABELS,
    READERS,
    RESERVING,
    BuiltIn,
    Templates,
    owned_by_reserving,
)
from webhook.k8s.workloads.readers import (
    TEMPLATE_PATHS,
    jobset,
    leaderworkerset,
    pod_template,
    replicas,
    trainjob,
    volcano_cronjob,
    volcano_job,
)
from webhook.k8s.workloads.shapes import PodTemplate, Reader, Role, Workload

__all__ = [
    "CRD_KINDS",
    "POD_LABELS",
    "READERS",
    "RESERVING",
    "TEMPLATE_PATHS",
    "BuiltIn",
    "KindPaths",
    "PodTemplate",
    "Reader",
    "Role",
    "RolePaths",
    "Templates",
    "Workload",
    "jobset",
    "leaderworkerset",
    "owned_by_reserving",
    "pod_template",
    "read_workload",
    "replicas",
    "trainjob",
    "volcano_cronjob",
    "volcano_job",
]
