"""What each tenant holds now: running GPU pods plus reservations not yet seen as pods.

``Usage`` keeps running totals per tenant and per namespace, updated in O(1) as pods
come and go, so a quota check never scans pods: its cost is the same with 1,000 or
100,000 pods in the cluster. Only a denial message, which names the biggest consumers,
looks at one tenant's owners.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from operator import neg

from webhook.engine.cost import Charge


@dataclass(slots=True)
class Totals:
    """Sums over a set of charges."""

    gpus: float = 0.0
    pods: int = 0
    resources: dict[str, float] = field(default_factory=dict)
    products: dict[str, float] = field(default_factory=dict)
    spot: float = 0.0  # GPU-equivalents on spot nodes
    shared: float = 0.0  # GPU-equivalents held as shares of devices (quota.sharedGpus)

    def add(self, c: Charge, sign: int = 1) -> None:
        self.gpus += sign * c.gpus
        self.pods += sign * c.pods
        self.spot += sign * c.spot
        self.shared += sign * c.shared
        for r, n in c.resources.items():
            self.resources[r] = self.resources.get(r, 0.0) + sign * n
        if c.product is not None:
            self.products[c.product] = self.products.get(c.product, 0.0) + sign * c.gpus

    def copy(self) -> Totals:
        return Totals(self.gpus, self.pods, dict(self.resources), dict(self.products),
                      self.spot, self.shared)


class Usage:
    """Running totals of charges keyed by pod (uid), per tenant and per namespace."""

    __slots__ = ("_by_key", "_namespace", "_owners", "_tenant", "_user")

    def __init__(self) -> None:
        self._by_key: dict[str, Charge] = {}
        self._tenant: dict[str, Totals] = {}
        self._namespace: dict[str, Totals] = {}
        self._user: dict[tuple[str, str], Totals] = {}  # (tenant, user): userQuota
        # Who holds what, per scope a message may name: ("tenant", t), ("product", t, p),
        # ("namespace", ns), ("spot", t) -> owner -> GPU-equivalents.
        self._owners: dict[tuple[str, ...], dict[str, float]] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def charge(self, key: str) -> Charge | None:
        return self._by_key.get(key)

    def put(self, key: str, charge: Charge | None) -> None:
        """Set (or with None, remove) the charge of one pod."""
        old = self._by_key.pop(key, None)
        if old is not None:
            self._apply(old, -1)
        if charge is not None:
            self._by_key[key] = charge
            self._apply(charge, 1)

    def _apply(self, c: Charge, sign: int) -> None:
        self._tenant.setdefault(c.tenant, Totals()).add(c, sign)
        self._namespace.setdefault(c.namespace, Totals()).add(c, sign)
        scopes: list[tuple[tuple[str, ...], float]] = [
            (("tenant", c.tenant), c.gpus), (("namespace", c.namespace), c.gpus)]
        if c.user is not None:
            self._user.setdefault((c.tenant, c.user), Totals()).add(c, sign)
            scopes.append((("user", c.tenant, c.user), c.gpus))
        if c.product is not None:
            scopes.append((("product", c.tenant, c.product), c.gpus))
        if c.spot:  # spot GPUs are held in full, whatever weight the other caps give them
            scopes.append((("spot", c.tenant), c.spot))
        if c.shared:
            scopes.append((("shared", c.tenant), c.shared))
        for scope, amount in scopes:
            owners = self._owners.setdefault(scope, {})
            left = owners.get(c.owner, 0.0) + sign * amount
            if left > 1e-9:
                owners[c.owner] = left
            else:
                owners.pop(c.owner, None)

    def tenant(self, name: str) -> Totals:
        return self._tenant.get(name) or Totals()

    def namespace(self, name: str) -> Totals:
        return self._namespace.get(name) or Totals()

    def user(self, tenant: str, name: str) -> Totals:
        """What one user's pods hold in a tenant (charges that name the user)."""
        return self._user.get((tenant, name)) or Totals()

    def users(self, tenant: str) -> dict[str, Totals]:
        """Every user holding something in a tenant: for ``status``."""
        return {u: t for (tn, u), t in self._user.items() if tn == tenant and (t.pods or t.gpus)}

    def top_owners(self, scope: tuple[str, ...], n: int = 3) -> list[tuple[str, float]]:
        """The biggest holders in a scope: ("tenant", t), ("product", t, p) or
        ("namespace", ns). Scans one scope's owners: used for denial messages only."""
        owners = self._owners.get(scope, {})
        # The order of sorted(key=(-gpus, owner))[:n] without a full sort or a Python
        # key call per owner: nsmallest over (-gpus, owner) pairs built in C, about a
        # quarter of the cost of sorting (bench/README.md: quota denial at 100,000 pods).
        best = heapq.nsmallest(n, zip(map(neg, owners.values()), owners.keys(), strict=True))
        return [(o, -g) for g, o in best]

    def owners_in(self, scope: tuple[str, ...]) -> bool:
        return bool(self._owners.get(scope))
