"""RFC 6902 JSON Patch operations, built while the engine edits an object in place.

The engine mutates the request's own (freshly parsed) object and records each change
as an operation, so the patch and the mutated object can never disagree and no deep
copy is needed on the hot path. Paths are JSON Pointers (RFC 6901): ``~`` is written
``~0`` and ``/`` is written ``~1``, which matters for keys such as ``nvidia.com/gpu``.
A missing parent is created by the ``add`` itself (the op adds the whole missing
branch), because the API server rejects an ``add`` whose parent does not exist.
"""

from __future__ import annotations

from typing import Any

import orjson

from webhook.k8s.objects import child_list, child_map, escape


class Patch:
    """An ordered list of JSON Patch operations applied to a live object as they are made."""

    __slots__ = ("ops",)

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []

    def __bool__(self) -> bool:
        return bool(self.ops)

    def put(self, parent: dict[str, Any], ptr: str, keys: tuple[str, ...], value: Any
            ) -> dict[str, Any]:
        """Set ``parent[k1]...[kn] = value``. Missing (or null) mappings on the way are
        created by the same single ``add`` that carries the value, so a pod without
        ``resources`` gets one op, not one per level. Returns the mapping that now holds
        the value."""
        node = parent
        for i, key in enumerate(keys[:-1]):
            nxt = child_map(node, key, ptr)
            if nxt is None:
                rest = value
                for k in reversed(keys[i + 1:]):
                    rest = {k: rest}
                self.set(node, key, ptr, rest)
                holder: dict[str, Any] = node[key]
                for k in keys[i + 1:-1]:
                    holder = holder[k]
                return holder
            node, ptr = nxt, ptr + "/" + escape(key)
        self.set(node, keys[-1], ptr, value)
        return node

    def set(self, parent: dict[str, Any], key: str, ptr: str, value: Any) -> None:
        """Add (or replace) ``parent[key]``."""
        parent[key] = value
        self.ops.append({"op": "add", "path": ptr + "/" + escape(key), "value": _copy(value)})

    def append(self, parent: dict[str, Any], key: str, ptr: str, value: Any) -> None:
        """Append ``value`` to the list ``parent[key]``, creating the list if needed."""
        lst = child_list(parent, key, ptr)
        if lst is None:
            parent[key] = [value]
            self.ops.append(
                {"op": "add", "path": ptr + "/" + escape(key), "value": [_copy(value)]})
        else:
            lst.append(value)
            self.ops.append(
                {"op": "add", "path": ptr + "/" + escape(key) + "/-", "value": _copy(value)})

    def remove_indices(self, parent: dict[str, Any], key: str, ptr: str, idx: list[int]) -> None:
        """Remove items of the list ``parent[key]``; highest index first so later indices
        stay valid while the patch is applied."""
        lst = parent[key]
        base = ptr + "/" + escape(key)
        for i in sorted(idx, reverse=True):
            del lst[i]
            self.ops.append({"op": "remove", "path": f"{base}/{i}"})


def _copy(value: Any) -> Any:
    """A snapshot of a JSON value: an op must not change when the live object is edited
    further (a term created by one op and extended by the next, say). A round trip
    through orjson is the cheapest deep copy of plain JSON data."""
    if isinstance(value, (dict, list)):
        return orjson.loads(orjson.dumps(value))
    return value
