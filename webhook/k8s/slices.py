"""ResourceSlices (``resource.k8s.io/v1``) as the webhook reads them: what each device of
a DRA driver's pool holds, so that a claim taking part of a device is charged as that
part.

A slice lists ``devices`` of one ``driver`` and ``pool``; a device has ``attributes``
(an unqualified name is in the driver's domain: ``productName`` is
``gpu.nvidia.com/productName``), ``capacity`` (``memory: {value: 143771Mi}``), and may
``allowMultipleAllocations`` (consumable capacity: several claims each take some of its
capacity). A partitionable device (a MIG slice published through DRA) instead
``consumesCounters`` from a ``sharedCounters`` counter set of its pool: the set is what
the whole GPU has, each partition takes its counters' values. From Kubernetes 1.35 the
counter sets and the devices are in different slices of the same pool, so devices and
sets are keyed by pool, not by slice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.k8s import quantity

SLICE = "ResourceSlice"


@dataclass(frozen=True, slots=True)
class SliceDevice:
    driver: str
    pool: str
    name: str
    product: str | None  # the productName attribute (the driver's domain), as published
    capacity: tuple[tuple[str, float], ...]  # capacity values, base units
    shareable: bool  # allowMultipleAllocations
    consumes: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]  # (counter set, counters)


@dataclass(frozen=True, slots=True)
class CounterSet:
    driver: str
    pool: str
    name: str
    counters: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class Slice:
    devices: tuple[SliceDevice, ...]
    counter_sets: tuple[CounterSet, ...]


def _amounts(raw: object, inner: str | None) -> tuple[tuple[str, float], ...]:
    """{name: {value: quantity}} (``inner`` "value") as sorted (name, amount); entries
    that are not quantities are left out (the API server validated the slice)."""
    out: list[tuple[str, float]] = []
    for key, value in sorted(raw.items()) if isinstance(raw, dict) else ():
        v = value.get(inner) if inner is not None and isinstance(value, dict) else value
        try:
            out.append((str(key), float(quantity.parse(v))))
        except quantity.QuantityError:
            continue
    return tuple(out)


def _product(driver: str, attributes: object) -> str | None:
    if not isinstance(attributes, dict):
        return None
    for key in ("productName", f"{driver}/productName"):
        attr = attributes.get(key)
        if isinstance(attr, dict) and isinstance(attr.get("string"), str):
            return str(attr["string"])
    return None


def parse(obj: Mapping[str, Any]) -> Slice | None:
    """The devices and counter sets of a ResourceSlice; None when it names no driver and
    pool."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return None
    driver = spec.get("driver")
    pool = spec.get("pool")
    pool_name = pool.get("name") if isinstance(pool, dict) else None
    if not (isinstance(driver, str) and isinstance(pool_name, str)):
        return None
    devices: list[SliceDevice] = []
    for d in spec.get("devices") or ():
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            continue
        consumes = tuple(
            (str(c["counterSet"]), _amounts(c.get("counters"), "value"))
            for c in d.get("consumesCounters") or ()
            if isinstance(c, dict) and isinstance(c.get("counterSet"), str))
        devices.append(SliceDevice(driver, pool_name, str(d["name"]),
                                   _product(driver, d.get("attributes")),
                                   _amounts(d.get("capacity"), "value"),
                                   d.get("allowMultipleAllocations") is True, consumes))
    sets = tuple(
        CounterSet(driver, pool_name, str(c["name"]), _amounts(c.get("counters"), "value"))
        for c in spec.get("sharedCounters") or ()
        if isinstance(c, dict) and isinstance(c.get("name"), str))
    return Slice(tuple(devices), sets)
