"""Who an object is: its metadata read once, with every field's type checked.

An object reaches the webhook as JSON from the API server, from another webhook's
patch, from a watch or from a file someone wrote, so any metadata field may be missing
or of the wrong type. :meth:`ObjectId.of` reads the fields the webhook decides by
(namespace, name or ``generateName``, uid, labels, annotations, owner references, the
creation time) into one frozen record, taking a field of the wrong type as absent; the
engine, the quota line, the caches and the offline tools ask it instead of walking
``metadata`` each on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

_EMPTY: Mapping[str, str] = MappingProxyType({})
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Owner:
    """One ``ownerReferences`` entry."""

    api_version: str  # "batch/v1", "kubeflow.org/v1", "v1"
    kind: str
    name: str
    uid: str
    controller: bool

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def of(self, kind: str, api_version: str) -> bool:
        """Whether this owner is of ``kind`` in ``api_version`` (a Volcano Job is a
        ``Job`` too, of another group)."""
        return self.kind == kind and self.api_version == api_version


@dataclass(frozen=True, slots=True, eq=False)
class ObjectId:
    """An object's identity as its metadata gives it (see the module's docstring)."""

    namespace: str = ""
    name: str = ""  # "" until the API server names a generateName object
    generate_name: str = ""
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    owners: tuple[Owner, ...] = ()
    created: str = ""  # creationTimestamp, RFC 3339 in UTC: sorts as text
    resource_version: str = ""

    @classmethod
    def of(cls, obj: object, namespace: str = "") -> ObjectId:
        """The identity of ``obj`` (anything: a non-mapping has none); ``namespace``
        where the object names none (a review's namespace: a pod created in a namespace
        may leave its own metadata.namespace empty)."""
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping):
            return cls(namespace=namespace)
        return cls(
            namespace=_str(meta, "namespace") or namespace,
            name=_str(meta, "name"),
            generate_name=_str(meta, "generateName"),
            uid=_str(meta, "uid"),
            labels=_strings(meta.get("labels")),
            annotations=_strings(meta.get("annotations")),
            owners=_owners(meta.get("ownerReferences")),
            created=_str(meta, "creationTimestamp"),
            resource_version=_str(meta, "resourceVersion"),
        )

    @property
    def key(self) -> str:
        """``namespace/name``, as the quota ledger and the line name a pod."""
        return f"{self.namespace}/{self.name}"

    def shown(self, request_name: str = "") -> str:
        """How the object is named to people: the request's name, else its own, else
        its ``generateName`` and ``*`` (the API server names it after mutating
        admission), else ""."""
        if request_name:
            return request_name
        if self.name:
            return self.name
        return self.generate_name + "*" if self.generate_name else ""

    @property
    def controller(self) -> Owner | None:
        """The owner that controls the object (at most one has ``controller: true``)."""
        return next((o for o in self.owners if o.controller), None)

    def controlled_by(self, kind: str, api_version: str) -> Owner | None:
        """The controlling owner when it is of ``kind`` in ``api_version``."""
        c = self.controller
        return c if c is not None and c.of(kind, api_version) else None


def _str(meta: Mapping[str, Any], key: str) -> str:
    value = meta.get(key)
    return value if isinstance(value, str) else ""


def _strings(value: object) -> Mapping[str, str]:
    """Labels or annotations: entries whose value is not a string are left out (the API
    server refuses them; a file or a patch may still hold one)."""
    if not isinstance(value, Mapping) or not value:
        return _EMPTY
    return MappingProxyType({str(k): v for k, v in value.items() if isinstance(v, str)})


def _owners(value: object) -> tuple[Owner, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(
        Owner(_str(r, "apiVersion"), _str(r, "kind"), _str(r, "name"), _str(r, "uid"),
              r.get("controller") is True)
        for r in value if isinstance(r, Mapping))


def track(table: dict[str, V], typ: str, obj: object,
          value: Callable[[dict[str, Any]], V | None]) -> str:
    """Keep ``table``, by object name, as a watch event (ADDED, MODIFIED, DELETED) says:
    a deleted object leaves it, another is stored as ``value(obj)`` (None: left as it
    was). Returns the object's name, "" for a nameless one (nothing is done)."""
    name = ObjectId.of(obj).name
    if not name or not isinstance(obj, dict):
        return ""
    if typ == "DELETED":
        table.pop(name, None)
        return name
    got = value(obj)
    if got is not None:
        table[name] = got
    return name
