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

A built-in kind whose pods are a plain function of its templates (Volcano, JobSet,
Kubeflow) is described as data (:class:`Roles`), its reader derived from that one
description; the others have a reader written against the project's own API types
(sources in the readers' docstrings and the kinds' table). Any other kind is read from
JSON Pointers the policy gives (:class:`KindPaths`), where a ``*`` segment stands for
every item of a list or map and each item is one role.

Modules: shapes (templates, roles, workloads; the path helpers), described (the kinds
described as data, and the reader derived from a description), readers (the built-in
kinds' hand-written readers), kinds (the built-in kinds' table), configured (kinds the
policy configures, and ``read_workload``).
"""

from webhook.k8s.workloads.configured import KindPaths, RolePaths, read_workload
from webhook.k8s.workloads.described import Roles, Templates
from webhook.k8s.workloads.kinds import (
    CRD_KINDS,
    POD_LABELS,
    READERS,
    RESERVING,
    BuiltIn,
    owned_by_reserving,
)
from webhook.k8s.workloads.readers import (
    TEMPLATE_PATHS,
    leaderworkerset,
    pod_template,
    replicas,
    trainjob,
)
from webhook.k8s.workloads.shapes import PodTemplate, Reader, Role, Workload, job_pods

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
    "Roles",
    "Templates",
    "Workload",
    "job_pods",
    "leaderworkerset",
    "owned_by_reserving",
    "pod_template",
    "read_workload",
    "replicas",
    "trainjob",
]
