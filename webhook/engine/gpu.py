"""GPU request rules shared by both webhooks: valid counts, requests equal to limits,
allowed resource names, per-container and per-pod maximums.

In the mutating phase (a ``Patch`` is given) the missing half of a request/limit pair is
completed; core validation would otherwise reject a request without a limit before any
validating webhook runs.
"""

from __future__ import annotations

from webhook.engine import messages
from webhook.engine.decision import Checker
from webhook.k8s.patch import Patch
from webhook.k8s.quantity import QuantityError, gpu_count
from webhook.k8s.resources import ContainerGPUs, ContainerKind, effective_request
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import HAMi, Rule

Counts = list[tuple[ContainerKind, dict[str, float]]]


def check_requests(check: Checker, containers: list[ContainerGPUs], patch: Patch | None
                   ) -> Counts:
    """Check each GPU request/limit; complete missing halves when ``patch`` is given.
    Returns each container's GPU device counts, for the pod-level rules."""
    tenant = check.tenant
    out: Counts = []
    for c in containers:
        counts: dict[str, float] = {}
        for res in c.names:
            req_raw = c.requests.get(res) if c.requests else None
            lim_raw = c.limits.get(res) if c.limits else None
            where = c.describe()
            # The limit first: it is what people write for an extended resource, and the
            # API server copies a limit into a missing request before admission, so a bad
            # limit arrives as a bad request too and must be named as what was written.
            try:
                field = "limit"
                lim = gpu_count(lim_raw) if lim_raw is not None else None
                field = "request"
                req = gpu_count(req_raw) if req_raw is not None else None
            except QuantityError as exc:
                check.report(Rule.GPU_QUANTITY, messages.bad_quantity(res, field, str(exc)),
                             where)
                continue
            if req is not None and lim is not None and req != lim:
                check.report(Rule.REQUESTS_MATCH_LIMITS, messages.request_differs(res, req, lim),
                             where)
            if (tenant is not None and tenant.allowed_resources is not None
                    and res not in tenant.allowed_resources):
                check.report(Rule.ALLOWED_RESOURCES,
                             messages.resource_not_allowed(res, tenant.name,
                                                           tenant.allowed_resources), where)
            if patch is not None:
                _complete(c, res, req_raw, lim_raw, patch)
            counts[res] = float(lim if lim is not None else req or 0)
        hami = check.policy.hami
        if hami is not None and counts.get(hami.resource) and (
                hami.tenants is None
                or (check.tenant is not None and check.tenant.name in hami.tenants)):
            # HAMi's vGPUs are shares of devices: count them as the share they take.
            counts[hami.resource] *= hami_share(check, c, hami)
        out.append((c.kind, counts))
    return out


def hami_share(check: Checker, c: ContainerGPUs, hami: HAMi) -> float:
    """The share of one device each of the container's HAMi vGPUs takes: the larger of
    its memory share (``memory`` MiB over ``deviceMemory``, or ``memoryPercentage``) and
    its cores share (percent), at most 1. A vGPU that names no memory gets the whole
    device's memory from HAMi (its chart's ``defaultMemory: 0``), and one naming MiB
    without the device's memory known may be given a device that small: both are
    charged a whole device."""
    asked: dict[str, int] = {}
    for res in (hami.memory, hami.memory_percentage, hami.cores):
        raw = c.limits.get(res) if c.limits else None
        if raw is None and c.requests:
            raw = c.requests.get(res)
        if raw is None:
            continue
        try:
            asked[res] = gpu_count(raw)
        except QuantityError as exc:
            check.report(Rule.GPU_QUANTITY, messages.bad_share(res, str(exc)), c.describe())
            return 1.0
    if hami.memory in asked:
        memory = (asked[hami.memory] / hami.device_memory if hami.device_memory is not None
                  else 1.0)
    elif hami.memory_percentage in asked:
        memory = asked[hami.memory_percentage] / 100
    else:
        memory = 1.0
    cores = asked.get(hami.cores, 0) / 100
    return min(1.0, max(memory, cores))


