"""Parts of GPUs asked through DRA, charged by what they consume.

Two ways of taking part of a device, both of ``resource.k8s.io/v1``:

- **consumable capacity** (beta, on by default since Kubernetes 1.36): a device that
  ``allowMultipleAllocations`` is allocated to several claims, each taking the amounts its
  request's ``capacity.requests`` names (``memory: 20Gi``; rounded up by the device's
  ``requestPolicy`` into the result's ``consumedCapacity``). A claim holds that share of
  the device: the largest of its amounts over the device's capacity (20Gi of an H200's
  143771Mi is 0.142 of the GPU). A capacity it does not name is taken whole (Kubernetes
  charges a device's full capacity by default), but a request naming only memory on a
  device that has only memory takes only that.
- **partitionable devices** (beta, on by default since 1.36): a device ``consumesCounters``
  from a counter set of its pool (``sharedCounters``, what the whole GPU has); it holds
  the largest share it takes of any resource there (a MIG 1g slice that takes 1 of the
  8 memory slices, 16 of 132 multiprocessors and 16Gi of 140Gi holds 1/8).

Before allocation (admission, and the cache until the scheduler writes the claim's
status) the device is not known: a capacity request is charged on the smallest shareable
device of the products its selectors confine it to, as the ResourceSlices publish them
(:data:`PRODUCT_CAPACITY`); when a product has a device that is not shareable, or none is
known, the request may get a whole device and is charged one. After allocation the
device is known (:data:`DEVICE`) and the claim is charged what it took of it.

What the slices say reaches this pure module through the claim lookup the pipeline is
given (the cluster cache holds the slices, ``webhook.quota.claims``), under two
pseudo-kinds, so that admission and the cache charge the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

# (PRODUCT_CAPACITY, "", <product label value>) -> {"capacity": {name: amount}}: the
# smallest capacities of that product's shareable devices; None when a device of it is
# not shareable or none is known.
PRODUCT_CAPACITY = "DeviceCapacity"
# (DEVICE, <driver>, "<pool>/<device>") -> {"product": str | None, "share": float | None,
# "capacity": {name: amount}}: one device of a ResourceSlice; "share" is what the device
# takes of its counter sets (None: it consumes no counters).
DEVICE = "Device"

Lookup = Callable[[str, str, str], Mapping[str, Any] | None]
Amounts = Iterable[tuple[str, float]]


def share_of(asked: Amounts, capacity: Mapping[str, float]) -> float:
    """The share of a device that these amounts take: the largest amount over the
    device's capacity of that name, at most 1; a name the device lacks takes it whole."""
    share = 0.0
    for name, amount in asked:
        total = capacity.get(name)
        if total is None or total <= 0:
            return 1.0
        share = max(share, amount / total)
    return min(share, 1.0)


def counter_share(consumes: Iterable[tuple[str, Amounts]],
                  sets: Mapping[str, Mapping[str, float]]) -> float:
    """What a partitionable device takes of its counter sets: the largest share of any
    resource, at most 1; a set or counter not published takes the device whole. Counters
    numbered alike are slots of one resource (NVIDIA's driver publishes a GPU's eight
    memory slices as ``memory-slice-0`` .. ``memory-slice-7``, one each): their share is
    the slots taken over the slots there are, 1 of 8, not the 1 of 1 of one slot."""
    share = 0.0
    for set_name, counters in consumes:
        totals = sets.get(set_name)
        if totals is None:
            return 1.0
        taken: dict[str, float] = {}
        for name, amount in counters:
            if name not in totals or totals[name] <= 0:
                return 1.0
            family = _family(name)
            taken[family] = taken.get(family, 0.0) + amount
        for family, amount in taken.items():
            there = sum(v for k, v in totals.items() if _family(k) == family)
            share = max(share, amount / there)
    return min(share, 1.0)


def _family(counter: str) -> str:
    """``memory-slice-3`` -> ``memory-slice-``; a counter without a number is its own."""
    stem = counter.rstrip("0123456789")
    return stem if stem != counter and stem.endswith("-") else counter


def requested_share(lookup: Lookup, asked: Amounts, products: Iterable[str] | None) -> float:
    """The share of a device a capacity request is charged before it is allocated: on the
    smallest shareable device of each product it may get (the largest share), a whole
    device when the products are not known or one of them has no shareable device."""
    asked = tuple(asked)
    if not asked:
        return 1.0
    if not products:
        return 1.0
    share = 0.0
    for value in products:
        found = lookup(PRODUCT_CAPACITY, "", value)
        capacity = found.get("capacity") if found is not None else None
        if not isinstance(capacity, Mapping):
            return 1.0
        share = max(share, share_of(asked, capacity))
    return share


def allocated_share(lookup: Lookup, driver: str, pool: str, device: str,
                    consumed: Amounts) -> tuple[float | None, str | None]:
    """(share, productName) of one allocated device: what its ``consumedCapacity`` takes
    of the device, else what it takes of its counter sets (a partition of a GPU); share
    None when neither says (the device is held whole, at its class's weight). An unknown
    device is of no known product."""
    found = lookup(DEVICE, driver, f"{pool}/{device}")
    if found is None:
        return None, None
    product = found.get("product")
    name = product if isinstance(product, str) else None
    consumed = tuple(consumed)
    capacity = found.get("capacity")
    if consumed and isinstance(capacity, Mapping):
        return share_of(consumed, capacity), name
    share = found.get("share")
    if isinstance(share, float):
        return share, name
    return None, name
