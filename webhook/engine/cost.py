"""The value types of quota, below every rule that computes them: what one pod of a
template costs (:class:`Cost`), what admitting an object would add to its tenant's
usage (:class:`Ask`), and what a GPU pod or claim holds once counted (:class:`Charge`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Cost:
    """What one pod of a template costs."""

    product: str | None  # the product it is pinned to, when exactly one
    resources: Mapping[str, float]  # effective request, devices per GPU resource
    gpus: float  # GPU-equivalents (weights applied)
    spot: float = 0.0  # GPU-equivalents held on spot nodes (before the tenant's spot weight)
    shared: float = 0.0  # GPU-equivalents held as shares of devices (quota.sharedGpus)

    def charge(self, tenant: str, namespace: str, owner: str, *, pods: int = 1,
               user: str | None = None) -> Charge:
        """What a pod (or a claim: ``pods=0``) of this cost holds, charged to ``tenant``
        (and to ``user`` within it, where the tenant caps its users)."""
        return Charge(tenant, namespace, owner, self.product, dict(self.resources),
                      self.gpus, pods=pods, spot=self.spot, user=user, shared=self.shared)


@dataclass(frozen=True, slots=True)
class Charge:
    """What one GPU pod counts against its tenant's quota, and who holds it."""

    tenant: str
    namespace: str
    owner: str  # "job/llm-pretrain", "deployment/web", "pod/notebook-x"
    product: str | None
    resources: Mapping[str, float]
    gpus: float
    pods: int = 1  # GPU pods it counts as (a shared ResourceClaim: 0)
    spot: float = 0.0  # GPU-equivalents on spot nodes, for the tenant's spot cap
    user: str | None = None  # the user it is charged to (tenants[].userQuota)
    shared: float = 0.0  # GPU-equivalents held as shares of devices (quota.sharedGpus)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """What admitting one object would add to its tenant's usage (for quota)."""

    tenant: str
    namespace: str
    cost: Cost  # per pod
    pods: int  # pods of this template at once (replicas / parallelism; 1 for a Pod)
    is_pod: bool
    pods_added: int  # pods this request adds (an UPDATE that scales 2 -> 5 adds 3)
    kind: str
    counts_pods: bool = True  # False for a ResourceClaim: not a pod, not under a pods cap
    user: str | None = None  # whose pods they are (tenants[].userQuota); None: no one's

    @property
    def product(self) -> str | None:
        return self.cost.product

    @property
    def resources(self) -> Mapping[str, float]:
        return self.cost.resources

    @property
    def gpus(self) -> float:
        return self.cost.gpus
