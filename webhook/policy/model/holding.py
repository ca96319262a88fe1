"""How GPUs are held: for how long (maximum runtime), with how much CPU and memory per
GPU, sent to which scheduler and queue, and asked for by capability."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from webhook.k8s.quantity import QuantityError
from webhook.k8s.quantity import parse as parse_quantity
from webhook.policy.model.core import _DNS_LABEL, _QUALIFIED, _SUBDOMAIN, FieldProblem, _Strict
from webhook.policy.model.resources import ProductRequest

# --- how GPUs are held: for how long, with how much CPU, sent where, on what -----------

# activeDeadlineSeconds is an int64 of seconds; a year is more than any cap means.
_RUNTIME_MAX = 366 * 24 * 3600
Quantity = Annotated[int | str, Field(union_mode="left_to_right")]


def _quantity(value: object, where: str) -> object:
    """A Kubernetes quantity (``16``, ``"500m"``, ``"128Gi"``) greater than 0."""
    try:
        q = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(f"{where}: {exc}: write a Kubernetes quantity such as 16, "
                         '"500m" or "128Gi"') from exc
    if q <= 0:
        raise ValueError(f"{where}: {value!r} must be more than 0")
    return value


class RuntimeKind(_Strict):
    """A kind of work with a maximum runtime of its own: the GPU pods that carry all of
    ``podLabels``, or run at one of ``priorityClasses``, or in one of ``namespaces``."""

    name: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]
    """Shown in messages and the pod's annotation (``notebooks``)."""
    seconds: Annotated[int, Field(ge=1, le=_RUNTIME_MAX)]
    """The longest ``activeDeadlineSeconds`` of these pods."""
    pod_labels: dict[Annotated[str, Field(pattern=_QUALIFIED, max_length=317)],
                     Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=16)
    """Pods with every one of these labels (and values)."""
    priority_classes: list[Annotated[str, Field(pattern=_SUBDOMAIN, max_length=253)]] = (
        Field(default_factory=list, max_length=64))
    """Pods naming one of these PriorityClasses (``spec.priorityClassName``)."""
    namespaces: list[Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]] = Field(
        default_factory=list, max_length=1024)
    """Pods in one of these namespaces of the tenant."""

    @model_validator(mode="after")
    def _selects(self) -> RuntimeKind:
        if not (self.pod_labels or self.priority_classes or self.namespaces):
            raise ValueError(f"kind {self.name!r} selects no pod: give podLabels, "
                             "priorityClasses or namespaces")
        return self


class MaxRuntime(_Strict):
    """How long a tenant's GPU pods may run (rule max-runtime). A pod gets
    ``activeDeadlineSeconds`` (the kubelet ends it that long after it starts, and its
    GPUs are free); a Job gets its own ``spec.activeDeadlineSeconds`` at apply."""

    seconds: Annotated[int, Field(ge=1, le=_RUNTIME_MAX)] | None = None
    """The cap of the GPU pods that are of no kind below (default: none)."""
    on_longer: Literal["shorten", "deny"] = "shorten"
    """A pod or Job asking for a longer deadline than its cap: ``shorten`` it to the cap,
    or ``deny`` it."""
    kinds: list[RuntimeKind] = Field(default_factory=list, max_length=64)
    """Kinds of work with caps of their own; the first that matches a pod is its kind."""

    @model_validator(mode="after")
    def _caps(self) -> MaxRuntime:
        if self.seconds is None and not self.kinds:
            raise ValueError("maxRuntime caps nothing: give `seconds` or `kinds`")
        names = [k.name for k in self.kinds]
        for i, n in enumerate(names):
            if n in names[:i]:
                raise FieldProblem(("kinds", i, "name"), f"kind {n!r} is named twice")
        return self


class PerGPU(_Strict):
    """The most CPU and memory a GPU pod may ask per GPU-equivalent it asks."""

    cpu: Quantity | None = None
    """CPUs per GPU (``16``, ``"15500m"``), on the pod's effective CPU request."""
    memory: Quantity | None = None
    """Memory per GPU (``"128Gi"``), on the pod's effective memory request."""

    @field_validator("cpu", "memory")
    @classmethod
    def _is_quantity(cls, value: object) -> object:
        return value if value is None else _quantity(value, "a per-GPU amount")


