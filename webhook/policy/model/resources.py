"""What the policy counts as GPUs and where it sends them: GPU resources and their
weights (time-slicing, HAMi, KAI fractions), DRA device classes, products and how a pod
asks for one, the tolerations added to GPU pods, namespace selectors and topology."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from webhook.policy.model.core import (
    _DNS_LABEL,
    _QUALIFIED,
    _RESOURCE_PATTERN,
    FieldProblem,
    _Strict,
)


class GPUResources(_Strict):
    """Which extended resources count as GPUs."""

    names: list[Annotated[str, Field(pattern=_QUALIFIED, max_length=253)]] = Field(
        default_factory=lambda: ["nvidia.com/gpu"], max_length=256
    )
    """Extended resource names that are GPUs."""
    patterns: list[Annotated[str, Field(pattern=_RESOURCE_PATTERN, max_length=253)]] = Field(
        default_factory=list, max_length=256
    )
    """Shell-style patterns (``nvidia.com/mig-*``); ``*`` matches any characters."""
    weights: dict[str, Annotated[float, Field(gt=0, le=1024)]] = Field(
        default_factory=dict, max_length=256
    )
    """GPU-equivalents per device of a resource (a MIG 1g slice of 7 -> 0.142857).
    Resources not listed weigh 1."""
    time_slicing: dict[
        Annotated[str, Field(pattern=_QUALIFIED, max_length=253)],
        Annotated[int, Field(ge=1, le=1024)],
    ] = Field(default_factory=dict, max_length=256)
    """Resources the NVIDIA device plugin time-slices, with the plugin's
    ``sharing.timeSlicing.resources[].replicas`` (``nvidia.com/gpu.shared: 4`` where
    ``renameByDefault`` renames it): each is a GPU resource, and one unit of it weighs
    1/replicas of its weight (``weights``, else 1)."""
    hami: HAMi | None = None
    """The GPU resource HAMi shares, and its share resources: a vGPU is charged the
    larger of its memory and cores shares of a device (at most 1). Off when absent."""

    kai: KAIFractions | None = None
    """Charge pods asking KAI-Scheduler's GPU fractions by annotation as GPU pods: the
    fraction of a device (``gpu-fraction``, or ``gpu-memory`` over ``deviceMemory``) times
    ``gpu-fraction-num-devices``. Off when absent."""

    @model_validator(mode="after")
    def _hami_resource_is_a_gpu(self) -> GPUResources:
        if self.hami is not None and self.hami.resource not in self.names:
            raise FieldProblem(("hami", "resource"),
                f"hami.resource {self.hami.resource!r} must be one of gpuResources.names")
        return self


class HAMi(_Strict):
    """GPUs shared by HAMi (Project-HAMi/HAMi): its count resource asks for vGPUs, each a
    share of one device given by HAMi's memory and cores resources."""

    resource: Annotated[str, Field(pattern=_QUALIFIED, max_length=253)] = "nvidia.com/gpu"
    """HAMi's ``resourceName``: the number of vGPUs, each on a different device."""
    memory: Annotated[str, Field(pattern=_QUALIFIED, max_length=253)] = "nvidia.com/gpumem"
    """HAMi's ``resourceMem``: device memory per vGPU, in MiB."""
    memory_percentage: Annotated[str, Field(pattern=_QUALIFIED, max_length=253)] = (
        "nvidia.com/gpumem-percentage")
    """HAMi's ``resourceMemPercentage``: device memory per vGPU, in percent of the device."""
    cores: Annotated[str, Field(pattern=_QUALIFIED, max_length=253)] = "nvidia.com/gpucores"
    """HAMi's ``resourceCores``: compute per vGPU, in percent of the device's cores."""
    device_memory: Annotated[int, Field(ge=1, le=100_000_000)] | None = None
    """MiB of memory of one device (the smallest of the cluster's HAMi GPUs), to turn
    ``memory`` into a share; without it a vGPU asking memory is charged a whole device."""
    tenants: list[Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]] | None = Field(
        default=None, max_length=4096)
    """The tenants whose ``resource`` HAMi shares (their namespaces' nodes run HAMi);
    absent: every tenant's, and pods outside tenants."""

    @model_validator(mode="after")
    def _distinct(self) -> HAMi:
        names = [self.resource, self.memory, self.memory_percentage, self.cores]
        if len(set(names)) != len(names):
            raise ValueError("resource, memory, memoryPercentage and cores must be four "
                             "different resource names")
        return self


