"""DRA claims and claim templates as the webhook knows them: fed by watches, read by
admission (a pod's claims, without an API call) and charged in the cluster's usage.

Two collections are watched, ResourceClaims and ResourceClaimTemplates. Each object is
kept as the admission pipeline reads it (its spec), so a pod that names one is decided
on what the cluster holds; a claim of GPU classes that its pod was not charged for (a
shared, user-made claim) is charged once, under its uid, until it is deleted
(:func:`webhook.engine.charge.charge_of_claim`, the same cost as at admission).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from webhook.engine.charge import charge_of_claim
from webhook.engine.cost import Charge
from webhook.k8s.claims import CLAIM, TEMPLATE
from webhook.policy.compiled import CompiledPolicy

# (uid, charge or None) updates for the usage totals.
Updates = list[tuple[str, Charge | None]]


class ClaimCache:
    """Claims and templates by (kind, namespace, name), and the claims' charges."""

    def __init__(self, policy: Callable[[], CompiledPolicy],
                 labels: Callable[[str], Mapping[str, str] | None]) -> None:
        self.policy = policy
        self.labels = labels
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.charges: dict[str, Charge] = {}  # claim uid -> its charge
        self._uids: dict[tuple[str, str, str], str] = {}
        self.synced: dict[str, bool] = {CLAIM: False, TEMPLATE: False}

    def lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pipeline's view: the object a pod names, if the watch has delivered it."""
        return self.objects.get((kind, namespace, name))

    def ready(self) -> bool:
        return all(self.synced.values())

    def event(self, kind: str, typ: str, obj: dict[str, Any]) -> Updates:
        """Apply one watch event; returns the usage updates it makes."""
        if typ == "SYNCED":
            self.synced[kind] = True
            return []
        if typ == "RESET":
            # A relist follows with every object: drop this kind's, and its charges.
            out: Updates = []
            for key in [k for k in self.objects if k[0] == kind]:
                del self.objects[key]
                uid = self._uids.pop(key, None)
                if uid is not None and self.charges.pop(uid, None) is not None:
                    out.append((uid, None))
            return out
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict):
            return []
        name, ns, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
        if not (isinstance(name, str) and isinstance(ns, str) and isinstance(uid, str)):
            return []
        key = (kind, ns, name)
        if typ == "DELETED":
            self.objects.pop(key, None)
            self._uids.pop(key, None)
            return [(uid, None)] if self.charges.pop(uid, None) is not None else []
        if typ == "PROGRESS":
            return []
        self.objects[key] = obj
        self._uids[key] = uid
        charge = charge_of_claim(kind, obj, self.policy(), self.labels(ns))
        if charge is None:
            return [(uid, None)] if self.charges.pop(uid, None) is not None else []
        self.charges[uid] = charge
        return [(uid, charge)]
