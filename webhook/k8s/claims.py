"""Dynamic Resource Allocation (``resource.k8s.io/v1``) as the webhook reads it: the
device requests of a ResourceClaim or ResourceClaimTemplate, and the claims a pod names.

A pod asks for devices through ``spec.resourceClaims[]``: each entry names either a
ResourceClaim (``resourceClaimName``, shared by every pod that names it) or a
ResourceClaimTemplate (``resourceClaimTemplateName``: the resourceclaim controller makes
one claim per pod from it, annotated ``resource.kubernetes.io/pod-claim-name`` and owned
by the pod). A claim's ``spec.devices.requests[]`` each ask ``exactly`` one kind of
device (``deviceClassName``, ``count`` (default 1), ``allocationMode`` ``ExactCount`` or
``All``, CEL ``selectors``, ``adminAccess``) or the first available of several
alternatives (``firstAvailable[]``, the same fields per alternative). The webhook is
registered for v1 with ``matchPolicy: Equivalent``, so the API server converts older
versions (v1beta1 had the request fields flat) to this shape before sending them.

A request (or subrequest) may also ask for part of a device (DRA consumable capacity,
beta and on by default since Kubernetes 1.36): ``capacity.requests`` names amounts of the
device's capacities (``memory: 20Gi``) on devices that allow multiple allocations. Once
allocated, ``status.allocation.devices.results[]`` says which device each request got
(``driver``, ``pool``, ``device``; ``request`` is ``<request>/<subrequest>`` for a
``firstAvailable`` choice) and, for a shared device, ``consumedCapacity``: what it took
(the request rounded up by the device's ``requestPolicy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.k8s import quantity
from webhook.k8s.objects import MalformedObject, child_list, child_map

GROUP = "resource.k8s.io"
CLAIM = "ResourceClaim"
TEMPLATE = "ResourceClaimTemplate"

# Set on a claim made from a template for one pod (by the resourceclaim controller).
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
# Set on the claim the scheduler makes for a pod whose plain extended-resource request
# (nvidia.com/gpu) a DeviceClass serves (KEP-5004). Only the scheduler may set it: a claim
# that fakes it would escape ResourceQuota (kubernetes/kubernetes#135404).
EXTENDED_RESOURCE_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
SCHEDULER_USER = "system:kube-scheduler"

# The most devices one request can be allocated (resource.k8s.io's
# AllocationResultsMaxSize): what ResourceQuota charges an ``allocationMode: All``.
ALL_DEVICES = 32


def made_for_a_pod(annotations: Mapping[str, Any], by_scheduler: bool,
                   by_claim_controller: bool, for_group: bool = False) -> bool:
    """Whether a claim was made for one pod, which is charged for its devices instead:
    the claim the scheduler makes for a plain extended-resource request (its annotation,
    written by the scheduler), or the claim the resourceclaim controller makes from a
    template (its annotation, written by the controller). Admission knows the writer
    from the request's user, the cluster cache from the object's field managers.
    ``for_group``: the claim is controlled by a PodGroup (the controller makes one claim
    for the whole group from a template, with the same annotation): shared by the
    group's pods, it is charged once, itself, as a named claim is."""
    if EXTENDED_RESOURCE_ANNOTATION in annotations:
        return by_scheduler
    return POD_CLAIM_ANNOTATION in annotations and by_claim_controller and not for_group


@dataclass(frozen=True, slots=True)
class Alternative:
    """One way to satisfy a request: ``exactly``, or one of ``firstAvailable``."""

    device_class: str
    count: int  # devices asked (ALL_DEVICES for allocationMode All)
    all_devices: bool
    selectors: tuple[str, ...]  # CEL expressions
    admin_access: bool
    pointer: str  # JSON Pointer of this alternative (for its selectors patch)
    # capacity.requests: (capacity name, amount) asked of each device, in base units
    capacity: tuple[tuple[str, float], ...] = ()
    name: str = ""  # the subrequest's name, for firstAvailable ("" for exactly)


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    name: str
    alternatives: tuple[Alternative, ...]  # one for ``exactly``; several for firstAvailable
    pointer: str


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One entry of a pod's ``spec.resourceClaims``."""

    name: str
    claim: str | None  # resourceClaimName: an existing, possibly shared, claim
    template: str | None  # resourceClaimTemplateName: one claim per pod


