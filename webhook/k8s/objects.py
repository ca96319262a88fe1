"""Reading an object that arrived as JSON: the mapping or list a pod spec needs at a
JSON Pointer, or :class:`MalformedObject` naming the pointer and what it must be.

Admission reviews come from the API server, but a validating webhook sees objects
other webhooks changed, and the offline tools read files people wrote: every step that
walks an object goes through these helpers, so a wrong type always becomes the same
clear denial rather than a TypeError.
"""

from __future__ import annotations

from typing import Any


def escape(token: str) -> str:
    """Escape one reference token for a JSON Pointer."""
    if "~" in token:
        token = token.replace("~", "~0")
    if "/" in token:
        token = token.replace("/", "~1")
    return token


def unescape(token: str) -> str:
    """One JSON Pointer reference token decoded (``~1`` is ``/``, then ``~0`` is ``~``)."""
    return token.replace("~1", "/").replace("~0", "~")


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """The reference tokens of a JSON Pointer (``/spec/a~1b`` -> ("spec", "a/b"))."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError(f"{pointer!r} is not a JSON Pointer: it must start with '/'")
    return tuple(unescape(t) for t in pointer[1:].split("/"))


class MalformedObject(ValueError):
    """The object has the wrong JSON type where the pod spec needs a mapping or list."""

    def __init__(self, pointer: str, expected: str) -> None:
        self.pointer = pointer or "/"
        self.expected = expected
        super().__init__(f"{self.pointer} must be {expected}")


def child_map(parent: dict[str, Any], key: str, ptr: str) -> dict[str, Any] | None:
    """``parent[key]`` when it is a mapping, None when absent/null; raise if another type."""
    value = parent.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise MalformedObject(ptr + "/" + escape(key), "a mapping")


def child_list(parent: dict[str, Any], key: str, ptr: str) -> list[Any] | None:
    """``parent[key]`` when it is a list, None when absent/null; raise if another type."""
    value = parent.get(key)
    if value is None or isinstance(value, list):
        return value
    raise MalformedObject(ptr + "/" + escape(key), "a list")


def label_of(obj: object, key: str) -> str | None:
    """The value of label ``key`` on an object, None when it has none (or the object's
    metadata or labels are not mappings)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    value = labels.get(key) if isinstance(labels, dict) else None
    return value if isinstance(value, str) else None
