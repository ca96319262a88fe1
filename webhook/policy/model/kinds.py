"""Workload kinds: the built-in ones, and those the policy configures (where each role
keeps its pod template)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from webhook.k8s.objects import parse_pointer
from webhook.k8s.workloads import READERS
from webhook.policy.model.core import _DNS_LABEL, FieldProblem, _Strict

BUILT_IN_KINDS = frozenset(READERS)

# --- workload kinds configured by the policy ------------------------------------------

_GROUP = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$"
_KIND = r"^[A-Z][A-Za-z0-9]{0,62}$"
_VERSION = r"^v[0-9]+((alpha|beta)[0-9]+)?$"
_POINTER = r"^(/([^/~]|~[01])*)+$"


class WorkloadRole(_Strict):
    """Where one kind of role of a configured workload keeps its pod template.

    ``template`` is a JSON Pointer to a pod template (an object with ``metadata`` and
    ``spec``); a ``*`` segment stands for every item of a list or every value of a map,
    each item one role. ``replicas`` and ``name`` point into the same item: they begin
    with the template's pointer up to its last ``*``."""

    template: Annotated[str, Field(pattern=_POINTER, max_length=512)]
    replicas: Annotated[str, Field(pattern=_POINTER, max_length=512)] | None = None
    """Pods of the role at once; absent in the object: ``defaultReplicas``."""
    default_replicas: Annotated[int, Field(ge=0, le=100_000)] = 1
    name: Annotated[str, Field(pattern=_POINTER, max_length=512)] | None = None
    """The role's name, for messages (default: the item's key or index)."""

    @model_validator(mode="after")
    def _same_item(self) -> WorkloadRole:
        tokens = parse_pointer(self.template)
        stars = [i for i, t in enumerate(tokens) if t == "*"]
        if len(stars) > 1:
            raise FieldProblem(("template",),
                f"template {self.template!r} has {len(stars)} '*' segments: use one (each "
                "item of one list or map is a role)")
        prefix = tokens[: stars[-1] + 1] if stars else ()
        for field_name, value in (("replicas", self.replicas), ("name", self.name)):
            if value is None:
                continue
            own = parse_pointer(value)
            if own[: len(prefix)] != prefix or "*" in own[len(prefix):]:
                raise FieldProblem((field_name,),
                    f"{field_name} {value!r} must point into the same item as the template "
                    f"{self.template!r}: begin it with "
                    f"{'/' + '/'.join(prefix) if prefix else 'any path without *'}")
        return self


class WorkloadKind(_Strict):
    """A workload kind the webhook checks at apply besides the built-in ones."""

    group: Annotated[str, Field(pattern=_GROUP, max_length=253)]
    kind: Annotated[str, Field(pattern=_KIND)]
    resource: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]
    """The plural resource name, as in ``kubectl api-resources`` (for the webhook rules)."""
    versions: list[Annotated[str, Field(pattern=_VERSION)]] = Field(min_length=1, max_length=16)
    roles: list[WorkloadRole] = Field(min_length=1, max_length=16)
    gang: Literal["none", "all"] = "none"
    """``all``: every pod must start together (like a JobSet); ``none``: no gang."""
    gang_minimum: Annotated[str, Field(pattern=_POINTER, max_length=512)] | None = None
    """Pods that must start together, when the object sets it (overrides ``gang``)."""
