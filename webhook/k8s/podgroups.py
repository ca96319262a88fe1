"""The core gang API (``scheduling.k8s.io/v1beta1``, Kubernetes 1.37, gate
``GenericWorkload``, beta and off by default) as the webhook reads it.

A pod joins a gang through ``spec.schedulingGroup.podGroupName``: the name of a
PodGroup in its namespace, which may not exist yet when the pod is created (the field is
immutable). The PodGroup says how its pods are scheduled: ``spec.schedulingPolicy.gang``
with ``minCount`` (that many pods are placed together or none), or ``basic`` (each pod
alone). A PodGroup carries no pod template, so what one of its pods costs is learnt
from the pods themselves. A Workload (``spec.podGroupTemplates[]``) only describes the
PodGroups a controller will make; the PodGroup is what the scheduler acts on, and what
is read here. Types: ``k8s.io/api`` v0.37 ``scheduling/v1beta1/types.go`` and
``core/v1/types.go`` (``PodSchedulingGroup``).

PodGroups may be grouped in turn: a PodGroup's ``spec.parentCompositePodGroupName`` names
a CompositePodGroup (``scheduling.k8s.io/v1alpha3``, gate ``CompositePodGroup``, alpha in
1.37) whose ``schedulingPolicy.gang.minGroupCount`` child groups are placed together or
none, and a CompositePodGroup may have a parent of its own (a tree of at most 4 levels).
The gang a pod starts in (:func:`gang`) is then the highest gang of gangs above its
PodGroup: ``minGroupCount`` x ... x ``minCount`` pods, taken to be alike (the children of
one composite are made from one template).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

GROUP = "scheduling.k8s.io"
VERSION = "v1beta1"
KIND = "PodGroup"
RESOURCE = "podgroups"
COMPOSITE = "CompositePodGroup"
COMPOSITE_VERSION = "v1alpha3"
COMPOSITE_RESOURCE = "compositepodgroups"
MAX_DEPTH = 4  # levels of a Workload's tree (WorkloadMaxTreeDepth)


def group_of(pod: Mapping[str, Any]) -> str | None:
    """The PodGroup the pod joins (``spec.schedulingGroup.podGroupName``), or None."""
    spec = pod.get("spec")
    group = spec.get("schedulingGroup") if isinstance(spec, Mapping) else None
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return name if isinstance(name, str) and name else None


def group_id(namespace: str, name: str, kind: str = KIND) -> str:
    """What the pods of a PodGroup (or of the PodGroups of a CompositePodGroup) find its
    gang by (in the line and the reservations)."""
    return f"{namespace}/{kind.lower()}={name}"


def parent_of(obj: Mapping[str, Any] | None) -> str | None:
    """The CompositePodGroup a PodGroup (or a CompositePodGroup) belongs to, or None."""
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    name = spec.get("parentCompositePodGroupName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else None


def min_groups(composite: Mapping[str, Any]) -> int | None:
    """A CompositePodGroup's ``minGroupCount`` (its children placed together or none);
    None for a ``basic`` one (each child on its own) or one that cannot be read."""
    spec = composite.get("spec")
    policy = spec.get("schedulingPolicy") if isinstance(spec, Mapping) else None
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    count = gang.get("minGroupCount") if isinstance(gang, Mapping) else None
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        return count
    return None


@dataclass(frozen=True, slots=True)
class Gang:
    """The gang a PodGroup's pods start in: its own, or the gang of gangs of the highest
    CompositePodGroup above it whose children must start together."""

    namespace: str
    kind: str  # KIND or COMPOSITE
    name: str
    uid: str
    size: int  # pods that must start together

    @property
    def id(self) -> str:
        return group_id(self.namespace, self.name, self.kind)

    @property
    def composite(self) -> bool:
        return self.kind == COMPOSITE

    def named(self) -> str:
        """As messages name it: ``PodGroup train``, ``CompositePodGroup llm``."""
        return f"{self.kind} {self.name}"


def gang(namespace: str, name: str, podgroup: Mapping[str, Any],
         parents: list[Mapping[str, Any]]) -> Gang:
    """The gang of PodGroup ``name`` (``podgroup``), given the CompositePodGroups above
    it, nearest first, as far as they are known: a composite that is ``basic`` (or not
    known) ends the climb, its children each a gang of their own."""
    out = Gang(namespace, KIND, name, uid_of(podgroup), gang_size(podgroup))
    for parent in parents[:MAX_DEPTH]:
        groups = min_groups(parent)
        meta = parent.get("metadata")
        pname = meta.get("name") if isinstance(meta, Mapping) else None
        if groups is None or not isinstance(pname, str):
            break
        out = Gang(namespace, COMPOSITE, pname, uid_of(parent), out.size * groups)
    return out


Lookup = Callable[[str, str, str], Mapping[str, Any] | None]  # (kind, namespace, name)


def parents(namespace: str, obj: Mapping[str, Any] | None,
            lookup: Lookup) -> list[Mapping[str, Any]]:
    """The CompositePodGroups above ``obj`` that ``lookup(kind, namespace, name)`` holds,
    nearest first (stopping at the first it does not)."""
    out: list[Mapping[str, Any]] = []
    parent = parent_of(obj)
    while parent is not None and len(out) < MAX_DEPTH:
        found = lookup(COMPOSITE, namespace, parent)
        if found is None:
            break
        out.append(found)
        parent = parent_of(found)
    return out


def gang_size(podgroup: Mapping[str, Any]) -> int:
    """Pods of the PodGroup that must start together: its gang's ``minCount``; 1 for a
    ``basic`` PodGroup, or one whose policy cannot be read (each pod then stands alone,
    as the scheduler places it)."""
    spec = podgroup.get("spec")
    policy = spec.get("schedulingPolicy") if isinstance(spec, Mapping) else None
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    count = gang.get("minCount") if isinstance(gang, Mapping) else None
    if isinstance(count, int) and not isinstance(count, bool) and count > 1:
        return count
    return 1


def uid_of(podgroup: Mapping[str, Any]) -> str:
    meta = podgroup.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


SharedClaim = tuple[str, str | None, str | None]  # (name, claim, template)


def shared_claims(podgroup: Mapping[str, Any] | None) -> frozenset[SharedClaim]:
    """The PodGroup's claims (``spec.resourceClaims``, gate ``DRAWorkloadResourceClaims``,
    beta and off in 1.37), as (name, resourceClaimName, resourceClaimTemplateName): a
    pod's claim entry equal to one of them in all three resolves to the one claim made
    for the whole group (owned by the PodGroup), not to a claim of its own."""
    spec = podgroup.get("spec") if isinstance(podgroup, Mapping) else None
    entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    out: set[SharedClaim] = set()
    for e in entries if isinstance(entries, list) else ():
        if not isinstance(e, Mapping) or not isinstance(e.get("name"), str):
            continue
        claim, template = e.get("resourceClaimName"), e.get("resourceClaimTemplateName")
        out.add((e["name"], claim if isinstance(claim, str) and claim else None,
                 template if isinstance(template, str) and template else None))
    return frozenset(out)


def owned_by_group(meta: Mapping[str, Any]) -> bool:
    """Whether an object (a ResourceClaim) is controlled by a PodGroup: the claim the
    resourceclaim controller makes for a whole group from a template."""
    refs = meta.get("ownerReferences")
    for r in refs if isinstance(refs, list) else ():
        if (isinstance(r, Mapping) and r.get("controller") is True and r.get("kind") == KIND
                and str(r.get("apiVersion", "")).startswith(GROUP + "/")):
            return True
    return False