def _complete(c: ContainerGPUs, res: str, req_raw: object, lim_raw: object, patch: Patch) -> None:
    """Write the missing half of the pair, copying the value exactly as the user wrote it."""
    if (req_raw is None) == (lim_raw is None):
        return
    if lim_raw is None:
        c.limits = patch.put(c.container, c.pointer, ("resources", "limits", res), req_raw)
    else:
        c.requests = patch.put(c.container, c.pointer, ("resources", "requests", res), lim_raw)


def weighted(policy: CompiledPolicy, counts: dict[str, float]) -> float:
    return sum(n * policy.weight(r) for r, n in counts.items())


def shared_part(policy: CompiledPolicy, counts: dict[str, float],
                tenant: str | None = None) -> float:
    """The GPU-equivalents of ``counts`` held as shares of devices (``quota.sharedGpus``):
    time-sliced units and HAMi vGPUs (of ``tenant``, where HAMi shares its GPUs)."""
    h = policy.hami
    hami = h.resource if h is not None and (
        h.tenants is None or (tenant is not None and tenant in h.tenants)) else None
    return sum(n * policy.weight(r) for r, n in counts.items()
               if r in policy.time_sliced or r == hami)


def check_maximums(check: Checker, policy: CompiledPolicy, containers: list[ContainerGPUs],
                   counts: Counts, claimed: float = 0.0) -> dict[str, float]:
    """Per-container and per-pod caps (GPU-equivalents; ``claimed``: the pod's own DRA
    devices, which count towards the per-pod cap). Returns the pod's effective request
    per resource."""
    tenant = check.tenant
    effective = effective_request(counts)
    if tenant is None:
        return effective
    asks = [weighted(policy, amounts) for _, amounts in counts]
    pod_ask = weighted(policy, effective) + claimed
    cap_c, cap_p = tenant.max_per_container, tenant.max_per_pod
    # One container holding the pod's whole ask, over both caps, is one fault: say it
    # once, with the tighter cap (the looser one's "ask for N or fewer" would name a
    # number still refused), unless the looser rule is the more severe.
    skip: Rule | None = None
    holders = [a for a in asks if a > 0]
    if (cap_c is not None and cap_p is not None and not claimed and len(holders) == 1
            and holders[0] == pod_ask and pod_ask > max(cap_c, cap_p)):
        tighter, looser = ((Rule.MAX_PER_POD, Rule.MAX_PER_CONTAINER) if cap_p < cap_c
                           else (Rule.MAX_PER_CONTAINER, Rule.MAX_PER_POD))
        if check.adds_nothing(looser, beside=tighter):
            skip = looser
    if cap_c is not None and skip is not Rule.MAX_PER_CONTAINER:
        for c, (_, amounts), asked in zip(containers, counts, asks, strict=True):
            if asked > cap_c:
                check.report(Rule.MAX_PER_CONTAINER,
                             messages.per_container_max(asked, tenant.name, cap_c,
                                                        _named(policy, amounts, asked),
                                                        _within(policy, amounts, cap_c)),
                             c.describe())
    if cap_p is not None and pod_ask > cap_p and skip is not Rule.MAX_PER_POD:
        # DRA devices are already GPU-equivalents: the named devices are the pod's
        # own extended resources, and the claims are added as GPUs.
        named = None if claimed else _named(policy, effective, pod_ask)
        fewer = None if claimed else _within(policy, effective, cap_p)
        check.report(Rule.MAX_PER_POD,
                     messages.per_pod_max(pod_ask, tenant.name, cap_p, named, fewer))
    return effective


def _named(policy: CompiledPolicy, counts: dict[str, float], gpus: float) -> str:
    return messages.devices([(r, n, policy.weight(r)) for r, n in counts.items()], gpus)


def _within(policy: CompiledPolicy, counts: dict[str, float], cap: float) -> str:
    return messages.within([(r, n, policy.weight(r)) for r, n in counts.items()], cap)
