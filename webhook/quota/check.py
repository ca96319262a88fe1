"""The quota arithmetic: does an ask fit a tenant's (and its namespace's) caps?

Pure functions over a usage view; the same code answers offline (``review``, tests),
against the local watch cache, and inside the ledger's compare-and-swap loop.

For a Pod, every cap it would exceed is a violation of rule ``quota``. For a workload
(Deployment, Job, ...), the whole gang is compared with the caps: if replicas x GPUs per
pod exceeds a cap the workload can never run in full and is denied; if it only exceeds
what is free right now, the developer gets a warning at ``kubectl apply`` time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

from webhook.engine import messages
from webhook.engine.cost import Ask
from webhook.engine.decision import Checker
from webhook.engine.gang import GangAsk
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode, Rule
from webhook.policy.tenantrules import Limits, TenantRules
from webhook.quota.cohort import ceiling
from webhook.quota.usage import Totals

EPSILON = 1e-9


class UsageView(Protocol):
    def tenant(self, name: str) -> Totals: ...
    def namespace(self, name: str) -> Totals: ...
    def user(self, tenant: str, name: str) -> Totals: ...
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
    user: str | None = None  # a user's cap (tenants[].userQuota): whose
    window: str = ""  # the quota window that gives the cap now ("" for none)

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
    window = tenant.window.name if tenant.window is not None else ""
    for scope, limits, totals, holders in scopes:
        if limits is None:
            continue
        at = window if holders[0] == "tenant" else ""
        if limits.gpus is not None:
            out.append(Line(scope, "GPUs", limits.gpus, totals.gpus, ask.gpus, holders,
                            window=at))
        for r, n in ask.resources.items():
            cap = limits.resources.get(r)
            if cap is not None:
                out.append(Line(scope, r, cap, totals.resources.get(r, 0.0), n, holders,
                                window=at))
        if ask.product is not None and ask.product in limits.products:
            product_holders = (("product", tenant.name, ask.product)
                               if holders[0] == "tenant" else holders)
            out.append(Line(scope, f"{ask.product} GPUs", limits.products[ask.product],
                            totals.products.get(ask.product, 0.0), ask.gpus,
                            product_holders, ask.product, window=at))
        if limits.spot is not None and ask.cost.spot:
            out.append(Line(scope, messages.SPOT_GPUS, limits.spot, totals.spot,
                            ask.cost.spot, ("spot", tenant.name)))
        if limits.shared is not None and ask.cost.shared:
            shared_holders = ("shared", tenant.name) if holders[0] == "tenant" else holders
            out.append(Line(scope, messages.SHARED_GPUS, limits.shared, totals.shared,
                            ask.cost.shared, shared_holders, window=at))
        if limits.pods is not None and ask.counts_pods:
            out.append(Line(scope, messages.PODS, limits.pods, totals.pods, 1.0, holders,
                            window=at))
    return out + _user_lines(tenant, ask, usage, window)


def _user_lines(tenant: TenantRules, ask: Ask, usage: UsageView, window: str) -> list[Line]:
    """The caps of the ask's user in the tenant (``tenants[].userQuota``), if any. Counted
    in the same totals as the tenant's: the ledger entry that reserves a pod names its
    user, so one compare-and-swap commits both counts."""
    users = tenant.user_quota
    if users is None or ask.user is None:
        return []
    held = usage.user(tenant.name, ask.user)
    whose = ("user", tenant.name, ask.user)
    at = window if tenant.window is not None and tenant.window.user_quota else ""
    out: list[Line] = []
    if users.gpus is not None:
        out.append(Line(f"user {ask.user}", "GPUs", users.gpus, held.gpus, ask.gpus,
                        whose, user=ask.user, window=at))
    if users.pods is not None and ask.counts_pods:
        out.append(Line(f"user {ask.user}", messages.PODS, users.pods, held.pods, 1.0,
                        whose, user=ask.user, window=at))
    return out


def _what(line: Line) -> str:
    """What a cap counts, as the message says it: with the window that sets it now."""
    return messages.in_window(line.what, line.window)


def _alternatives(policy: CompiledPolicy, tenant: TenantRules, usage: UsageView,
                  ask: Ask) -> list[str]:
    """Other allowed products this pod would be admitted on, for the 'what would fit'
    hint: every cap is checked with the product swapped (the tenant's and the
    namespace's alike), so a product is offered only if no cap would still refuse it."""
    if ask.product is None or tenant.quota is None:
        return []
    out = []
    totals = usage.tenant(tenant.name)
    label, annotation = policy.product_request_label, policy.product_request_annotation
    for p, cap in tenant.quota.products.items():
        if p == ask.product or (tenant.allowed_products and p not in tenant.allowed_products):
            continue
        other = replace(ask, cost=replace(ask.cost, product=p))
        if all(_fits(line) for line in lines(tenant, other, usage)):
            free = cap - totals.products.get(p, 0.0)
            out.append(messages.alternative(p, free, label, annotation, policy.product_label,
                                            policy.product_value.get(p, p)))
    return out


def _fits(line: Line) -> bool:
    return line.used + line.per_pod <= line.cap + EPSILON


def _room(line: Line) -> float:
    """How much of this pod the cap has room for (1: all of it): comparable across caps
    counted in different units, so the smallest is the binding one."""
    return line.free() / line.per_pod if line.per_pod else float("inf")


def _asked_as(check: Checker, line: Line, ask: Ask) -> str | None:
    """A GPU-equivalents line names the devices asked for first (three MIG slices, not
    "1.5"); a per-resource or pod-count line is already in the developer's own units."""
    if line.what != "GPUs" and line.product is None:
        return None
    if len(ask.resources) == 1 and all(check.policy.weight(r) == 1 for r in ask.resources):
        return None  # "asks 3": whole GPUs are already what the developer wrote
    return messages.devices([(r, n, check.policy.weight(r)) for r, n in ask.resources.items()],
                            ask.gpus)


def check_pod(check: Checker, tenant: TenantRules, ask: Ask, usage: UsageView) -> bool:
    """Report the cap a pod would exceed; True when it fits.

    A pod over several caps (its tenant's and its namespace's, GPUs and a product's) is
    told once, with the binding cap: the one with room for the least of it. Each cap's
    own "N are free now" would name a number another cap still refuses."""
    broken = [line for line in lines(tenant, ask, usage) if not _fits(line)]
    if not broken:
        return True
    # On a tie the more specific cap (a product's, spot, pods; the namespace's) is named:
    # it speaks in the units the pod was asked in, and its fix is the one to act on.
    line = min(reversed(broken), key=_room)
    top = usage.top_owners(line.holders)
    if line.user is not None:
        check.report(Rule.QUOTA, messages.user_quota_exceeded(
            line.user, tenant.name, _what(line), line.used, line.per_pod, line.cap, top,
            "this pod asks" if ask.counts_pods else f"this {ask.kind} asks",
            len(broken) - 1))
        return False
    check.report(Rule.QUOTA, messages.quota_exceeded(
        line.scope, _what(line), line.used, line.per_pod, line.cap, top,
        "this pod asks" if ask.counts_pods else f"this {ask.kind} asks",
        _alternatives(check.policy, tenant, usage, ask),
        _asked_as(check, line, ask), len(broken) - 1, _unit(check, line, ask)))
    return False


def _unit(check: Checker, line: Line, ask: Ask) -> tuple[str, float] | None:
    """The one resource a pod asks and its GPU-equivalents each, where the line counts
    GPU-equivalents: what to ask for is then said in whole devices."""
    if (line.what != "GPUs" and line.product is None) or len(ask.resources) != 1:
        return None
    (resource,) = ask.resources
    return resource, check.policy.weight(resource)


def users_cap_alone(tenant: TenantRules, ask: Ask, usage: UsageView) -> bool:
    """Whether only caps of the ask's user (``tenants[].userQuota``) refuse it: the
    tenant's and the namespace's would hold it. A waiting line passes over such a pod
    (its user's own pods must end first), where any other refusal stops the line."""
    broken = [line for line in lines(tenant, ask, usage) if not _fits(line)]
    return bool(broken) and all(line.user is not None for line in broken)


def check_workload(check: Checker, tenant: TenantRules, ask: Ask, usage: UsageView) -> None:
    """A workload's gang against the caps: deny if it can never fit, warn if not now.

    Each broken cap would answer "run at most N pods" with its own N; only the smallest
    is true of the workload, so one finding is made, from the binding cap (and likewise
    for how many of its pods can start now)."""
    never: list[Line] = []
    not_now: list[Line] = []
    borrows: Line | None = None
    extra_of: dict[int, float] = {}
    for line in lines(tenant, ask, usage):
        # A cohort tenant's pods beyond its own GPUs may run on borrowed ones.
        extra = (ceiling(check.policy, tenant)
                 if line.holders[0] == "tenant" and line.what == "GPUs" else 0.0)
        if ask.pods * line.per_pod > line.cap + extra + EPSILON:
            never.append(line)
            extra_of[id(line)] = extra
        elif extra and ask.pods * line.per_pod > line.cap + EPSILON:
            borrows = line
        elif ask.pods_added and line.used + ask.pods_added * line.per_pod > line.cap + EPSILON:
            not_now.append(line)
    if never:
        line = min(never, key=lambda x: messages.most_pods(x.cap + extra_of[id(x)],
                                                           x.per_pod))
        extra = extra_of[id(line)]
        if extra and tenant.cohort is not None:
            check.report(Rule.QUOTA, messages.gang_never_fits_borrowing(
                line.scope, ask.pods, line.per_pod, line.cap, extra, tenant.cohort.name,
                len(never) - 1))
        else:
            check.report(Rule.QUOTA, messages.gang_never_fits(
                line.scope, _what(line), ask.pods, line.per_pod, line.cap, len(never) - 1))
        return
    if borrows is not None and tenant.cohort is not None:
        check.report(Rule.QUOTA, messages.gang_borrows(
            borrows.scope, ask.pods, borrows.per_pod, borrows.cap, tenant.cohort.name),
            at_most=Mode.WARN)
    elif not_now:
        line = min(not_now, key=lambda x: messages.most_pods(x.free(), x.per_pod))
        check.report(Rule.QUOTA, messages.gang_not_free(
            line.scope, _what(line), ask.pods_added, line.per_pod, line.free(), line.cap,
            ask.kind, len(not_now) - 1), at_most=Mode.WARN)



@dataclass(slots=True)
class _GangLine:
    """One cap compared with a whole workload: each role's pods x per-pod amount."""

    line: Line
    parts: list[tuple[int, float]]  # (role index in the ask, per pod)


def _gang_lines(tenant: TenantRules, gang: GangAsk, usage: UsageView) -> list[_GangLine]:
    out: dict[tuple[str, str], _GangLine] = {}
    for i, r in enumerate(gang.roles):
        if not r.cost.resources:
            continue  # a role without GPUs (a parameter server) holds no GPU quota
        ask = Ask(tenant=gang.tenant, namespace=gang.namespace, cost=r.cost, pods=r.pods,
                  is_pod=False, pods_added=r.pods_added, kind=gang.kind, user=gang.user)
        for line in lines(tenant, ask, usage):
            key = (line.scope, line.what)
            if key not in out:
                out[key] = _GangLine(line, [])
            out[key].parts.append((i, line.per_pod))
    return list(out.values())


# A finding of one cap: (the share of what is asked the cap has room for, its message
# given how many other caps the same finding broke).
_Found = tuple[float, Callable[[int], str]]


def check_gang(check: Checker, tenant: TenantRules, gang: GangAsk, usage: UsageView,
               reservable: bool = False) -> bool:
    """A workload with roles against the caps: denied if its gang (every pod, when it
    has none) can never fit, warned if not all its pods can ever run at once or if it
    does not fit what is free now. True when the gang fits now (it may be reserved).

    Each finding is made once, from the binding cap (the one with room for the smallest
    share of what is asked), as for a Deployment: two caps broken at once would each
    say "at most N" with their own N, and only the smallest is true of the workload."""
    members = gang.members()
    fits_now = True
    never: list[_Found] = []
    whole_over: list[_Found] = []
    not_free: list[_Found] = []
    per_role: dict[str, list[_Found]] = {}
    for g in _gang_lines(tenant, gang, usage):
        line, cap = g.line, g.line.cap
        roles = [(gang.roles[i], per) for i, per in g.parts]
        if gang.sequential:
            for r, per in roles:
                if per > cap + EPSILON:
                    per_role.setdefault(r.name, []).append((cap / per, partial(
                        messages.role_pod_never_fits, line.scope, _what(line),
                        gang.role_label(r), per, cap)))
            continue
        whole = sum(r.pods * per for r, per in roles)
        need = sum(members[i] * per for i, per in g.parts)
        added = sum(r.pods_added * per for r, per in roles)
        all_of = messages.parts((gang.role_label(r), r.pods, per) for r, per in roles)
        if line.used + need > line.cap + EPSILON:
            fits_now = False
        if need > cap + EPSILON:
            gang_parts = messages.parts((gang.role_label(r), members[i], per)
                                        for (r, per), (i, _) in zip(roles, g.parts,
                                                                    strict=True)
                                        if members[i])
            never.append((cap / need, partial(
                messages.roles_never_fit, line.scope, _what(line), gang_parts, need,
                sum(members), cap, gang.gang is not None)))
        elif whole > cap + EPSILON:
            whole_over.append((cap / whole, partial(
                messages.roles_exceed_quota, line.scope, _what(line), all_of, whole,
                gang.pods, cap, sum(members), need)))
        elif added and line.used + added > cap + EPSILON:
            added_of = messages.parts((gang.role_label(r), r.pods_added, per)
                                      for r, per in roles if r.pods_added)
            not_free.append((max(cap - line.used, 0.0) / added, partial(
                messages.roles_not_free, line.scope, _what(line), added_of, added,
                line.used, cap, sum(members) if gang.gang is not None else None, need,
                reservable, gang.kind, waits=tenant.waits)))
    for found in per_role.values():
        check.report(Rule.QUOTA, _binding(found))
    if never:
        check.report(Rule.QUOTA, _binding(never))
        return fits_now
    if whole_over:
        check.report(Rule.QUOTA, _binding(whole_over), at_most=Mode.WARN)
    if not_free:
        check.report(Rule.QUOTA, _binding(not_free), at_most=Mode.WARN)
    return fits_now


def _binding(found: list[_Found]) -> str:
    """The message of the binding cap (the least room), told how many caps it beat."""
    _, say = min(found, key=lambda f: f[0])
    return say(len(found) - 1)


def check_group(check: Checker, tenant: TenantRules, ask: Ask, group: str, size: int,
                usage: UsageView, composite: bool = False) -> bool:
    """The first pod of a PodGroup (the core gang API) for its whole gang: ``size`` pods
    like it (the group's ``minCount``, times the ``minGroupCount`` of the
    CompositePodGroups above it, less the members charged already) against every cap;
    True when they all fit now. ``group``: the gang as messages name it. Refused, from
    the binding cap, when they can never fit or do not fit what is free now: the pod is
    refused rather than admitted alone, as a part of the gang would hold GPUs the rest
    of it waits for."""
    never: list[Line] = []
    not_now: list[Line] = []
    for line in lines(tenant, ask, usage):
        need = size * line.per_pod
        if need > line.cap + EPSILON:
            never.append(line)
        elif line.used + need > line.cap + EPSILON:
            not_now.append(line)
    if never:
        line = min(never, key=lambda x: messages.most_pods(x.cap, x.per_pod))
        check.report(Rule.QUOTA, messages.group_never_fits(
            group, line.scope, _what(line), size, line.per_pod, line.cap, len(never) - 1,
            composite))
        return False
    if not_now:
        line = min(not_now, key=lambda x: messages.most_pods(x.free(), x.per_pod))
        check.report(Rule.QUOTA, messages.group_not_free(
            group, line.scope, _what(line), size, line.per_pod, line.used, line.cap,
            len(not_now) - 1, composite))
        return False
    return True
