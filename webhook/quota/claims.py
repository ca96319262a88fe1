"""DRA claims and claim templates as the webhook knows them: fed by watches, read by
admission (a pod's claims, without an API call) and charged in the cluster's usage.

Two collections are watched, ResourceClaims and ResourceClaimTemplates. Each object is
kept as the admission pipeline reads it (its spec), so a pod that names one is decided
on what the cluster holds; a claim of GPU classes that its pod was not charged for (a
shared, user-made claim) is charged once, under its uid, until it is deleted
(:func:`webhook.engine.charge.charge_of_claim`, the same cost as at admission).

ResourceSlices are kept too, when watched: what each device holds, so that a claim of
part of a device is charged its share (webhook.engine.capacity). The lookup serves them
under that module's pseudo-kinds. A slice that changes what a product's shareable
devices hold, or what an allocated device is, changes the charges of the claims: they are
charged again (once the slices are listed; the claims listed before them are charged
again then).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.engine import capacity
from webhook.engine.charge import charge_of_claim
from webhook.engine.cost import Charge
from webhook.k8s import podgroups, slices
from webhook.k8s.claims import CLAIM, TEMPLATE
from webhook.k8s.identity import ObjectId
from webhook.k8s.slices import SLICE
from webhook.policy.compiled import CompiledPolicy

# (uid, charge or None) updates for the usage totals.
Updates = list[tuple[str, Charge | None]]


class ClaimCache:
    """Claims and templates (and PodGroups, whose claims their pods share) by (kind,
    namespace, name), and the claims' charges."""

    def __init__(self, policy: Callable[[], CompiledPolicy],
                 labels: Callable[[str], Mapping[str, str] | None]) -> None:
        self.policy = policy
        self.labels = labels
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.charges: dict[str, Charge] = {}  # claim uid -> its charge
        self._uids: dict[tuple[str, str, str], str] = {}
        self.synced: dict[str, bool] = {CLAIM: False, TEMPLATE: False}
        self.slices: dict[str, slices.Slice] = {}  # ResourceSlice name -> what it holds
        self._index: DeviceIndex | None = None  # built from the slices when asked

    def watch_slices(self) -> None:
        """Keep ResourceSlices too (their watch then counts for readiness)."""
        self.synced[SLICE] = False

    def watch_groups(self) -> None:
        """Keep PodGroups and CompositePodGroups too (the claims a group's pods share,
        their gangs)."""
        self.synced[podgroups.KIND] = False
        self.synced[podgroups.COMPOSITE] = False

    def lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pipeline's view: the object a pod names, if the watch has delivered it;
        what the slices say of a product's or a device's capacity
        (webhook.engine.capacity's pseudo-kinds)."""
        if kind in (capacity.PRODUCT_CAPACITY, capacity.DEVICE):
            if self._index is None:
                self._index = DeviceIndex(self.slices.values())
            return self._index.lookup(kind, namespace, name)
        return self.objects.get((kind, namespace, name))

    def ready(self) -> bool:
        return all(self.synced.values())

    def event(self, kind: str, typ: str, obj: dict[str, Any]) -> Updates:
        """Apply one watch event; returns the usage updates it makes."""
        if kind == SLICE:
            return self._slice(typ, obj)
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
        ident = ObjectId.of(obj)
        name, ns, uid = ident.name, ident.namespace, ident.uid
        if not (name and ns and uid):
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
        return self._charge(kind, ns, uid, obj)

    def _charge(self, kind: str, ns: str, uid: str, obj: dict[str, Any]) -> Updates:
        charge = charge_of_claim(kind, obj, self.policy(), self.labels(ns), self.lookup)
        if charge is None:
            return [(uid, None)] if self.charges.pop(uid, None) is not None else []
        self.charges[uid] = charge
        return [(uid, charge)]

    def products(self) -> dict[str, dict[str, float] | None]:
        """What the slices say of each product's shareable devices (for telling whether
        a slice event changes what a pod's claim template costs)."""
        if self._index is None:
            self._index = DeviceIndex(self.slices.values())
        return dict(self._index.products)

    def _slice(self, typ: str, obj: dict[str, Any]) -> Updates:
        if typ == "SYNCED":
            self.synced[SLICE] = True
            return self.recharge()
        if typ == "RESET":
            self.slices = {}
            self._index = None
            return []
        if typ == "PROGRESS":
            return []
        name = ObjectId.of(obj).name
        if not name:
            return []
        before = self.slices.get(name)
        parsed = slices.parse(obj) if typ != "DELETED" else None
        if parsed is None:
            self.slices.pop(name, None)
        else:
            self.slices[name] = parsed
        if parsed == before:
            return []
        self._index = None
        # Until the slices are listed, the claims are charged again once, at SYNCED.
        return self.recharge() if self.synced.get(SLICE, True) else []

    def recharge(self) -> Updates:
        """Charge every claim again (what the slices say has changed)."""
        out: Updates = []
        for key, obj in self.objects.items():
            kind, ns, _ = key
            if kind != CLAIM:
                continue
            uid = self._uids.get(key)
            if uid is None:
                continue
            before = self.charges.get(uid)
            updates = self._charge(kind, ns, uid, obj)
            if self.charges.get(uid) != before:
                out.extend(updates)
        return out


class DeviceIndex:
    """The devices of the slices, by (driver, pool, device); counter sets by (driver,
    pool, set); and per product label value the smallest capacities of its devices, when
    all of them are shareable."""

    def __init__(self, held: Iterable[slices.Slice]) -> None:
        self.devices: dict[tuple[str, str, str], slices.SliceDevice] = {}
        self.sets: dict[tuple[str, str, str], dict[str, float]] = {}
        for s in held:
            for d in s.devices:
                self.devices[(d.driver, d.pool, d.name)] = d
            for c in s.counter_sets:
                self.sets[(c.driver, c.pool, c.name)] = dict(c.counters)
        self.products: dict[str, dict[str, float] | None] = {}
        for d in self.devices.values():
            if d.product is None:
                continue
            value = d.product.replace(" ", "-")
            if value in self.products and self.products[value] is None:
                continue
            if not d.shareable:
                self.products[value] = None
                continue
            have = self.products.get(value)
            mine = dict(d.capacity)
            if have is not None:
                mine = {k: min(v, have[k]) for k, v in mine.items() if k in have}
            self.products[value] = mine

    def lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        if kind == capacity.PRODUCT_CAPACITY:
            cap = self.products.get(name)
            return {"capacity": cap} if cap is not None else None
        pool, _, device = name.rpartition("/")
        d = self.devices.get((namespace, pool, device))
        if d is None:
            return None
        share: float | None = None
        if d.consumes:
            sets = {n: self.sets.get((d.driver, d.pool, n), {}) for n, _ in d.consumes}
            share = capacity.counter_share(
                d.consumes, {n: c for n, c in sets.items() if c})
        return {"product": d.product, "capacity": dict(d.capacity), "share": share}
