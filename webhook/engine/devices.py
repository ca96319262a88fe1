"""GPUs asked through Dynamic Resource Allocation: which device requests are GPUs, what
they weigh, which rules they break, and the product selector the mutating webhook ANDs
into them.

A request is a GPU request when its ``deviceClassName`` is one of the policy's GPU
device classes. It weighs ``count`` devices x the class's GPU-equivalents (a MIG class
by the profile its selectors name); ``allocationMode: All`` is charged at the most one
request can be allocated (32, as ResourceQuota charges it), and ``firstAvailable`` at its
largest alternative, since the scheduler may pick any of them. A request of part of a
device (``capacity.requests``, DRA consumable capacity) weighs its share of the device
(:mod:`webhook.engine.capacity`).

Products: a claim cannot be pinned by node affinity (the scheduler picks the device,
then the node), and its spec is immutable after CREATE, so the mutating webhook ANDs a
CEL selector on the device's product name into each GPU request of a claim or template
of a tenant confined to products: ``<productName>.replace(' ', '-') in [...]``, with the
product node-label values (NVML's names have spaces where GPU Feature Discovery's labels
have dashes).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.engine import capacity, messages
from webhook.engine.cost import Cost
from webhook.engine.decision import Checker
from webhook.k8s.claims import Allocated, Alternative, DeviceRequest
from webhook.k8s.objects import parse_pointer
from webhook.k8s.patch import Patch
from webhook.policy.compiled import IMPLICIT_PREFIX, CompiledPolicy
from webhook.policy.model import Rule
from webhook.policy.tenantrules import TenantRules

# (kind, namespace, name) -> the ResourceClaim or ResourceClaimTemplate, or None when the
# webhook has not seen it (a watch cache online; the manifests given offline).
ClaimLookup = Callable[[str, str, str], Mapping[str, Any] | None]


def no_claims(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    return None


def unseen_reason(claims: ClaimLookup, kind: str, namespace: str, name: str) -> str | None:
    """Why a lookup has no such claim, when it can say: "absent" (the API server has
    none of that name) or why reading it failed; None when it was not asked for (a watch
    cache alone, the manifests given offline). A lookup says so by an ``unseen`` method
    (``webhook.admission.claimreads.ReadThrough``)."""
    why = getattr(claims, "unseen", None)
    return why(kind, namespace, name) if callable(why) else None


_PROFILE = re.compile(r"""\.profile\s*==\s*['"]([0-9a-z.]+)['"]""")


@dataclass(frozen=True, slots=True)
class DeviceCost:
    """What a set of device requests holds: devices per GPU class (under the class's
    implicit resource name, so quota caps can name it), their GPU-equivalents, and the
    one product they are confined to, if one."""

    resources: dict[str, float]
    gpus: float
    product: str | None
    gpu_requests: int  # requests asking a GPU class

    def as_cost(self) -> Cost:
        """The same devices as what one holder of them costs (never on spot nodes)."""
        return Cost(self.product, self.resources, self.gpus)


def is_gpu_request(policy: CompiledPolicy, r: DeviceRequest) -> bool:
    return any(a.device_class in policy.device_classes for a in r.alternatives)


def weight(policy: CompiledPolicy, a: Alternative) -> float:
    """GPU-equivalents of one device of this alternative (0 for a non-GPU class)."""
    cls = policy.device_classes.get(a.device_class)
    if cls is None:
        return 0.0
    if cls.mig_profiles:
        for s in a.selectors:
            m = _PROFILE.search(s)
            if m is not None:
                w = policy.weights.get(f"nvidia.com/mig-{m.group(1)}")
                if w is not None:
                    return w
    return cls.gpus


def share(policy: CompiledPolicy, a: Alternative, claims: ClaimLookup) -> float:
    """The share of each device this alternative is charged before allocation: 1, or for
    a capacity request its share of the devices of the products it is confined to."""
    if not a.capacity:
        return 1.0
    values = pinned_values(policy, a)
    return capacity.requested_share(claims, a.capacity, sorted(values) if values else None)


def cost(check: Checker, policy: CompiledPolicy, requests: list[DeviceRequest],
         where: str | None = None, claims: ClaimLookup = no_claims) -> DeviceCost:
    """Check the GPU requests (classes the tenant may use, adminAccess) and return what
    they hold. ``claims`` also says what the ResourceSlices publish, for requests of
    part of a device."""
    tenant = check.tenant
    resources: dict[str, float] = {}
    gpus = 0.0
    products: set[str | None] = set()
    n = 0
    for r in requests:
        if not is_gpu_request(policy, r):
            continue
        n += 1
        best: tuple[float, Alternative, float] | None = None
        for a in r.alternatives:
            if a.device_class not in policy.device_classes:
                continue
            _check_alternative(check, tenant, a, where)
            part = share(policy, a, claims)
            total = a.count * weight(policy, a) * part
            if best is None or total > best[0]:
                best = (total, a, part)
        assert best is not None
        total, a, part = best
        key = IMPLICIT_PREFIX + a.device_class
        resources[key] = resources.get(key, 0.0) + a.count * part
        gpus += total
        products.add(pinned_product(policy, a))
    product = products.pop() if len(products) == 1 else None
    return DeviceCost(resources, gpus, product, n)


