"""The built-in kinds whose pods are a plain function of their templates, described as
data (:class:`Roles`: the list or map of roles, each role's template and count, the
gang), with the reader and the templates' places derived from that one description, as
a configured kind's are from its :class:`~webhook.k8s.workloads.configured.KindPaths`.
Adding such a kind is one entry of :data:`webhook.k8s.workloads.kinds.CRD_KINDS`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from webhook.k8s.objects import child_map, escape
from webhook.k8s.workloads.shapes import (
    Reader,
    Role,
    Workload,
    _count,
    _get,
    _items,
    _template_at,
    job_pods,
)


@dataclass(frozen=True, slots=True)
class Templates:
    """Where a kind's pod specs are, as token paths from the object to each template
    (the mapping that holds ``spec``), for what reads them outside this package (the API
    server's match conditions, :mod:`webhook.policy.apiserver.cel`). A ``*`` token is every item
    of a list (``shape`` list) or every value of a map (map). ``made_of`` says what is
    at a path when it is no pod template: a TrainJob's ``resources`` (one container's
    resources) or an Argo ``steps`` list (templates whose containers make up a spec)."""

    paths: tuple[tuple[str, ...], ...]
    shape: Literal["list", "map"] = "list"
    made_of: Literal["template", "resources", "steps"] = "template"


@dataclass(frozen=True, slots=True)
class Roles:
    """A kind whose roles are the items of one list or map (a Volcano task, a JobSet
    replicated job, a Kubeflow replica type): each item's pod template, its pod count,
    and the gang, which is every pod unless a minimum lowers it.

    An item is named by its ``name`` (else its index) in a list, by its key in a map.
    Its pods are ``replicas`` (``default_replicas`` when absent), times, for ``job``, the
    pods each of those batch Jobs runs at once (min(parallelism, completions) of the
    mapping that holds the template). ``count_first`` reads the count before the
    template, so a malformed count is refused even in an item without one.
    ``minimum`` is the item's own field of the pods it needs started (default: all of
    them). ``gang_minimum`` is a path, from the mapping that holds the items, to the
    pods of the whole that must start together, at most all; for ``zero_is_all`` a 0
    there means all."""

    noun: str  # how messages name the kind
    role_word: str  # how messages name a role
    items: tuple[str, ...]  # from the object to the list or map of roles
    template: tuple[str, ...] = ("template",)  # from an item to its pod template
    shape: Literal["list", "map"] = "list"
    replicas: str = "replicas"
    default_replicas: int = 1
    count_first: bool = False
    job: bool = False
    minimum: str | None = None
    gang_minimum: tuple[str, ...] | None = None
    zero_is_all: bool = False

    def templates(self) -> Templates:
        """The places the reader finds the pod templates at, for the CEL."""
        return Templates(((*self.items, "*", *self.template),), self.shape)

    def reader(self, kind: str, reserves: bool = True) -> Reader:
        """The reader of ``kind`` described so (its Workloads marked as reserving
        nothing when ``reserves`` is False: a kind that only makes workloads)."""

        def read(obj: dict[str, Any]) -> Workload | None:
            w = self.read(kind, obj)
            if w is not None and not reserves:
                w.reserves = False
            return w
        return read

    def read(self, kind: str, obj: dict[str, Any]) -> Workload | None:
        """The roles of ``obj``, an object of ``kind``, or None when it holds no
        template. Raises MalformedObject when a level on the way has the wrong type."""
        found = _walk(obj, self.items[:-1], "")
        if found is None:
            return None
        parent, at = found
        roles = []
        for name, item, ptr in _items(parent, self.items[-1], at):
            count = f"{ptr}/{escape(self.replicas)}"
            n = _count(item.get(self.replicas), count, self.default_replicas
                       ) if self.count_first else None
            held = _walk(item, self.template[:-1], ptr)
            if held is None:
                continue
            holder, hptr = held
            t = _template_at(kind, holder, self.template[-1], hptr)
            if t is None:
                continue
            if n is None:
                n = _count(item.get(self.replicas), count, self.default_replicas)
            if self.job:
                n *= _job_pods(holder, hptr)
            least = None
            if self.minimum is not None:
                least = min(_count(item.get(self.minimum),
                                   f"{ptr}/{escape(self.minimum)}", n), n)
            roles.append(Role(name, t, n, least))
        if not roles:
            return None
        total = sum(r.pods for r in roles)
        gang = total
        if self.gang_minimum is not None:
            value, vptr = _get(parent, self.gang_minimum)
            gang = _count(value, at + vptr, total)
            if gang == 0 and self.zero_is_all:
                gang = total
        return Workload(kind, self.noun, self.role_word, roles, min(gang, total))


def _walk(obj: dict[str, Any], path: tuple[str, ...], ptr: str
          ) -> tuple[dict[str, Any], str] | None:
    """The mapping at ``path`` below ``obj`` (at ``ptr``) and its pointer; None when a
    level is absent. Raises MalformedObject when one is no mapping."""
    for key in path:
        nxt = child_map(obj, key, ptr)
        if nxt is None:
            return None
        obj, ptr = nxt, f"{ptr}/{escape(key)}"
    return obj, ptr


def _job_pods(job_spec: dict[str, Any], ptr: str) -> int:
    """Pods a batch/v1 Job spec runs at once: parallelism (default 1), at most its
    completions."""
    comp = job_spec.get("completions")
    return job_pods(_count(job_spec.get("parallelism"), ptr + "/parallelism", 1),
                    None if comp is None else _count(comp, ptr + "/completions", 1))
