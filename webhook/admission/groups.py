"""A PodGroup's gang (the core gang API, ``webhook.k8s.podgroups``) found for one of its
pods before the quota step: how many pods must start together, read from the API server.

A PodGroup has no pod template: what its pods cost is known only when one arrives. So
the first real creation of one of its pods (in a tenant with a quota, and a store that
can reserve gangs) reads the PodGroup (from the watch, else one get), and the quota step
checks ``minCount`` pods like this one against every cap: the pod is refused when the
whole gang does not fit, or the gang is reserved whole and the pod draws the first slot;
the pods after it draw the rest, with no read and nothing counted twice. Members the
cache sees charged already (a pod replaced after the gang started) are subtracted, so a
replacement is checked alone. A PodGroup that cannot be read, or does not exist yet,
leaves the pod counted alone, with a warning that says so. In ``overQuota: wait`` the
pods of a PodGroup wait behind the quota gate instead, and the leader releases the gang
whole (``webhook.server.leading.release``).

A PodGroup under a CompositePodGroup starts in the composite's gang of gangs
(``podgroups.gang``): the composites above it are read the same way (watch, else get),
the gang is reserved under the highest one's uid, and each pod's reservation is also
found by that composite's id, which the pods of its other PodGroups share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.handoff import PodQuota
from webhook.k8s import podgroups
from webhook.quota.store import GangStore, ReleaseStore, UsageStore

# At most this long for the reads of one review's PodGroup and the CompositePodGroups
# above it (once per gang, at its first pod, when the watches do not hold them).
GROUP_READ_SECONDS = 1.0


class GroupUnreadable(Exception):
    """A PodGroup or CompositePodGroup could not be read; the message says why."""


# (kind, namespace, name, timeout in seconds) -> the PodGroup or CompositePodGroup, or
# None when the API server has none of that name; raises GroupUnreadable.
GroupReader = Callable[[str, str, str, float], Awaitable[Mapping[str, Any] | None]]
# A gang's id (podgroups.Gang.id) -> its pods the cache sees charged now.
GroupMembers = Callable[[str], int]


def no_members(group: str) -> int:
    return 0


@dataclass(frozen=True, slots=True)
class GroupGang:
    """What the quota step does before the pod: its reservation also found by ``id``
    (its gang's, which a CompositePodGroup's pods do not carry themselves), and, when
    ``size`` > 1, ``size`` more pods of the gang checked and reserved under ``key`` (the
    gang object's uid). ``name``: the gang as messages name it (``PodGroup train``).
    ``unread``: why the gang could not be learnt (the pod is then counted alone, with a
    warning)."""

    name: str
    id: str
    key: str = ""
    size: int = 0
    composite: bool = False
    unread: str | None = None

    @property
    def owner(self) -> str:
        """Who holds the slots no pod took yet, as messages list holders:
        ``podgroup/train``, ``compositepodgroup/llm``."""
        kind, _, name = self.name.partition(" ")
        return f"{kind.lower()}/{name}"


async def group_gang(step: PodQuota, namespace: str, store: UsageStore | None,
                     read: GroupReader | None, members: GroupMembers, budget: float,
                     seen: ClaimLookup = no_claims) -> GroupGang | None:
    """What to do for this pod's gang before its quota step, or None: the pod joins no
    PodGroup, or there is no store of gangs or no cluster to read from. ``seen``: what
    the watches hold (a PodGroup or CompositePodGroup is read only when they do not).
    Nothing is reserved (``size`` 0) when the gang's reservation holds a slot for the
    pod, or it is the only pod of its gang left to start."""
    res = step.reservation
    if res is None or res.group is None or read is None or not isinstance(store, GangStore):
        return None
    timeout = max(min(GROUP_READ_SECONDS, budget / 2), 0.05)

    async def get(kind: str, name: str) -> Mapping[str, Any] | None:
        found = seen(kind, namespace, name)
        if found is None:
            found = await asyncio.wait_for(read(kind, namespace, name, timeout), timeout)
        return found

    own = f"{podgroups.KIND} {res.group}"
    try:
        podgroup = await get(podgroups.KIND, res.group)
        above: list[Mapping[str, Any]] = []
        parent = podgroups.parent_of(podgroup)
        while podgroup is not None and parent is not None and len(above) < podgroups.MAX_DEPTH:
            found = await get(podgroups.COMPOSITE, parent)
            if found is None:
                break
            above.append(found)
            parent = podgroups.parent_of(found)
    except TimeoutError:
        return GroupGang(own, podgroups.group_id(namespace, res.group),
                         unread=f"the API server did not answer within {timeout:g}s")
    except GroupUnreadable as exc:
        return GroupGang(own, podgroups.group_id(namespace, res.group), unread=str(exc))
    if podgroup is None:
        return GroupGang(own, podgroups.group_id(namespace, res.group),
                         unread="it does not exist yet")
    gang = podgroups.gang(namespace, res.group, podgroup, above)
    size = gang.size - members(gang.id)
    if size <= 1 or (isinstance(store, ReleaseStore)
                     and store.has_slot((*res.gangs, gang.id), res.charge)):
        size = 0
    return GroupGang(gang.named(), gang.id, gang.uid or gang.id, size, gang.composite)
