"""Policy test suite files (``kind: GPUPolicyTest``, ``gpu-webhook test``): their model,
validated strictly with errors that name file, line and field like the policy itself
(``policies/tests/README.md`` is the format), and finding them under a directory.

A suite names a policy (relative to the suite file), the labels of namespaces (for
``namespaceSelector`` tenants), the GPU pods already running (a usage snapshot, as full
Pod manifests or in a compact form) and the cases, each an object and what the webhook
should do with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from webhook.policy.load import load_document, read_file
from webhook.policy.model import Rule

KIND = "GPUPolicyTest"
OUTCOMES = ("allowed", "denied", "warned", "audited", "skipped")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel,
                              populate_by_name=True, frozen=True)


class Metadata(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=253)]


class Patched(_Strict):
    """One effect of the mutating webhook's patch on the object, by JSON Pointer."""

    path: Annotated[str, Field(pattern=r"^(/.*)?$")]
    """A JSON Pointer into the patched object, ``~1`` for ``/`` in a key
    (``/spec/containers/0/resources/requests/nvidia.com~1gpu``)."""
    value: Any = None
    """The value expected there (any YAML value); leave out to only require the path."""
    absent: bool = False
    """The path must not exist in the patched object."""

    @model_validator(mode="after")
    def _value_or_absent(self) -> Patched:
        if self.absent and "value" in self.model_fields_set:
            raise ValueError("give `value` or `absent: true`, not both")
        return self


def _listed(value: object) -> object:
    return [value] if isinstance(value, str | dict) else value


class Expect(_Strict):
    """What the webhook should do with a case's object."""

    outcome: Literal["allowed", "denied", "warned", "audited", "skipped"]
    phase: Literal["mutating", "validating"] | None = None
    """For a denial: which webhook denies it."""
    rule: list[Rule] = Field(default_factory=list)
    """Rules that must be among the findings (one name or a list)."""
    message_contains: list[str] = Field(default_factory=list)
    warning_contains: list[str] = Field(default_factory=list)
    changes: list[str] | None = None
    """The mutating webhook's changes, exactly (any order); [] for none."""
    patched: list[Patched] = Field(default_factory=list)

    @field_validator("rule", "message_contains", "warning_contains", "patched",
                     mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return _listed(value)  # `rule: quota` reads better than `rule: [quota]`


class Case(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    resource: dict[str, Any] | None = None
    """The object, inline: a Pod, Deployment, Job, ... manifest."""
    resource_file: str | None = None
    """Or a file holding it (one document), relative to the suite file."""
    namespace: str | None = None
    """When the manifest does not say (default: ``default``)."""
    operation: Literal["CREATE", "UPDATE"] = "CREATE"
    old_resource: dict[str, Any] | None = None
    """For UPDATE: the object before the change (a Deployment scaled from 2 to 5)."""
    user: str = "developer"
    groups: list[str] = Field(default_factory=lambda: ["system:authenticated"])
    dry_run: bool = False
    at: AwareDatetime | None = None
    """The time the case is decided at, with its offset (``2026-03-02T09:00:00+01:00``):
    it chooses the quota windows of a ``quotaSchedule`` (default: now)."""
    expect: Expect

    @model_validator(mode="after")
    def _one_resource(self) -> Case:
        if (self.resource is None) == (self.resource_file is None):
            raise ValueError("give the object as `resource` (inline) or `resourceFile`, "
                             "exactly one of them")
        if self.old_resource is not None and self.operation != "UPDATE":
            raise ValueError("`oldResource` is only for operation UPDATE")
        return self


class RunningPod(_Strict):
    """A GPU pod already running: a full Pod manifest, or the compact form
    ``{namespace, name, gpus, resource, product, owner, spot}``."""

    api_version: str | None = None
    kind: Literal["Pod"] | None = None
    metadata: dict[str, Any] | None = None
    spec: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    namespace: str | None = None
    name: str | None = None
    gpus: Annotated[float, Field(gt=0, le=1_000_000)] | None = None
    """Devices of ``resource`` the pod holds (weights apply for quota)."""
    resource: str = "nvidia.com/gpu"
    product: str | None = None
    """Product short name (or node label value) the pod is pinned to."""
    owner: str | None = None
    """``job/pretrain``, ``deployment/web``: named in quota messages."""
    user: str | None = None
    """The user it is charged to (``userQuota``): who created it or its workload."""
    spot: bool = False
    """The pod runs on spot nodes (pinned there by a nodeSelector on the policy's spot
    label), so it holds spot GPUs."""

    @model_validator(mode="after")
    def _one_form(self) -> RunningPod:
        manifest = self.kind is not None or self.spec is not None
        compact = self.namespace is not None or self.gpus is not None
        if manifest and compact:
            raise ValueError("a running pod is either a Pod manifest (apiVersion, kind, "
                             "metadata, spec) or compact (namespace, name, gpus, resource, "
                             "product, owner, spot), not both")
        if manifest and (self.kind is None or self.spec is None or self.metadata is None):
            raise ValueError("a Pod manifest needs kind: Pod, metadata and spec")
        if not manifest and (self.namespace is None or self.gpus is None):
            raise ValueError("a compact running pod needs namespace and gpus")
        return self


class UsedHours(_Strict):
    """GPU-hours a tenant (or one of its users) has used in its budget's open period
    (``tenants[].budget``; product weights applied)."""

    tenant: str
    gpu_hours: float = Field(ge=0)
    user: str | None = None
    """The user, for a budget's ``perUserGpuHours``."""


class Suite(_Strict):
    api_version: Literal["gpu-webhook.dev/v1alpha1"]
    kind: Literal["GPUPolicyTest"]
    metadata: Metadata
    policy: str
    """The policy file, relative to this suite file."""
    namespaces: dict[str, dict[str, str]] = Field(default_factory=dict)
    """Labels of namespaces, for tenants chosen by namespaceSelector."""
    usage: list[RunningPod] = Field(default_factory=list)
    gpu_time: list[UsedHours] = Field(default_factory=list)
    """GPU-hours used in the budgets' open periods, at each case's time."""
    cases: list[Case] = Field(min_length=1)


def load_suite(path: Path) -> Suite:
    return load_document(read_file(path), str(path), Suite, KIND)


def discover(target: Path) -> list[Path]:
    """Suite files: ``target`` itself, or the YAML files under it whose ``kind`` is
    GPUPolicyTest (other YAML there, such as manifests the suites refer to, is skipped;
    a file whose kind cannot be read is returned so that its error is reported)."""
    if target.is_file():
        return [target]
    found = []
    for p in sorted([*target.rglob("*.yaml"), *target.rglob("*.yml")]):
        try:
            docs = [d for d in yaml.safe_load_all(p.read_text("utf-8")) if d is not None]
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            found.append(p)
            continue
        if any(isinstance(d, dict) and d.get("kind") == KIND for d in docs):
            found.append(p)
    return found

