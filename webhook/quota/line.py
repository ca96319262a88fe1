"""The line of pods waiting for quota: who is waiting, in what order, and which of them
can be released now (the order and the choice are pure; :class:`WaitLine` is the
watch-fed index the leader reads).

Order, per tenant: higher ``spec.priority`` first, then earlier arrival
(``metadata.creationTimestamp``), then name, as the scheduler orders its queue. A *unit*
is one pod, or every waiting pod of one gang (:func:`gang_of`: the pods of a PodGroup of
the core gang API, of a training workload, found by the label its controller puts on
them, or of a Job with parallelism above 1; ``webhook.server.leading.release`` says how
the gang's size is learned); a unit stands in the line at the place of its first pod. A
gang is released only whole: when its waiting pods and those of it already running make
up its size, and all its waiting pods fit together. A gang not complete yet (its
controller is still creating pods) keeps its place and lets the units behind it go; a
complete unit that does not fit stops its tenant's line, so a big job is not passed over
forever by small ones behind it, unless only its user's own caps refuse it
(``quota.check.users_cap_alone``): it keeps its place and the units behind it go, as no
release of others could make it fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.engine.waiting import is_gated
from webhook.k8s import podgroups
from webhook.k8s.identity import ObjectId
from webhook.k8s.workloads import CRD_KINDS, BuiltIn

# A LeaderWorkerSet starts each group of ``size`` pods as one gang: its pods carry the
# group's index (kubernetes-sigs/lws pkg/utils/... GroupIndexLabelKey).
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"


@dataclass(frozen=True, slots=True)
class Waiting:
    """One pod in the line."""

    uid: str
    namespace: str
    name: str
    priority: int
    arrived: str  # creationTimestamp, RFC 3339 in UTC: sorts as text
    gang: str | None  # the gang's key (its Job's uid), None: a pod alone
    gpus: float = 0.0  # GPU-equivalents it asks, for the events and metrics

    def place(self) -> tuple[int, str, str, str]:
        return (-self.priority, self.arrived, self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Unit:
    """What is released at once: one pod, or a gang's waiting pods."""

    pods: tuple[Waiting, ...]
    gang: str | None = None
    size: int = 1  # pods the gang has at once (1 for a pod alone)
    running: int = 0  # pods of the gang that run already (released before)

    @property
    def complete(self) -> bool:
        return len(self.pods) + self.running >= self.size

    @property
    def gpus(self) -> float:
        return sum(p.gpus for p in self.pods)


def line_up(waiting: Iterable[Waiting], sizes: Mapping[str, int] | None = None,
            running: Mapping[str, int] | None = None) -> list[Unit]:
    """One tenant's waiting pods as units, in the order they are released. ``sizes``:
    each gang's size (a gang without one is taken as the pods that wait); ``running``:
    pods of each gang released already."""
    sizes, running = sizes or {}, running or {}
    alone: list[Unit] = []
    gangs: dict[str, list[Waiting]] = {}
    for w in waiting:
        if w.gang is None:
            alone.append(Unit((w,)))
        else:
            gangs.setdefault(w.gang, []).append(w)
    units = alone + [Unit(tuple(sorted(ps, key=Waiting.place)), g,
                          sizes.get(g, len(ps)), running.get(g, 0))
                     for g, ps in gangs.items()]
    return sorted(units, key=lambda u: u.pods[0].place())


def releasable(units: Iterable[Unit]) -> list[Unit]:
    """The units that may be released now, in order: the complete ones (a gang still
    being created does not hold up the line, nor is any of it released)."""
    return [u for u in units if u.complete]


@dataclass(frozen=True, slots=True)
class GangOf:
    """The gang a pod belongs to in the line: its key, and the workload to read its
    size from (``group``/``version``/``resource`` of the kind, ``name`` in the pod's
    namespace)."""

    key: str
    kind: str
    group: str
    version: str
    resource: str
    namespace: str
    name: str
    # Pods that must start together when known without reading the workload (a
    # CompositePodGroup's gang of gangs, resolved from the watches); None: read it.
    size: int | None = None

    @property
    def is_job(self) -> bool:
        return self.group == "batch" and self.kind == "Job"

    def named(self) -> str:
        """As kubectl names it: ``pytorchjob.kubeflow.org/train``, ``job/train``."""
        kind = self.kind.lower() if self.is_job else f"{self.kind.lower()}.{self.group}"
        return f"{kind}/{self.name}"


# The training kinds whose pods make up one gang, by the label their controllers put on
# the pods (several kinds may share one: the Kubeflow jobs, a JobSet and its TrainJob).
_BY_LABEL: dict[str, list[BuiltIn]] = {}
for _b in CRD_KINDS:
    if _b.reserves and _b.pod_label:
        _BY_LABEL.setdefault(_b.pod_label, []).append(_b)


