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
from webhook.policy.model import Rule

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
                lim = gpu_count(lim_raw) if lim_raw is not None else None
            except QuantityError as exc:
                check.report(Rule.GPU_QUANTITY, messages.bad_quantity(res, "limit", str(exc)),
                             where)
                continue
            try:
                req = gpu_count(req_raw) if req_raw is not None else None
            except QuantityError as exc:
                check.report(Rule.GPU_QUANTITY, messages.bad_quantity(res, "request", str(exc)),
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
        out.append((c.kind, counts))
    return out


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


def check_maximums(check: Checker, policy: CompiledPolicy, containers: list[ContainerGPUs],
                   counts: Counts, claimed: float = 0.0) -> dict[str, float]:
    """Per-container and per-pod caps (GPU-equivalents; ``claimed``: the pod's own DRA
    devices, which count towards the per-pod cap). Returns the pod's effective request
    per resource."""
    tenant = check.tenant
    if tenant is not None and tenant.max_per_container is not None:
        for c, (_, amounts) in zip(containers, counts, strict=True):
            asked = weighted(policy, amounts)
            if asked > tenant.max_per_container:
                check.report(Rule.MAX_PER_CONTAINER,
                             messages.per_container_max(asked, tenant.name,
                                                        tenant.max_per_container,
                                                        _named(policy, amounts, asked)),
                             c.describe())
    effective = effective_request(counts)
    if tenant is not None and tenant.max_per_pod is not None:
        asked = weighted(policy, effective) + claimed
        if asked > tenant.max_per_pod:
            # DRA devices are already GPU-equivalents: the named devices are the pod's
            # own extended resources, and the claims are added as GPUs.
            named = None if claimed else _named(policy, effective, asked)
            check.report(Rule.MAX_PER_POD,
                         messages.per_pod_max(asked, tenant.name, tenant.max_per_pod, named))
    return effective


def _named(policy: CompiledPolicy, counts: dict[str, float], gpus: float) -> str:
    return messages.devices([(r, n, policy.weight(r)) for r, n in counts.items()], gpus)
