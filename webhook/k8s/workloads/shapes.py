"""What a reader finds in an object: its pod templates, its roles and the workload they
make up, and the helpers the readers share to walk an object by path."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.k8s.objects import MalformedObject, child_map, escape


@dataclass(slots=True)
class PodTemplate:
    """A pod's metadata and spec inside an object, with the JSON Pointers to them."""

    kind: str  # Pod, Deployment, ... (as sent)
    is_pod: bool
    holder: dict[str, Any]  # the mapping that holds "metadata" and "spec"
    pointer: str  # JSON Pointer of ``holder`` ("" for a Pod)
    spec: dict[str, Any]

    @property
    def spec_pointer(self) -> str:
        return self.pointer + "/spec"

    @property
    def metadata(self) -> dict[str, Any] | None:
        return child_map(self.holder, "metadata", self.pointer)


@dataclass(slots=True)
class Role:
    """One pod template of a workload and the pods made from it."""

    name: str | None  # "worker", "launcher", ...; None for a single-template kind
    template: PodTemplate
    pods: int  # pods of this template at once
    minimum: int | None = None  # pods of this role the gang needs (None: no own minimum)
    # False when the "template" is made up from the workload's resource fields (a
    # TrainJob's resourcesPerNode, an Argo step's container): checked, never patched;
    # its pods are completed and pinned when they are created.
    patchable: bool = True


@dataclass(slots=True)
class Workload:
    """What an object of a known kind runs: its roles, and its gang minimum in pods."""

    kind: str
    noun: str  # how messages name the kind: "deployment", "volcano job", "pytorchjob"
    role_word: str  # how messages name a role: "task", "replicated job", "replica type"
    roles: list[Role]
    gang: int | None = None  # pods that must start together; None: no gang
    # Pods at once is an upper bound, not a sum (Argo: steps run one after another or
    # fan out): quota is checked per pod, never for the sum.
    sequential: bool = False
    # Its gang is reserved when it is created. False for a kind that only makes
    # workloads (a Volcano CronJob's Jobs are each reserved when the CronJob makes them).
    reserves: bool = True

    @property
    def pods(self) -> int:
        return sum(r.pods for r in self.roles)


Reader = Callable[[dict[str, Any]], "Workload | None"]


# --- helpers ------------------------------------------------------------------------


def job_pods(parallelism: int, completions: int | None, succeeded: int = 0) -> int:
    """Pods a batch Job runs at once: its parallelism, never more than the completions it
    still needs (none needed: 0). The one rule behind a Job's gang at apply, a workload's
    roles and the waiting line's release."""
    if completions is None:
        return parallelism
    return max(min(parallelism, completions - succeeded), 0)


def _count(value: Any, ptr: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedObject(ptr, "a non-negative integer")
    return value


def _get(obj: Mapping[str, Any], path: tuple[str, ...]) -> tuple[Any, str]:
    """The value at ``path`` (None when a level is absent) and its JSON Pointer."""
    ptr = "".join("/" + escape(k) for k in path)
    cur: Any = obj
    at = ""
    for key in path:
        if cur is None:
            return None, ptr
        if isinstance(cur, list) and key.isdigit():  # an item a ``*`` was bound to
            cur = cur[int(key)] if int(key) < len(cur) else None
        elif isinstance(cur, dict):
            cur = cur.get(key)
        else:
            raise MalformedObject(at, "a mapping")
        at = f"{at}/{escape(key)}"
    return cur, ptr


def _template_at(kind: str, holder_parent: dict[str, Any], key: str, ptr: str
                 ) -> PodTemplate | None:
    """The pod template at ``holder_parent[key]`` (metadata + spec), None when absent."""
    holder = child_map(holder_parent, key, ptr)
    if holder is None:
        return None
    hptr = f"{ptr}/{escape(key)}"
    spec = child_map(holder, "spec", hptr)
    if spec is None:
        return None
    return PodTemplate(kind, False, holder, hptr, spec)


def _items(parent: dict[str, Any], key: str, ptr: str) -> Iterator[tuple[str, dict[str, Any],
                                                                          str]]:
    """(name, item, pointer) of each item of a list (name: its ``name`` or index) or a map."""
    value = parent.get(key)
    base = f"{ptr}/{escape(key)}"
    if value is None:
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise MalformedObject(f"{base}/{i}", "a mapping")
            name = item.get("name")
            yield (name if isinstance(name, str) and name else str(i)), item, f"{base}/{i}"
    elif isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(item, dict):
                raise MalformedObject(f"{base}/{escape(str(k))}", "a mapping")
            yield str(k), item, f"{base}/{escape(str(k))}"
    else:
        raise MalformedObject(base, "a list or a mapping")


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    return child_map(obj, "spec", "") or {}
