"""The quota arithmetic: does an ask fit a tenant's (and its namespace's) caps?

Pure functions over a usage view; the same code answers offline (``review``, tests),
against the local watch cache, and inside the ledger's compare-and-swap loop.

For a Pod, every cap it would exceed is a violation of rule ``quota``. For a workload
(Deployment, Job, ...), the whole gang is compared with the caps: if replicas x GPUs per
pod exceeds a cap the workload can never run in full and is denied; if it only exceeds
what is free right now, the developer gets a warning at ``kubectl apply`` time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from webhook.engine import messages
from webhook.engine.charge import Ask
from webhook.engine.decision import Checker
from webhook.policy.compiled import Limits, TenantRules
from webhook.policy.model import Mode, Rule
from webhook.quota.usage import Totals

EPSILON = 1e-9


class UsageView(Protocol):
    def tenant(self, name: str) -> Totals: ...
    def namespace(self, name: str) -> Totals: ...
    def top_owners(self, scope: tuple[str, ...], n: int = 3) -> list[tuple[str, float]]: ...


@dataclass(frozen=True, slots=True)
class Line:
    """One cap compared with usage: ``scope`` holds ``used`` of ``cap`` ``what``."""

    scope: str
    what: str
    cap: float
    used: float
    per_pod: float
    holders: tuple[str, ...]  # the usage scope whose biggest holders the message names
    product: str | None = None

    def free(self) -> float:
        return max(self.cap - self.used, 0.0)


def lines(tenant: TenantRules, ask: Ask, usage: UsageView) -> list[Line]:
    """Every cap that applies to this ask, tenant-wide first, then the namespace's."""
    out: list[Line] = []
    scopes: list[tuple[str, Limits | None, Totals, tuple[str, ...]]] = [
        (f"tenant {tenant.name}", tenant.quota, usage.tenant(tenant.name),
         ("tenant", tenant.name)),
        (f"namespace {ask.namespace}", tenant.namespace_quota.get(ask.namespace),
         usage.namespace(ask.namespace), ("namespace", ask.namespace)),
    ]
    for scope, limits, totals, holders in scopes:
        if limits is None:
            continue
        if limits.gpus is not None:
            out.append(Line(scope, "GPUs", limits.gpus, totals.gpus, ask.gpus, holders))
        for r, n in ask.resources.items():
            cap = limits.resources.get(r)
            if cap is not None:
                out.append(Line(scope, r, cap, totals.resources.get(r, 0.0), n, holders))
        if ask.product is not None and ask.product in limits.products:
            product_holders = (("product", tenant.name, ask.product)
                               if holders[0] == "tenant" else holders)
            out.append(Line(scope, f"{ask.product} GPUs", limits.products[ask.product],
                            totals.products.get(ask.product, 0.0), ask.gpus,
                            product_holders, ask.product))
        if limits.pods is not None and ask.counts_pods:
            out.append(Line(scope, "GPU pods", limits.pods, totals.pods, 1.0, holders))
    return out


def _alternatives(tenant: TenantRules, line: Line, usage: UsageView, ask: Ask) -> list[str]:
    """Other allowed products with room for this ask, for the 'what would fit' hint."""
    if line.product is None or tenant.quota is None:
        return []
    out = []
    totals = usage.tenant(tenant.name)
    for p, cap in tenant.quota.products.items():
        if p == line.product or (tenant.allowed_products and p not in tenant.allowed_products):
            continue
        free = cap - totals.products.get(p, 0.0)
        if free + EPSILON >= ask.gpus:
            out.append(f"{p} has {messages.num(free)} free")
    return out


def check_pod(check: Checker, tenant: TenantRules, ask: Ask, usage: UsageView) -> bool:
    """Report every cap a pod would exceed; True when it fits."""
    fits = True
    for line in lines(tenant, ask, usage):
        if line.used + line.per_pod > line.cap + EPSILON:
            fits = False
            top = usage.top_owners(line.holders)
            check.report(Rule.QUOTA, messages.quota_exceeded(
                line.scope, line.what, line.used, line.per_pod, line.cap, top,
                "this pod asks" if ask.counts_pods else f"this {ask.kind} asks",
                _alternatives(tenant, line, usage, ask)))
    return fits


def check_workload(check: Checker, tenant: TenantRules, ask: Ask, usage: UsageView) -> None:
    """A workload's gang against the caps: deny if it can never fit, warn if not now."""
    for line in lines(tenant, ask, usage):
        whole = ask.pods * line.per_pod
        if whole > line.cap + EPSILON:
            check.report(Rule.QUOTA, messages.gang_never_fits(
                line.scope, line.what, ask.pods, line.per_pod, line.cap))
        elif ask.pods_added and line.used + ask.pods_added * line.per_pod > line.cap + EPSILON:
            check.report(Rule.QUOTA, messages.gang_not_free(
                line.scope, line.what, ask.pods_added, line.per_pod, line.free(), line.cap),
                at_most=Mode.WARN)

