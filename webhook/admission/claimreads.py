"""DRA claims and templates a review names that the watch has not delivered yet, read
from the API server before the review is decided.

``kubectl apply -f`` of one file holding a ResourceClaimTemplate and the pod that uses
it (how NVIDIA's DRA driver demos are written) creates the two a few milliseconds apart;
the pod's review can arrive before the claim watch has delivered the template, and the
engine refuses a pod whose template it cannot see (rule ``unknown-claim``: its GPUs
could not be counted). So before deciding, each claim or template the review names and
the cache lacks is read once from the API server, within a short deadline inside the
review's budget, and the engine decides with what was read. A name the API server does
not know, or a read that fails, is said so in the denial (:class:`ReadThrough`).

Only a miss costs an API call: a pod whose claims the cache holds is decided without one,
as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.engine.devices import ClaimLookup
from webhook.k8s import podgroups
from webhook.k8s.claims import CLAIM, TEMPLATE
from webhook.k8s.review import AdmissionRequest
from webhook.libs import logs

# At most this long for the reads of one review (they run at once): the template was
# created a moment ago, and an API server slower than this is struggling.
CLAIM_READ_SECONDS = 1.0


class ClaimUnreadable(Exception):
    """A claim or template could not be read; the message says why."""


# (kind, namespace, name, timeout in seconds) -> the object, or None when the API server
# has none of that name; raises ClaimUnreadable.
ClaimReader = Callable[[str, str, str, float], Awaitable[Mapping[str, Any] | None]]

Key = tuple[str, str, str]  # (kind, namespace, name)


@dataclass(frozen=True, slots=True)
class ReadThrough:
    """The claim lookup of one review: the watch cache, then what was read for it.
    ``unseen`` says why a name is still missing, for the denial."""

    cache: ClaimLookup
    read: Mapping[Key, Mapping[str, Any]] = field(default_factory=dict)
    absent: frozenset[Key] = frozenset()  # the API server has none of that name
    failed: Mapping[Key, str] = field(default_factory=dict)  # why the read failed

    def __call__(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        found = self.cache(kind, namespace, name)
        return found if found is not None else self.read.get((kind, namespace, name))

    def unseen(self, kind: str, namespace: str, name: str) -> str | None:
        """"absent", the reason a read failed, or None (not read)."""
        key = (kind, namespace, name)
        if key in self.absent:
            return "absent"
        return self.failed.get(key)


def named(req: AdmissionRequest) -> list[Key]:
    """The claims and templates the review's object names in its pod spec (or specs),
    and the PodGroup of a pod that joins one and names a template."""
    obj = req.object
    if not isinstance(obj, dict) or not req.namespace:
        return []
    if req.kind == "Pod":
        spec = obj.get("spec")
        entries = spec.get("resourceClaims") if isinstance(spec, dict) else None
        found = list(_entries(entries))
        group = podgroups.group_of(obj)
        if group is not None and any(kind == TEMPLATE for kind, _ in found):
            # Its template claims may be its PodGroup's, one claim for the whole group.
            found.append((podgroups.KIND, group))
    else:
        found = list(_walk(obj.get("spec"), 0))
    out: list[Key] = []
    for kind, name in found:
        key = (kind, req.namespace, name)
        if key not in out:
            out.append(key)
    return out


def _entries(entries: object) -> Iterator[tuple[str, str]]:
    if not isinstance(entries, list):
        return
    for e in entries:
        if not isinstance(e, dict):
            continue
        template, claim = e.get("resourceClaimTemplateName"), e.get("resourceClaimName")
        if isinstance(template, str) and template:
            yield TEMPLATE, template
        elif isinstance(claim, str) and claim:
            yield CLAIM, claim


def _walk(node: object, depth: int) -> Iterator[tuple[str, str]]:
    """Every pod spec's ``resourceClaims`` inside a workload, whatever its kind's layout
    (a Deployment's one template, a Volcano Job's tasks, a JobSet's jobs' templates)."""
    if depth > 12:
        return
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "resourceClaims":
                yield from _entries(v)
            elif isinstance(v, (dict, list)):
                yield from _walk(v, depth + 1)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v, depth + 1)


async def seeing(req: AdmissionRequest, cache: ClaimLookup, read: ClaimReader | None,
                 budget: float) -> ClaimLookup:
    """The lookup to decide ``req`` with: ``cache`` itself when it holds every claim and
    template the object names (or there is no cluster to ask), else a
    :class:`ReadThrough` with the missing ones read from the API server."""
    if read is None:
        return cache
    missing = [k for k in named(req) if cache(*k) is None]
    if not missing:
        return cache
    timeout = max(min(CLAIM_READ_SECONDS, budget / 2), 0.05)

    async def one(key: Key) -> Mapping[str, Any] | str | None:
        try:
            return await asyncio.wait_for(read(*key, timeout), timeout)
        except TimeoutError:
            return f"the API server did not answer within {timeout:g}s"
        except ClaimUnreadable as exc:
            return str(exc)

    results = await asyncio.gather(*(one(k) for k in missing))
    found: dict[Key, Mapping[str, Any]] = {}
    absent: set[Key] = set()
    failed: dict[Key, str] = {}
    for key, got in zip(missing, results, strict=True):
        if got is None:
            absent.add(key)
        elif isinstance(got, str):
            failed[key] = got
        else:
            found[key] = got
    logs.event("claims read from the API server before the watch delivered them",
               logging.INFO if not failed else logging.WARNING, uid=req.uid,
               namespace=req.namespace, read=len(found), absent=len(absent),
               failed="; ".join(failed.values()) or None)
    return ReadThrough(cache, found, frozenset(absent), failed)