def allocated(policy: CompiledPolicy, requests: list[DeviceRequest],
              results: list[Allocated], claims: ClaimLookup) -> DeviceCost | None:
    """What an allocated claim holds: each device the scheduler gave a GPU request (the
    ``firstAvailable`` subrequest it chose), as much of it as the claim took
    (:func:`webhook.engine.capacity.allocated_share`), charged to the product of the
    device it got. None when no GPU request was allocated."""
    # Each result is one device: allocationMode All is charged what it got, not 32.
    by_name = {r.name: r for r in requests}
    resources: dict[str, float] = {}
    gpus = 0.0
    products: set[str | None] = set()
    asked: set[str] = set()
    for res in results:
        r = by_name.get(res.request)
        if r is None or not is_gpu_request(policy, r):
            continue
        a = next((a for a in r.alternatives if a.name == res.subrequest), None) \
            if res.subrequest else r.alternatives[0]
        if a is None or a.device_class not in policy.device_classes:
            continue
        part, product = capacity.allocated_share(claims, res.driver, res.pool, res.device,
                                                 res.consumed)
        key = IMPLICIT_PREFIX + a.device_class
        resources[key] = resources.get(key, 0.0) + (1.0 if part is None else part)
        # A measured share is of the whole GPU (its capacity, its counter set): of the
        # class's GPU-equivalents, not of a MIG profile's weight, which is a share already.
        gpus += weight(policy, a) if part is None else policy.device_classes[
            a.device_class].gpus * part
        asked.add(r.name)
        products.add(policy.product_name(product.replace(" ", "-")) if product is not None
                     else pinned_product(policy, a))
    if not resources:
        return None
    product = products.pop() if len(products) == 1 else None
    return DeviceCost(resources, gpus, product, len(asked))


def _check_alternative(check: Checker, tenant: TenantRules | None, a: Alternative,
                       where: str | None) -> None:
    if (tenant is not None and tenant.allowed_device_classes is not None
            and a.device_class not in tenant.allowed_device_classes):
        check.report(Rule.ALLOWED_DEVICE_CLASSES, messages.device_class_not_allowed(
            a.device_class, tenant.name, sorted(tenant.allowed_device_classes)), where)
    if a.admin_access:
        check.report(Rule.DEVICE_ADMIN_ACCESS, messages.admin_access(a.device_class), where)


def product_values(policy: CompiledPolicy, tenant: TenantRules | None) -> list[str] | None:
    """The product node-label values a tenant's DRA GPUs are confined to: its default
    product (as a pod is pinned to it), else its allowed products; None: unconfined."""
    if tenant is None:
        return None
    if tenant.default_product:
        return [policy.product_value[tenant.default_product]]
    if tenant.allowed_products:
        return [policy.product_value[p] for p in tenant.allowed_products]
    return None


def selector(policy: CompiledPolicy, device_class: str, values: list[str]) -> str:
    attribute = policy.device_classes[device_class].product_attribute
    listed = ", ".join(f"'{v}'" for v in values)
    return f"{attribute}.replace(' ', '-') in [{listed}]"


_PINNED = re.compile(r"""^(.+)\.replace\(' ', '-'\) in \[((?:'[^']*'(?:, )?)+)\]$""")


def pinned_values(policy: CompiledPolicy, a: Alternative) -> set[str] | None:
    """The product label values this alternative's selectors confine it to (the webhook's
    own selector form), or None when no selector confines it. Several such selectors are
    ANDed: their intersection."""
    cls = policy.device_classes.get(a.device_class)
    if cls is None:
        return None
    out: set[str] | None = None
    for s in a.selectors:
        m = _PINNED.match(s.strip())
        if m is None or m.group(1) != cls.product_attribute:
            continue
        values = set(re.findall(r"'([^']*)'", m.group(2)))
        out = values if out is None else out & values
    return out


def pinned_product(policy: CompiledPolicy, a: Alternative) -> str | None:
    values = pinned_values(policy, a)
    if values is None:
        return None
    names = {policy.product_name(v) for v in values}
    return names.pop() if len(names) == 1 and None not in names else None


def pin(policy: CompiledPolicy, tenant: TenantRules | None, requests: list[DeviceRequest],
        patch: Patch, obj: dict[str, Any]) -> bool:
    """AND the tenant's product selector into every GPU alternative not already confined
    within it. Idempotent: an alternative already carrying it is left alone. True when
    something was added."""
    values = product_values(policy, tenant)
    if values is None:
        return False
    changed = False
    for r in requests:
        for a in r.alternatives:
            if a.device_class not in policy.device_classes:
                continue
            have = pinned_values(policy, a)
            if have is not None and have <= set(values):
                continue
            node = _at(obj, a.pointer)
            patch.append(node, "selectors", a.pointer,
                         {"cel": {"expression": selector(policy, a.device_class, values)}})
            changed = True
    return changed


def _at(obj: dict[str, Any], pointer: str) -> dict[str, Any]:
    """The mapping at a JSON Pointer that :mod:`webhook.k8s.claims` produced (so every
    step exists and is the right type)."""
    node: Any = obj
    for token in parse_pointer(pointer):
        node = node[int(token)] if isinstance(node, list) else node[token]
    assert isinstance(node, dict)
    return node