class ResourcesPerGPU(PerGPU):
    """CPU and memory in proportion to GPUs (rule resources-per-gpu), on the pod's
    request as the scheduler reads it (pod-level ``spec.resources`` where set, else its
    containers'), at creation and at an in-place resize (``pods/resize``); a pod's GPUs
    cannot be resized."""

    default_cpu: Quantity | None = None
    """CPUs per GPU given to a GPU pod that asks for no CPU in any container nor at
    pod level."""
    default_memory: Quantity | None = None
    """Memory per GPU given to a GPU pod that asks for no memory in any container nor
    at pod level."""
    products: dict[Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)], PerGPU] = (
        Field(default_factory=dict, max_length=256))
    """Per product short name: its own per-GPU caps (a field unset there takes the
    one above)."""

    @field_validator("default_cpu", "default_memory")
    @classmethod
    def _default_is_quantity(cls, value: object) -> object:
        return value if value is None else _quantity(value, "a per-GPU default")


class Routing(_Strict):
    """The scheduler and queue a tenant's GPU pods are sent to (rule queue-routing): set
    on every GPU pod of the tenant, over what the pod says, and on a workload's own
    labels at apply where its queueing system reads them there."""

    scheduler_name: Annotated[str, Field(pattern=_SUBDOMAIN, max_length=253)] | None = None
    """``spec.schedulerName`` (``volcano``, ``kai-scheduler``)."""
    kueue_queue: Annotated[str, Field(pattern=_SUBDOMAIN, max_length=63)] | None = None
    """Kueue's LocalQueue: the label ``kueue.x-k8s.io/queue-name``."""
    volcano_queue: Annotated[str, Field(pattern=_SUBDOMAIN, max_length=253)] | None = None
    """Volcano's Queue: the annotation ``scheduling.volcano.sh/queue-name``."""
    kai_queue: Annotated[str, Field(pattern=_SUBDOMAIN, max_length=63)] | None = None
    """KAI-Scheduler's queue: the label ``kai.scheduler/queue``."""

    @model_validator(mode="after")
    def _routes(self) -> Routing:
        if not (self.scheduler_name or self.kueue_queue or self.volcano_queue
                or self.kai_queue):
            raise ValueError("routing sends the pods nowhere: give schedulerName, "
                             "kueueQueue, volcanoQueue or kaiQueue")
        return self


class GPUCapabilities(_Strict):
    """How a pod asks for GPUs by what they can do, and where nodes and DRA devices say
    it. The ask becomes node affinity on GPU Feature Discovery's labels (``Gt``) for
    device-plugin GPUs, and a CEL selector on the DRA driver's attributes for claims;
    the tenant's allowed products still apply (rule gpu-capability)."""

    memory: ProductRequest = Field(default_factory=lambda: ProductRequest(
        label="gpu-webhook.dev/min-gpu-memory"))
    """Where a pod (or claim) asks for the least memory per GPU, as a quantity
    (``80Gi``, ``80G``)."""
    compute_capability: ProductRequest = Field(default_factory=lambda: ProductRequest(
        label="gpu-webhook.dev/min-compute-capability"))
    """Where a pod (or claim) asks for the least CUDA compute capability (``9.0``)."""
    memory_label: Annotated[str, Field(pattern=_QUALIFIED)] = "nvidia.com/gpu.memory"
    """The node label of each GPU's memory in MiB (GFD)."""
    compute_major_label: Annotated[str, Field(pattern=_QUALIFIED)] = (
        "nvidia.com/gpu.compute.major")
    compute_minor_label: Annotated[str, Field(pattern=_QUALIFIED)] = (
        "nvidia.com/gpu.compute.minor")
    memory_capacity: Annotated[str, Field(min_length=1, max_length=253)] = (
        "device.capacity['gpu.nvidia.com'].memory")
    """The CEL path of a DRA device's memory (a quantity)."""
    compute_attribute: Annotated[str, Field(min_length=1, max_length=253)] = (
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability")
    """The CEL path of a DRA device's compute capability (a version)."""
