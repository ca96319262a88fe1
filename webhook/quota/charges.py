"""The charges of the pods the watch shows, kept by shape.

Every replica charges each pod event it sees (``ClusterState``, on the event loop
between the reviews it answers), and most events repeat a charge already made: a pod's
status changes (scheduled, started, ready) each send the whole pod again, and the pods
of a ReplicaSet or a Job arrive with one shape. A pod's charge
(:func:`webhook.engine.charge.charge_and_unknown`) is a pure function of

- the pod without what the API server writes for its own bookkeeping (``uid``,
  ``resourceVersion``, ``generation``, ``creationTimestamp``, ``managedFields``, the
  deletion stamps), without its status but the phase, and without its name, which only
  the charge's owner reads (``pod/NAME`` for a pod no controller owns: set again for
  each pod);
- the policy, its namespace's labels, and the product of the node it is bound to;

so the charge made for the first pod of a shape is the charge of the next, kept here
under that shape (a key of a few microseconds against ~45 us of charging in process,
several times that on a busy replica). Never kept: pods that name resource claims (their
charge reads the claims watch, which changes) and pods over :data:`MAX_POD_BYTES`. Kept
for one policy (emptied when another is served), at most ``size`` shapes, least
recently used first out. A kept :class:`~webhook.engine.cost.Charge` is frozen and
shared by the pods of its shape, which only read it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import orjson

from webhook.engine.charge import charge_and_unknown, owner_of
from webhook.engine.cost import Charge
from webhook.engine.devices import ClaimLookup
from webhook.k8s.identity import ObjectId
from webhook.policy.compiled import CompiledPolicy

DEFAULT_SIZE = 4096
MAX_POD_BYTES = 64 * 1024  # a pod past this is rare; its key would cost more than it saves

# What the API server writes for itself on every change, which no charge reads, and
# the name, which only the charge's owner reads.
_UNSHAPED = frozenset({"uid", "resourceVersion", "generation", "creationTimestamp",
                       "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds",
                       "name"})

Charged = tuple[Charge | None, tuple[str, ...]]


class ChargeMemo:
    """:func:`charge_and_unknown` for watched pods, answered from the pods of the same
    shape seen before (see the module docstring)."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._charged: OrderedDict[bytes, Charged] = OrderedDict()
        self._policy: CompiledPolicy | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._charged)

    def charge(self, pod: dict[str, Any], ident: ObjectId, policy: CompiledPolicy,
               labels: Mapping[str, str] | None, claims: ClaimLookup,
               node_product: Callable[[str], str | None]) -> Charged:
        if policy is not self._policy:
            self._charged.clear()  # charges under another policy are never reused
            self._policy = policy
        key = _key(pod, ident, labels, node_product)
        if key is None:
            return charge_and_unknown(pod, policy, labels, claims, node_product, ident)
        kept = self._charged.get(key)
        if kept is not None:
            self._charged.move_to_end(key)
            self.hits += 1
            charge, unknown = kept
            if charge is not None and ident.controller is None:
                owner = owner_of(ident)  # "pod/NAME": this pod's own
                if charge.owner != owner:
                    charge = replace(charge, owner=owner)
            return charge, unknown
        self.misses += 1
        made = charge_and_unknown(pod, policy, labels, claims, node_product, ident)
        self._charged[key] = made
        if len(self._charged) > self.size:
            self._charged.popitem(last=False)
        return made


def _key(pod: dict[str, Any], ident: ObjectId, labels: Mapping[str, str] | None,
         node_product: Callable[[str], str | None]) -> bytes | None:
    """The pod's shape, or None when its charge must be made afresh."""
    spec, meta = pod.get("spec"), pod.get("metadata")
    if not isinstance(spec, dict) or not isinstance(meta, dict):
        return None
    if spec.get("resourceClaims"):
        return None  # charged with the claims watch's contents, which change
    status = pod.get("status")
    node = spec.get("nodeName")
    try:
        key = orjson.dumps(
            [ident.namespace, sorted(labels.items()) if labels is not None else None,
             node_product(node) if isinstance(node, str) and node else None,
             {k: v for k, v in meta.items() if k not in _UNSHAPED}, spec,
             status.get("phase") if isinstance(status, dict) else status],
            default=_refuse)
    except TypeError:
        return None  # something orjson does not write as-is: no shape to share
    return key if len(key) <= MAX_POD_BYTES else None


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)
