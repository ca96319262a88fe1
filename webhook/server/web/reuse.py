"""Reusing the mutating webhook's decision for pods of one shape.

The pods of a ReplicaSet, a Job or a JobSet reach the mutating webhook as the same
review over and over: the API server names a ``generateName`` pod and gives it a uid
only after mutating admission, so two of its pods differ in the request's uid alone.
The mutating decision (patch, message, warnings, findings) is a pure function of the
request, the policy and the namespace's labels, so the decision made for the first pod
is the decision for the next: here it is kept, keyed by

- the request without its uid (and the object's ``metadata.uid`` and
  ``creationTimestamp``, which a create does not carry and an update does not decide
  on, and the ``time`` of each ``managedFields`` entry, which the API server sets to the
  second of the write), serialised as it came;
- the labels of the pod's namespace (tenants are chosen by them);
- the policy's generation: the cache is emptied when a new policy is served.

So a change of policy or of a namespace's labels is never answered from the cache.
Pods that name DRA resource claims are never reused (their decision reads the claims
watch), nor objects other than Pods (workloads are created once, not in series), nor
objects over :data:`MAX_OBJECT_BYTES`. Memory is bounded: at most ``size`` decisions,
least recently used first out.

A reused decision is the same object each time and is never edited (``Decision`` is
only read after it is made); each review is still counted and logged as itself by the
caller (its own uid, name and user).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

from webhook.engine.decision import Decision
from webhook.k8s.review import AdmissionRequest

DEFAULT_SIZE = 1024
MAX_OBJECT_BYTES = 64 * 1024  # a pod past this is rare; its key would cost more than it saves


class DecisionCache:
    """An LRU of mutating decisions by request shape, for one policy generation."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._decisions: OrderedDict[bytes, Decision] = OrderedDict()
        self._generation: int | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._decisions)

    def key(self, req: AdmissionRequest, labels: Mapping[str, str] | None, generation: int
            ) -> bytes | None:
        """The cache key of a mutating review, or None when it must be decided afresh.
        Call it before deciding: the engine edits the request's object in place."""
        if generation != self._generation:
            self._decisions.clear()  # decisions of another policy are never reused
            self._generation = generation
        obj = req.object
        if req.kind != "Pod" or req.sub_resource or not isinstance(obj, dict):
            return None
        spec = obj.get("spec")
        if isinstance(spec, dict) and spec.get("resourceClaims"):
            return None  # decided with the claims watch's contents, which change
        if isinstance(spec, dict) and spec.get("nodeName"):
            return None  # decided with the node watch's contents, which change
        meta = obj.get("metadata")
        if isinstance(meta, dict) and ("uid" in meta or "creationTimestamp" in meta
                                       or "managedFields" in meta):
            obj = {**obj, "metadata": _shape_of(meta)}
        try:
            key = orjson.dumps(
                [req.group, req.version, req.kind, req.operation, req.namespace, req.name,
                 req.resource_group, req.resource, req.username, req.groups, req.dry_run,
                 req.api_version, sorted(labels.items()) if labels is not None else None,
                 obj, req.old_object], default=_refuse)
        except TypeError:
            return None  # something orjson does not write as-is: no shape to share
        return key if len(key) <= MAX_OBJECT_BYTES else None

    def get(self, key: bytes) -> Decision | None:
        d = self._decisions.get(key)
        if d is None:
            self.misses += 1
            return None
        self._decisions.move_to_end(key)
        self.hits += 1
        return d

    def put(self, key: bytes, decision: Decision) -> None:
        self._decisions[key] = decision
        self._decisions.move_to_end(key)
        while len(self._decisions) > self.size:
            self._decisions.popitem(last=False)


def _shape_of(meta: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in meta.items() if k not in ("uid", "creationTimestamp")}
    fields = out.get("managedFields")
    if isinstance(fields, list):
        # The API server stamps each manager's entry with the second it wrote it: two
        # pods of one ReplicaSet a second apart differ there and nowhere else. The
        # managers themselves stay in the key.
        out["managedFields"] = [{k: v for k, v in m.items() if k != "time"}
                                if isinstance(m, dict) else m for m in fields]
    return out


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)
