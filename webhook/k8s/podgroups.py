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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP = "scheduling.k8s.io"
VERSION = "v1beta1"
KIND = "PodGroup"
RESOURCE = "podgroups"


def group_of(pod: Mapping[str, Any]) -> str | None:
    """The PodGroup the pod joins (``spec.schedulingGroup.podGroupName``), or None."""
    spec = pod.get("spec")
    group = spec.get("schedulingGroup") if isinstance(spec, Mapping) else None
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return name if isinstance(name, str) and name else None


def group_id(namespace: str, name: str) -> str:
    """What the pods of a PodGroup find its gang by (in the line and the reservations)."""
    return f"{namespace}/podgroup={name}"


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