def gang_of(pod: Mapping[str, Any], ident: ObjectId | None = None,
            lookup: podgroups.Lookup | None = None) -> GangOf | None:
    """The gang of a waiting pod: the PodGroup it joins (the core gang API, read first: its
    ``minCount`` is what the scheduler holds the pods to; the CompositePodGroup above it
    whose gang of gangs it is part of, when ``lookup`` holds them), the training workload
    that controls it or whose label it carries (of a label several kinds share, the
    kind its owners name, else the first that makes pods itself: a TrainJob's pods
    are its JobSet's), one group of a LeaderWorkerSet, else the batch Job that
    controls it; None for a pod of neither. ``ident``: the pod's identity when the
    caller has read it already."""
    if ident is None:
        ident = ObjectId.of(pod)
    ns, labels = ident.namespace, ident.labels
    group = podgroups.group_of(pod)
    if group is not None:
        found = lookup(podgroups.KIND, ns, group) if lookup is not None else None
        if found is not None and lookup is not None:
            g = podgroups.gang(ns, group, found, podgroups.parents(ns, found, lookup))
            if g.composite:
                return GangOf(g.id, g.kind, podgroups.GROUP, podgroups.COMPOSITE_VERSION,
                              podgroups.COMPOSITE_RESOURCE, ns, g.name, g.size)
        return GangOf(podgroups.group_id(ns, group), podgroups.KIND, podgroups.GROUP,
                      podgroups.VERSION, podgroups.RESOURCE, ns, group)
    # (group, kind) -> (version, name) of the pod's owners: the version its controller
    # wrote is one the API server serves.
    owned = {(r.group, r.kind): (r.version, r.name) for r in ident.owners if r.api_version}
    for label, kinds in _BY_LABEL.items():
        owner = next((k for k in kinds if (k.group, k.kind) in owned), None)
        name = labels.get(label)
        if owner is not None:
            name = owned[(owner.group, owner.kind)][1]
        if not isinstance(name, str) or not name:
            continue
        b = owner or next((k for k in kinds if k.kind != "TrainJob"), kinds[0])
        key = f"{ns}/{label}={name}"
        group = labels.get(LWS_GROUP) if b.kind == "LeaderWorkerSet" else None
        if isinstance(group, str):
            key = f"{key}/{group}"
        version = owned.get((b.group, b.kind), (b.versions[0], ""))[0]
        return GangOf(key, b.kind, b.group, version, b.resource, ns, name)
    # A Volcano Job is a ``Job`` too, of batch.volcano.sh: not a batch Job's pod.
    job = ident.controlled_by("Job", "batch/v1")
    if job is None or not job.uid:
        return None
    return GangOf(job.uid, "Job", "batch", "v1", "jobs", ns, job.name)


class WaitLine:
    """The gated pods this replica's pod watch has seen, and how many pods of each gang
    run charged (its members released before), fed by ``ClusterState``."""

    def __init__(self, lookup: podgroups.Lookup | None = None) -> None:
        # The PodGroups and CompositePodGroups the watches hold: the pods of a gang of
        # gangs are counted under the CompositePodGroup's key.
        self.lookup = lookup
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> the gated pod
        self._members: dict[str, set[str]] = {}  # gang key -> uids of its charged pods
        self._job_of: dict[str, str] = {}  # pod uid -> its gang's key (charged pods)
        self._fresh: set[str] | None = None  # uids seen since a relist began
        self.version = 0  # bumped on every change the line cares about

    def seen(self, uid: str, pod: dict[str, Any], charged: bool,
             ident: ObjectId | None = None) -> None:
        if self._fresh is not None:
            self._fresh.add(uid)
        if is_gated(pod):
            self.pods[uid] = pod
            self.version += 1
        elif self.pods.pop(uid, None) is not None:
            self.version += 1
        gang = gang_of(pod, ident, self.lookup) if charged else None
        self._member(uid, gang.key if gang else None)

    def gone(self, uid: str) -> None:
        if self.pods.pop(uid, None) is not None:
            self.version += 1
        self._member(uid, None)

    def _member(self, uid: str, job: str | None) -> None:
        old = self._job_of.pop(uid, None)
        if old is not None and old != job:
            members = self._members.get(old)
            if members is not None:
                members.discard(uid)
                if not members:
                    del self._members[old]
            self.version += 1
        if job is not None:
            self._job_of[uid] = job
            self._members.setdefault(job, set()).add(uid)

    def running(self, job: str) -> int:
        """Pods of the gang (its :attr:`GangOf.key`) that hold their charge (released or
        admitted, not ended)."""
        return len(self._members.get(job, ()))

    def reset(self) -> None:
        """A relist begins: what it does not list again is gone once it ends."""
        self._fresh = set()

    def synced(self) -> None:
        fresh, self._fresh = self._fresh, None
        if fresh is None:
            return
        for uid in [u for u in (*self.pods, *self._job_of) if u not in fresh]:
            self.gone(uid)
