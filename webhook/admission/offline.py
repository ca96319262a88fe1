"""One review through both webhooks, outside the HTTP path: what ``review``, ``review
--replay``, ``test`` and ``audit`` (the command, and the server's periodic audit) all run.

It does what the API server does around the two webhooks: the mutating webhook's patch
is applied, a created pod gets its uid and generated name (the validating webhook sees
the final object), then the validating webhook decides, with quota against the given
usage store. An admitted pod creation reserves its quota in that store, so the pods of
one manifest file or one test suite count against each other as they would in a cluster.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import jsonpatch

from webhook.admission.webhooks import Cluster, mutating, validating
from webhook.engine import capacity
from webhook.engine.claims import is_claim
from webhook.engine.decision import Decision
from webhook.engine.target import NamespaceLabels, no_labels
from webhook.k8s import slices
from webhook.k8s.claims import GROUP
from webhook.k8s.identity import ObjectId
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.budget import Spending
from webhook.quota.claims import DeviceIndex
from webhook.quota.store import MemoryStore


@dataclass(slots=True)
class Outcome:
    mutating: Decision
    validating: Decision | None  # None when the mutating webhook denied
    patched: dict[str, Any] | None  # the object after the mutating patch
    reserved: bool = False  # quota was reserved in the store

    @property
    def allowed(self) -> bool:
        return self.mutating.allowed and self.validating is not None and \
            self.validating.allowed

    @property
    def phase(self) -> str | None:
        """Which webhook denied: "mutating", "validating", or None when allowed."""
        if not self.mutating.allowed:
            return "mutating"
        return None if self.allowed else "validating"

    @property
    def decisions(self) -> list[Decision]:
        return [self.mutating] + ([self.validating] if self.validating else [])

    @property
    def message(self) -> str:
        return next((d.message for d in self.decisions if not d.allowed), "")

    @property
    def warnings(self) -> list[str]:
        return [w for d in self.decisions for w in d.warnings]

    def rules(self) -> list[str]:
        """Rules with findings, first seen first, each once."""
        seen: list[str] = []
        for d in self.decisions:
            for f in d.findings:
                if f.rule.value not in seen:
                    seen.append(f.rule.value)
        return seen


def as_stored(pod: dict[str, Any], uid: str) -> None:
    """Give a created pod the uid and generated name the API server would."""
    meta = pod.setdefault("metadata", {})
    if isinstance(meta, dict):
        meta.setdefault("uid", uid)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uid.rsplit('-', 1)[-1]:0>5}"


class ClaimBook:
    """The ResourceClaims and ResourceClaimTemplates admitted so far in one offline run
    (a manifest file, a test suite): what the server's watch cache would hold, so a pod
    later in the file that uses them is decided as it would be in a cluster. The
    ResourceSlices of the run too: a claim of part of a device after them is charged its
    share of the devices they publish (webhook.engine.capacity)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        self._slices: dict[str, slices.Slice] = {}
        self._index: DeviceIndex | None = None

    def __call__(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        if kind in (capacity.PRODUCT_CAPACITY, capacity.DEVICE):
            if self._index is None:
                self._index = DeviceIndex(self._slices.values())
            return self._index.lookup(kind, namespace, name)
        return self._known.get((kind, namespace, name))

    def add(self, req: AdmissionRequest, obj: dict[str, Any]) -> None:
        name = ObjectId.of(obj).name
        if is_claim(req) and name:
            self._known[(req.kind, req.namespace, name)] = obj
        elif req.group == GROUP and req.kind == slices.SLICE and name:
            parsed = slices.parse(obj)
            if parsed is not None:
                self._slices[name] = parsed
                self._index = None


def through_both(req: AdmissionRequest, policy: CompiledPolicy,
                 labels: NamespaceLabels = no_labels, store: MemoryStore | None = None,
                 claims: ClaimBook | None = None, now: float | None = None,
                 spent: Spending | None = None) -> Outcome:
    """Run a parsed AdmissionReview through the admission pipeline: mutating, the patch
    applied as the API server applies it, then validating (with quota). An admitted claim
    or template goes into ``claims``, for the objects after it. ``req`` is left as it
    is, so one review can be run under two policies (``review --replay``). ``spent``:
    what the tenants' GPU-hour budgets have used (none: nothing)."""
    original = req.object
    req = replace(req, object=copy.deepcopy(original))  # the mutating webhook edits it
    book = claims if claims is not None else ClaimBook()
    store = store if store is not None else MemoryStore()
    # ``now``: the time the review is decided at (unix seconds; default the system's),
    # which chooses a tenant's quota window, for both webhooks alike.
    at = time.time() if now is None else now
    spent = spent if spent is not None else Spending(at=at)
    m = mutating(req, policy, labels, book, store, now=at, spent=spent)
    if not m.allowed:
        return Outcome(m, None, None)
    patched = (jsonpatch.apply_patch(original, m.patch) if m.patch
               else copy.deepcopy(original))
    final = copy.deepcopy(patched)
    if (final is not None and req.operation == "CREATE"
            and ((req.kind == "Pod" and req.group == "") or is_claim(req))):
        as_stored(final, req.uid)
    commits = store.commits
    vreq = replace(req, object=final)
    cluster = Cluster(labels, store, claims=book, clock=lambda: at,
                      spending=lambda: spent)
    v = asyncio.run(validating(vreq, policy, cluster))
    if v.allowed and final is not None:
        book.add(vreq, final)
    return Outcome(m, v, patched, reserved=store.commits > commits)
