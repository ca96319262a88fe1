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
whole (``webhook.server.leading.release``). """

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.handoff import PodQuota
from webhook.k8s import podgroups
from webhook.quota.store import GangStore, ReleaseStore, UsageStore

# At most this long for reading a PodGroup (once per gang, at its first pod).
GROUP_READ_SECONDS = 1.0


class GroupUnreadable(Exception):
    """A PodGroup could not be read; the message says why."""


# (namespace, name, timeout in seconds) -> the PodGroup, or None when the API server has
# none of that name; raises GroupUnreadable.
GroupReader = Callable[[str, str, float], Awaitable[Mapping[str, Any] | None]]
# A PodGroup's id (podgroups.group_id) -> its pods the cache sees charged now.
GroupMembers = Callable[[str], int]


def no_members(group: str) -> int:
    return 0


@dataclass(frozen=True, slots=True)
class GroupGang:
    """What the quota step checks and reserves before the pod: ``size`` more pods of
    PodGroup ``name``, reserved under ``key`` (its uid), found by ``id``. ``unread``:
    why the gang could not be learnt (the pod is then counted alone, with a warning)."""

    name: str
    id: str
    key: str = ""
    size: int = 1
    unread: str | None = None


async def group_gang(step: PodQuota, namespace: str, store: UsageStore | None,
                     read: GroupReader | None, members: GroupMembers, budget: float,
                     seen: ClaimLookup = no_claims) -> GroupGang | None:
    """The gang to reserve before this pod, or None: the pod joins no PodGroup, its
    gang's reservation holds a slot for it, it is the only pod left to start, or there
    is no store of gangs or no cluster to read from. ``seen``: what the watches hold
    (the PodGroup is read only when they do not)."""
    res = step.reservation
    if res is None or res.group is None or read is None or not isinstance(store, GangStore):
        return None
    ident = podgroups.group_id(namespace, res.group)
    if isinstance(store, ReleaseStore) and store.has_slot(res.gangs, res.charge):
        return None
    timeout = max(min(GROUP_READ_SECONDS, budget / 2), 0.05)
    try:
        found = seen(podgroups.KIND, namespace, res.group)
        if found is None:
            found = await asyncio.wait_for(read(namespace, res.group, timeout), timeout)
    except TimeoutError:
        return GroupGang(res.group, ident,
                         unread=f"the API server did not answer within {timeout:g}s")
    except GroupUnreadable as exc:
        return GroupGang(res.group, ident, unread=str(exc))
    if found is None:
        return GroupGang(res.group, ident, unread="it does not exist yet")
    size = podgroups.gang_size(found) - members(ident)
    if size <= 1:
        return None
    return GroupGang(res.group, ident, podgroups.uid_of(found) or ident, size)
