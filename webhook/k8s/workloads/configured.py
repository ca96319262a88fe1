"""The kinds the policy configures, read from the JSON Pointers it gives, and the one
entry point that reads any kind."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.k8s.objects import MalformedObject, child_map, escape
from webhook.k8s.workloads.kinds import READERS
from webhook.k8s.workloads.shapes import PodTemplate, Role, Workload, _count, _get

# --- kinds the policy configures ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RolePaths:
    """One kind of role of a configured kind, as pointer token paths; ``*`` in
    ``template`` is every item of a list or map, and the other paths share its prefix
    up to the last ``*`` (the same item)."""

    template: tuple[str, ...]
    replicas: tuple[str, ...] | None = None
    name: tuple[str, ...] | None = None
    default_replicas: int = 1


@dataclass(frozen=True, slots=True)
class KindPaths:
    """A kind the policy configures: where its templates, counts and gang are."""

    kind: str
    roles: tuple[RolePaths, ...]
    gang_minimum: tuple[str, ...] | None = None
    gang_all: bool = False
    noun: str = ""
    role_word: str = "role"

    def read(self, obj: dict[str, Any]) -> Workload | None:
        roles: list[Role] = []
        for rp in self.roles:
            for tokens, ptr, holder in _expand(obj, rp.template):
                spec = child_map(holder, "spec", ptr)
                if spec is None:
                    continue
                t = PodTemplate(self.kind, False, holder, ptr, spec)
                name = "/".join(tokens) if tokens else None
                if rp.name is not None:
                    value, _ = _get(obj, _bind(rp.name, tokens))
                    if isinstance(value, str) and value:
                        name = value
                pods = rp.default_replicas
                if rp.replicas is not None:
                    value, vptr = _get(obj, _bind(rp.replicas, tokens))
                    pods = _count(value, vptr, rp.default_replicas)
                roles.append(Role(name, t, pods))
        if not roles:
            return None
        total = sum(r.pods for r in roles)
        gang = total if self.gang_all else None
        if self.gang_minimum is not None:
            value, vptr = _get(obj, self.gang_minimum)
            if value is not None:
                gang = min(_count(value, vptr, total), total)
        return Workload(self.kind, self.noun or self.kind.lower(), self.role_word, roles, gang)


def _bind(path: tuple[str, ...], tokens: tuple[str, ...]) -> tuple[str, ...]:
    """``path`` with its ``*`` replaced, in order, by the item keys of one role."""
    out, it = [], iter(tokens)
    for p in path:
        out.append(next(it, p) if p == "*" else p)
    return tuple(out)


def _expand(obj: Any, path: tuple[str, ...], ptr: str = "", tokens: tuple[str, ...] = ()
            ) -> Iterator[tuple[tuple[str, ...], str, dict[str, Any]]]:
    """(item keys, pointer, mapping) for every match of ``path`` in ``obj``."""
    if not path:
        if obj is None:
            return
        if not isinstance(obj, dict):
            raise MalformedObject(ptr, "a mapping")
        yield tokens, ptr, obj
        return
    if obj is None:
        return
    head, rest = path[0], path[1:]
    if head == "*":
        if isinstance(obj, list):
            for i, item in enumerate(obj):
                yield from _expand(item, rest, f"{ptr}/{i}", (*tokens, str(i)))
        elif isinstance(obj, dict):
            for k, item in obj.items():
                yield from _expand(item, rest, f"{ptr}/{escape(str(k))}", (*tokens, str(k)))
        else:
            raise MalformedObject(ptr, "a list or a mapping")
        return
    if not isinstance(obj, dict):
        raise MalformedObject(ptr, "a mapping")
    yield from _expand(obj.get(head), rest, f"{ptr}/{escape(head)}", tokens)


def read_workload(group: str, kind: str, obj: dict[str, Any],
                  configured: Mapping[tuple[str, str], KindPaths] | None = None
                  ) -> Workload | None:
    """The roles of ``obj``, or None when its kind is unknown or it holds no template.
    Raises MalformedObject when a level on the way has the wrong JSON type."""
    reader = READERS.get((group, kind))
    if reader is not None:
        return reader(obj)
    paths = configured.get((group, kind)) if configured else None
    return paths.read(obj) if paths is not None else None