class KAIFractions(_Strict):
    """GPUs shared by KAI-Scheduler (NVIDIA/KAI-Scheduler): a pod asks a fraction of a
    device by annotation (``gpu-fraction``, ``gpu-memory``, ``gpu-fraction-num-devices``)
    and no GPU resource."""

    device_memory: Annotated[int, Field(ge=1, le=100_000_000)] | None = None
    """MiB of memory of one device (the smallest of the cluster's shared GPUs), to turn
    ``gpu-memory`` into a share; without it such a pod is charged a whole device each."""
    resource: Annotated[str, Field(pattern=_QUALIFIED, max_length=253)] = "nvidia.com/gpu"
    """The GPU resource the share counts as (for ``quota.resources`` and ``weights``):
    the one KAI's reservation pods hold."""


class DeviceClass(_Strict):
    """A DeviceClass whose devices are GPUs (Dynamic Resource Allocation), and what one
    device of it weighs."""

    gpus: Annotated[float, Field(gt=0, le=1024)] = 1.0
    """GPU-equivalents per device (a per-profile MIG class such as
    ``mig-1g-12gb.gpu.nvidia.com`` -> 0.142857)."""
    mig_profiles: bool = False
    """Weigh a request by the MIG profile its CEL selectors name
    (``device.attributes['gpu.nvidia.com'].profile == '1g.10gb'`` weighs as
    ``gpuResources.weights['nvidia.com/mig-1g.10gb']``); a request that names no profile
    weighs ``gpus`` (keep it at 1: at most a whole GPU)."""
    product_attribute: Annotated[str, Field(min_length=1, max_length=253)] = (
        "device.attributes['gpu.nvidia.com'].productName")
    """The CEL path of the device's product name, matched against the policy's product
    node-label values after spaces become dashes (NVML says ``NVIDIA A100-SXM4-80GB``,
    GPU Feature Discovery labels ``NVIDIA-A100-SXM4-80GB``)."""


def _default_device_classes() -> dict[str, DeviceClass]:
    # NVIDIA's DRA driver publishes these two classes.
    return {"gpu.nvidia.com": DeviceClass(),
            "mig.nvidia.com": DeviceClass(mig_profiles=True)}


class ProductRequest(_Strict):
    """Where a pod says which GPU product it wants."""

    label: Annotated[str, Field(pattern=_QUALIFIED)] | None = None
    annotation: Annotated[str, Field(pattern=_QUALIFIED)] | None = None


class Products(_Strict):
    """The GPU products, the node label that carries them, and their short names."""

    node_label: Annotated[str, Field(pattern=_QUALIFIED)] = "nvidia.com/gpu.product"
    aliases: dict[
        Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)],
        Annotated[str, Field(min_length=1, max_length=63)],
    ] = Field(default_factory=dict, max_length=256)
    """Short name -> node label value, e.g. ``a100: NVIDIA-A100-SXM4-80GB``."""
    request: ProductRequest = Field(default_factory=ProductRequest)

    @model_validator(mode="after")
    def _values_unique(self) -> Products:
        seen: dict[str, str] = {}
        for alias, value in self.aliases.items():
            if value in seen:
                raise FieldProblem(("aliases", alias),
                    f"aliases {seen[value]!r} and {alias!r} both name {value!r}: "
                    "give each node label value one short name"
                )
            seen[value] = alias
        return self


class Toleration(_Strict):
    """A toleration added to GPU pods (the same fields as a pod's toleration)."""

    key: str | None = Field(default=None, max_length=316)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value: drop `value` or use Equal")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key must use operator Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds only applies to effect NoExecute")
        return self

    def as_pod_toleration(self) -> dict[str, object]:
        """The toleration as it appears in a pod spec (no null fields)."""
        out: dict[str, object] = {}
        if self.key is not None:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value is not None:
            out["value"] = self.value
        if self.effect is not None:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


class LabelSelectorRequirement(_Strict):
    key: Annotated[str, Field(pattern=_QUALIFIED)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list, max_length=256)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class LabelSelector(_Strict):
    """A Kubernetes label selector (matchLabels AND matchExpressions)."""

    match_labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _not_empty(self) -> LabelSelector:
        if not self.match_labels and not self.match_expressions:
            raise ValueError(
                "an empty namespaceSelector would match every namespace: "
                "give matchLabels or matchExpressions"
            )
        return self


class Topology(_Strict):
    """The node label (rack, NVLink domain) and values a tenant's GPU pods are pinned to."""

    node_label: Annotated[str, Field(pattern=_QUALIFIED)]
    values: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        min_length=1, max_length=256
    )