def claim_spec(kind: str, obj: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The ResourceClaimSpec of a claim (``/spec``) or a template (``/spec/spec``), with its
    pointer; None when absent. Raises MalformedObject."""
    spec = child_map(obj, "spec", "")
    if spec is None:
        return None
    if kind == TEMPLATE:
        inner = child_map(spec, "spec", "/spec")
        return (inner, "/spec/spec") if inner is not None else None
    return spec, "/spec"


def device_requests(spec: dict[str, Any], ptr: str) -> list[DeviceRequest]:
    """The device requests of a ResourceClaimSpec. Raises MalformedObject."""
    devices = child_map(spec, "devices", ptr)
    if devices is None:
        return []
    dptr = ptr + "/devices"
    out: list[DeviceRequest] = []
    for i, r in enumerate(child_list(devices, "requests", dptr) or []):
        rptr = f"{dptr}/requests/{i}"
        if not isinstance(r, dict):
            raise MalformedObject(rptr, "a device request mapping")
        name = r.get("name")
        name = name if isinstance(name, str) else str(i)
        exactly = child_map(r, "exactly", rptr)
        alternatives: list[Alternative] = []
        if exactly is not None:
            alternatives.append(_alternative(exactly, rptr + "/exactly"))
        for j, sub in enumerate(child_list(r, "firstAvailable", rptr) or []):
            sptr = f"{rptr}/firstAvailable/{j}"
            if not isinstance(sub, dict):
                raise MalformedObject(sptr, "a device subrequest mapping")
            alternatives.append(_alternative(sub, sptr))
        out.append(DeviceRequest(name, tuple(alternatives), rptr))
    return out


def _alternative(r: dict[str, Any], ptr: str) -> Alternative:
    cls = r.get("deviceClassName")
    if not isinstance(cls, str) or not cls:
        raise MalformedObject(ptr + "/deviceClassName", "a DeviceClass name")
    mode = r.get("allocationMode", "ExactCount")
    if mode not in ("ExactCount", "All"):
        raise MalformedObject(ptr + "/allocationMode", 'either "ExactCount" or "All"')
    count = r.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise MalformedObject(ptr + "/count", "a positive integer")
    selectors: list[str] = []
    for k, s in enumerate(child_list(r, "selectors", ptr) or []):
        cel = child_map(s, "cel", f"{ptr}/selectors/{k}") if isinstance(s, dict) else None
        expression = cel.get("expression") if cel is not None else None
        if isinstance(expression, str):
            selectors.append(expression)
    admin = r.get("adminAccess")
    every = mode == "All"
    name = r.get("name")
    return Alternative(cls, ALL_DEVICES if every else count, every, tuple(selectors),
                       admin is True, ptr, capacity_requests(r, ptr),
                       name if isinstance(name, str) else "")


def capacity_requests(r: dict[str, Any], ptr: str) -> tuple[tuple[str, float], ...]:
    """A (sub)request's ``capacity.requests``, as (name, amount) in sorted order.
    Raises MalformedObject."""
    cap = child_map(r, "capacity", ptr)
    if cap is None:
        return ()
    asked = child_map(cap, "requests", ptr + "/capacity") or {}
    out: list[tuple[str, float]] = []
    for key in sorted(asked):
        try:
            amount = float(quantity.parse(asked[key]))
        except quantity.QuantityError as exc:
            raise MalformedObject(f"{ptr}/capacity/requests/{key}", "a quantity") from exc
        if amount < 0:
            raise MalformedObject(f"{ptr}/capacity/requests/{key}", "a quantity of 0 or more")
        out.append((str(key), amount))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Allocated:
    """One device a claim was allocated (``status.allocation.devices.results[]``)."""

    request: str  # the request's name, without a firstAvailable subrequest's
    subrequest: str  # the subrequest's name ("" for exactly)
    driver: str
    pool: str
    device: str
    consumed: tuple[tuple[str, float], ...]  # consumedCapacity, (name, amount)


def allocation(claim: Mapping[str, Any]) -> list[Allocated] | None:
    """The devices a claim was allocated, or None when it is not allocated (or its status
    is malformed: the claim is charged by its spec then)."""
    status = claim.get("status")
    alloc = status.get("allocation") if isinstance(status, dict) else None
    devs = alloc.get("devices") if isinstance(alloc, dict) else None
    results = devs.get("results") if isinstance(devs, dict) else None
    if not isinstance(results, list):
        return None
    out: list[Allocated] = []
    for r in results:
        if not isinstance(r, dict):
            return None
        names = [r.get(k) for k in ("request", "driver", "pool", "device")]
        if not all(isinstance(n, str) and n for n in names):
            return None
        request, driver, pool, device = (str(n) for n in names)
        consumed: list[tuple[str, float]] = []
        raw = r.get("consumedCapacity")
        for key, value in sorted(raw.items()) if isinstance(raw, dict) else ():
            try:
                consumed.append((str(key), float(quantity.parse(value))))
            except quantity.QuantityError:
                return None
        top, _, sub = request.partition("/")
        out.append(Allocated(top, sub, driver, pool, device, tuple(consumed)))
    return out


def pod_claims(spec: dict[str, Any], ptr: str) -> list[PodClaim]:
    """The entries of a pod spec's ``resourceClaims``. Raises MalformedObject."""
    out: list[PodClaim] = []
    for i, c in enumerate(child_list(spec, "resourceClaims", ptr) or []):
        cptr = f"{ptr}/resourceClaims/{i}"
        if not isinstance(c, dict):
            raise MalformedObject(cptr, "a pod resource claim mapping")
        claim, template = c.get("resourceClaimName"), c.get("resourceClaimTemplateName")
        out.append(PodClaim(str(c.get("name") or i),
                            claim if isinstance(claim, str) and claim else None,
                            template if isinstance(template, str) and template else None))
    return out
