"""The policy file's schema, as strict pydantic models.

One file holds one ``GPUPolicy``. Field names in YAML are camelCase like Kubernetes
objects; an unknown field anywhere is an error (``extra="forbid"``) so a typo never
silently turns a rule off. Every field is documented in ``policies/README.md``; keep
the two in step.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from webhook.k8s.objects import parse_pointer
from webhook.k8s.quantity import QuantityError
from webhook.k8s.quantity import parse as parse_quantity
from webhook.k8s.workloads import READERS

BUILT_IN_KINDS = frozenset(READERS)

API_VERSION = "gpu-webhook.dev/v1alpha1"
KIND = "GPUPolicy"

# DNS-1123 label: what a namespace name and our rule/tenant names look like.
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A qualified Kubernetes name with optional DNS prefix: label keys, resource names.
_QUALIFIED = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_RESOURCE_PATTERN = r"^[A-Za-z0-9*]([-A-Za-z0-9_.*/]*[A-Za-z0-9*])?$"
_SERVICE_ACCOUNT = r"^[a-z0-9-.]+/[a-z0-9-.]+$"  # namespace/name


class Mode(StrEnum):
    """What a rule does when it finds a violation."""

    ENFORCE = "enforce"  # deny the request
    WARN = "warn"  # allow, with an AdmissionReview warning that kubectl prints
    AUDIT = "audit"  # allow silently; log and count the violation


class TolerationPolicy(StrEnum):
    """What happens to a pod that requests no GPU but tolerates the GPU nodes' taints."""

    STRIP = "strip"  # remove those tolerations (mutating webhook)
    DENY = "deny"
    ALLOW = "allow"


class OverQuota(StrEnum):
    """What becomes of a tenant's GPU pod that does not fit its quota now but could."""

    DENY = "deny"  # refused at once, as ResourceQuota refuses
    WAIT = "wait"  # admitted behind a scheduling gate, released when it fits


class Rule(StrEnum):
    """The stable names of the rules; they appear in messages, metrics and policy files."""

    TENANT_REQUIRED = "tenant-required"
    GPU_QUANTITY = "gpu-whole-number"
    REQUESTS_MATCH_LIMITS = "gpu-requests-match-limits"
    ALLOWED_RESOURCES = "allowed-resources"
    ALLOWED_PRODUCTS = "allowed-products"
    TOPOLOGY = "topology"
    MAX_PER_CONTAINER = "max-gpus-per-container"
    MAX_PER_POD = "max-gpus-per-pod"
    NON_GPU_TOLERATIONS = "non-gpu-tolerations"
    QUOTA = "quota"
    ALLOWED_DEVICE_CLASSES = "allowed-device-classes"
    DEVICE_ADMIN_ACCESS = "device-admin-access"
    EXTENDED_RESOURCE_CLAIM = "extended-resource-claim"
    UNKNOWN_CLAIM = "unknown-claim"
    SPOT_PLACEMENT = "spot-placement"
    # Routes to a GPU that skip the GPU request (docs/security.md).
    VISIBLE_DEVICES = "gpu-visible-devices"
    PRIVILEGED = "privileged-on-gpu-nodes"
    DEVICE_HOST_PATHS = "device-host-paths"
    NODE_NAME = "node-name"
    PRIORITY_CLASS = "priority-class"
    DEVICE_TAINT_TOLERATIONS = "device-taint-tolerations"
    # How GPUs are held: for how long, with how much CPU and memory, sent where, on what.
    MAX_RUNTIME = "max-runtime"
    RESOURCES_PER_GPU = "resources-per-gpu"
    QUEUE_ROUTING = "queue-routing"
    GPU_CAPABILITY = "gpu-capability"


class FieldProblem(ValueError):
    """A cross-field error that names the field to fix.

    A model validator can only fail as a whole, which would point the user at the line
    of the whole ``spec``; ``loc`` (relative to the model that raises it) lets the loader
    report the line and path of the offending field instead.
    """

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        str_strip_whitespace=False,
        # The docstring under a field is its description in the published JSON Schema
        # and the GPUPolicy CRD (webhook.policy.schema): one text for code and editors.
        use_attribute_docstrings=True,
    )


class Metadata(_Strict):
    name: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]
    """The policy's name; shown in messages and metrics."""


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


Count = Annotated[int, Field(ge=0, le=1_000_000)]
Equivalents = Annotated[float, Field(ge=0, le=1_000_000)]


class QuotaLimits(_Strict):
    """Caps on what a tenant (or one namespace of it) may hold at once."""

    gpus: Equivalents | None = None
    """Total GPU-equivalents over every GPU resource (weights apply)."""
    resources: dict[str, Count] = Field(default_factory=dict, max_length=256)
    """Per GPU resource name, in devices of that resource."""
    products: dict[str, Equivalents] = Field(default_factory=dict, max_length=256)
    """Per product short name, in GPU-equivalents."""
    pods: Count | None = None
    """GPU pods at once."""
    shared_gpus: Equivalents | None = None
    """GPU-equivalents held as shares of devices (time-sliced units, HAMi vGPUs, KAI
    fractions), apart from whole GPUs; they count towards ``gpus`` too."""


class Quota(QuotaLimits):
    namespaces: dict[
        Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)], QuotaLimits
    ] = Field(default_factory=dict, max_length=1024)
    """Tighter caps for single namespaces of the tenant."""


# --- per-user caps and caps by the clock -----------------------------------------------

# The annotation that records who created a workload (or a bare pod), in the project's
# domain: written by the mutating webhook, never trusted from a user.
USER_ANNOTATION = "gpu-webhook.dev/requested-by"


class UserQuota(_Strict):
    """Caps on what each user of a tenant may hold at once (``tenants[].userQuota``)."""

    gpus: Equivalents | None = None
    """GPU-equivalents one user's pods may hold at once, over every GPU resource."""
    pods: Count | None = None
    """GPU pods one user may hold at once."""
    controllers: list[Annotated[str, Field(pattern=_SERVICE_ACCOUNT)]] = Field(
        default_factory=list, max_length=256)
    """``namespace/name`` of service accounts, besides kube-system's, that create pods
    from a workload's template (a training operator): the user recorded on their pods is
    trusted. A pod anyone else creates is charged to its creator."""


Day = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
_DAYS: tuple[Day, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_CLOCK = r"^([01][0-9]|2[0-3]):[0-5][0-9]$|^24:00$"


class QuotaWindow(_Strict):
    """Caps that apply while the clock is in a window (``tenants[].quotaSchedule``)."""

    name: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]
    """Shown in messages, ``status`` and the GPUQuota status."""
    days: list[Day] = Field(default_factory=lambda: list(_DAYS), min_length=1, max_length=7)
    """Days of the week the window is open on (default: every day), in the schedule's
    time zone. A window past midnight belongs to the day it starts on."""
    start: Annotated[str, Field(pattern=_CLOCK)] = "00:00"
    """Local time the window opens (HH:MM), inclusive."""
    end: Annotated[str, Field(pattern=_CLOCK)] = "24:00"
    """Local time the window closes (HH:MM), exclusive; earlier than ``start``: the
    next day's."""
    quota: QuotaLimits = Field(default_factory=QuotaLimits)
    """The tenant-wide caps while the window is open: each field given replaces the
    tenant's ``quota`` field of the same name."""
    user_quota: UserQuota | None = None
    """Per-user caps while the window is open (``gpus`` and ``pods`` replace
    ``userQuota``'s)."""

    @model_validator(mode="after")
    def _not_empty(self) -> QuotaWindow:
        if self.start == self.end:
            raise FieldProblem(("end",), f"window {self.name!r} opens and closes at "
                               f"{self.start}: give a later end (24:00 for midnight)")
        return self


class QuotaSchedule(_Strict):
    """Quota that changes with the clock: windows in a named time zone."""

    time_zone: Annotated[str, Field(min_length=1, max_length=64)]
    """An IANA time zone (``Europe/Berlin``, ``UTC``) the windows' days and hours are in."""
    windows: list[QuotaWindow] = Field(min_length=1, max_length=64)
    """The first window open now gives the caps; outside every window, ``quota``."""

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"time zone {value!r} is not an IANA time zone (e.g. "
                             "Europe/Berlin, America/New_York, UTC)") from None
        return value

    @model_validator(mode="after")
    def _names_unique(self) -> QuotaSchedule:
        seen: set[str] = set()
        for i, w in enumerate(self.windows):
            if w.name in seen:
                raise FieldProblem(("windows", i, "name"),
                                   f"window name {w.name!r} is used twice")
            seen.add(w.name)
        return self


# --- spot / preemptible capacity -------------------------------------------------------

# What each provider puts on its spot GPU nodes (sources: policies/README.md, "Spot"):
# the node label and its spot values, and the toleration for the taint its spot nodes
# carry (AKS taints every spot node; GKE Standard node pools and Karpenter or EKS
# managed node groups add no taint unless the platform team does).
SPOT_PRESETS: dict[str, tuple[str, tuple[str, ...], tuple[dict[str, str], ...]]] = {
    "gke": ("cloud.google.com/gke-spot", ("true",),
            ({"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
              "effect": "NoSchedule"},)),
    "karpenter": ("karpenter.sh/capacity-type", ("spot",), ()),
    "eks": ("eks.amazonaws.com/capacityType", ("SPOT",), ()),
    "aks": ("kubernetes.azure.com/scalesetpriority", ("spot",),
            ({"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal",
              "value": "spot", "effect": "NoSchedule"},)),
}

SpotPlacement = Literal["never", "allowed", "required"]
SpotAffinity = Literal["required", "preferred"]


class FaultTolerance(_Strict):
    """How a pod says it is fault tolerant (may run on spot capacity)."""

    label: Annotated[str, Field(pattern=_QUALIFIED, max_length=317)] | None = (
        "gpu-webhook.dev/fault-tolerant")
    """A pod label: ``"true"`` says the pod is fault tolerant, ``"false"`` that it is not
    (which wins over a priority class and the tenant's default)."""
    annotation: Annotated[str, Field(pattern=_QUALIFIED, max_length=317)] | None = None
    """A pod annotation read like ``label`` (the label wins when both are set)."""
    priority_classes: list[Annotated[str, Field(pattern=_QUALIFIED, max_length=253)]] = (
        Field(default_factory=list, max_length=256))
    """Pods of these PriorityClasses (``spec.priorityClassName``) are fault tolerant."""


class SpotCapacity(_Strict):
    """Which nodes are spot (preemptible) capacity and how pods are placed on them."""

    provider: Literal["gke", "karpenter", "eks", "aks"] | None = None
    """A preset for ``nodeLabel``, ``values`` and ``tolerations``: ``gke``
    (``cloud.google.com/gke-spot: "true"``), ``karpenter``
    (``karpenter.sh/capacity-type: spot``), ``eks``
    (``eks.amazonaws.com/capacityType: SPOT``), ``aks``
    (``kubernetes.azure.com/scalesetpriority: spot``, tainted)."""
    node_label: Annotated[str, Field(pattern=_QUALIFIED, max_length=317)] | None = None
    """The node label that marks spot nodes (default: the provider's)."""
    values: list[Annotated[str, Field(min_length=1, max_length=63)]] | None = Field(
        default=None, min_length=1, max_length=16)
    """The label's values on spot nodes (default: the provider's)."""
    tolerations: list[Toleration] | None = Field(default=None, max_length=16)
    """Added to pods placed on spot, for the spot nodes' taints (default: the
    provider's). A GPU pod not allowed on spot that tolerates one of these taint keys
    (or the node label's key) is handled as ``podsToleratingSpot`` says."""
    fault_tolerant: FaultTolerance = Field(default_factory=FaultTolerance)
    """How a pod says it may run on spot."""
    placement: SpotPlacement = "never"
    """For tenants that do not say: ``never`` (no GPU pod on spot), ``allowed``
    (fault-tolerant pods on spot), ``required`` (every GPU pod on spot)."""
    affinity: SpotAffinity = "required"
    """How a fault-tolerant pod of an ``allowed`` tenant is sent to spot: ``required``
    (spot nodes only) or ``preferred`` (spot first, other nodes when spot is full)."""
    preferred_weight: Annotated[int, Field(ge=1, le=100)] = 100
    """The weight of the preferred node-affinity term (``affinity: preferred``)."""
    pods_tolerating_spot: Literal["strip", "deny"] = "strip"
    """A GPU pod that tolerates a spot taint without being allowed on spot: ``strip``
    those tolerations or ``deny`` the pod."""

    @model_validator(mode="after")
    def _marks_nodes(self) -> SpotCapacity:
        if self.provider is None and (self.node_label is None or self.values is None):
            raise ValueError("spot needs the node label that marks spot nodes: give "
                             "`provider` (gke, karpenter, eks, aks) or `nodeLabel` and "
                             "`values`")
        return self

    def resolved(self) -> tuple[str, tuple[str, ...], tuple[dict[str, object], ...]]:
        """The node label, its spot values and the tolerations: given, else the preset's."""
        preset = SPOT_PRESETS[self.provider] if self.provider else None
        label = self.node_label or (preset[0] if preset else "")
        values = tuple(self.values) if self.values is not None else (
            preset[1] if preset else ())
        if self.tolerations is not None:
            tolerations = tuple(t.as_pod_toleration() for t in self.tolerations)
        else:
            tolerations = tuple(dict(t) for t in preset[2]) if preset else ()
        return label, values, tolerations


class TenantSpot(_Strict):
    """A tenant's use of spot capacity and how its spot GPUs count."""

    placement: SpotPlacement | None = None
    """``never``, ``allowed`` (fault-tolerant pods) or ``required`` (every GPU pod);
    default: ``spec.spot.placement``."""
    fault_tolerant: bool = False
    """Every GPU pod of the tenant is fault tolerant unless it says otherwise."""
    affinity: SpotAffinity | None = None
    """``required`` or ``preferred`` (default: ``spec.spot.affinity``); a ``required``
    placement always pins by required affinity."""
    gpus: Equivalents | None = None
    """Cap on the GPU-equivalents the tenant's pods pinned to spot hold at once."""
    weight: Annotated[float, Field(gt=0, le=1)] = 1.0
    """What one GPU-equivalent on spot counts against the tenant's other GPU caps
    (``quota.gpus``, per product); 0.5 counts spot GPUs half."""

# A PriorityClass name: a DNS subdomain (``kubectl create priorityclass`` checks the same).
_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


# --- routes to a GPU that skip the GPU request (docs/security.md) ----------------------

VisibleDevicesChoice = Literal["neutralize", "deny", "allow"]
RouteChoice = Literal["deny", "allow"]


class GPURoutes(_Strict):
    """How a tenant's pods are kept from GPUs they do not ask for (and so are not charged
    for). In ``spec.gpuRoutes`` the defaults; in ``tenants[].gpuRoutes`` a tenant's own
    choices, each field unset there taking the policy's."""

    visible_devices: VisibleDevicesChoice | None = None
    """``NVIDIA_VISIBLE_DEVICES``, the variable NVIDIA's container runtime hands GPUs by.
    ``neutralize`` (default): a container given no GPU (by the device plugin or a DRA claim
    it names) gets ``NVIDIA_VISIBLE_DEVICES=void``, over its image's default and any
    ``envFrom``, and a container given GPUs loses its own value of the variable (which
    would replace the device plugin's); ``deny``: a container that sets the variable
    itself is refused (the others still get ``void``: an image's default cannot be
    seen); ``allow``: the variable is left alone (rule gpu-visible-devices)."""
    privileged: RouteChoice | None = None
    """A privileged container, or one that adds ``SYS_ADMIN`` (or ``ALL``), in a pod that
    can reach GPU nodes: it sees every device of the node. ``deny`` (default) or
    ``allow`` (rule privileged-on-gpu-nodes)."""
    device_host_paths: RouteChoice | None = None
    """A hostPath volume of ``/``, ``/dev`` or a path under it, in a pod that can reach
    GPU nodes: ``deny`` (default) or ``allow`` (rule device-host-paths)."""
    node_name: RouteChoice | None = None
    """A pod created with ``spec.nodeName`` skips the scheduler, so no NoSchedule taint
    keeps it off a GPU node: ``deny`` (default; a node the webhook's node watch knows to
    carry no GPU passes) or ``allow`` (rule node-name)."""
    @field_validator("visible_devices", mode="before")
    @classmethod
    def _not_off(cls, value: object) -> object:
        if value is False or value == "off":
            # YAML 1.1 (PyYAML, kubectl) reads an unquoted off as false.
            raise ValueError("to leave the variable alone write `allow` (an unquoted off "
                             "is read by YAML as false); the choices are neutralize, deny, "
                             "allow")
        return value

    device_taint_tolerations: RouteChoice | None = None
    """A ResourceClaim (or template) of a GPU class whose requests tolerate device taints
    (the DRA driver taints GPUs it finds unhealthy): ``deny`` (default) or ``allow``
    (rule device-taint-tolerations)."""


class PriorityLimits(_Strict):
    """Which PriorityClasses pods may run at (rule priority-class). The scheduler
    preempts any pod of lower priority, whatever its namespace: a tenant's pod above
    another tenant's in-quota pod could take its GPUs."""

    ceiling: Annotated[int, Field(ge=-2_147_483_648, le=1_000_000_000)] | None = None
    """The highest PriorityClass value a pod may run at (``spec.priority``: default 0,
    the value of a pod that names no class on a cluster without a global default).
    A tenant's ``priority.ceiling`` overrides it."""
    allowed_classes: list[Annotated[str, Field(pattern=_SUBDOMAIN, max_length=253)]] | None = (
        Field(default=None, max_length=256))
    """The PriorityClasses a tenant's pods may name (tenants only; default: any within
    the ceiling). The tenant's borrowed class is always allowed."""
    default_class: Annotated[str, Field(pattern=_SUBDOMAIN, max_length=253)] | None = None
    """The class a tenant's pod that names none is given (tenants only)."""


class BorrowedPriority(_Strict):
    """The PriorityClass a pod admitted on borrowed GPUs is given, as the cluster defines
    it. The API server's Priority admission plugin checks, after the mutating webhooks,
    that a pod's ``priority`` and ``preemptionPolicy`` are the ones its class names, so
    the webhook writes all three and they must match the PriorityClass object."""

    name: Annotated[str, Field(pattern=_SUBDOMAIN, max_length=253)] = "gpu-webhook-borrowed"
    """The PriorityClass's name (``deploy/base/priority-borrowed.yaml`` ships the default)."""
    value: Annotated[int, Field(ge=-2_147_483_648, le=1_000_000_000)] = -100
    """The class's ``value``; lower than the lenders' pods, so the scheduler preempts the
    borrowed pods to make room for them."""
    preemption_policy: Literal["Never", "PreemptLowerPriority"] = "Never"
    """The class's ``preemptionPolicy``: ``Never`` keeps a borrowed pod from preempting
    anyone itself."""


class Cohort(_Strict):
    """Tenants that share the quota they leave unused (rule quota). A tenant whose own
    ``quota.gpus`` is full may run pods on GPUs the others of its cohort leave idle; such
    a pod is labelled ``gpu-webhook.dev/borrowed: "true"``, given the borrowed
    PriorityClass, and preempted by the scheduler when the lender needs its GPUs back."""

    name: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]
    """The cohort this tenant belongs to; tenants naming the same cohort share."""
    borrowing_limit: Equivalents | None = None
    """GPU-equivalents this tenant may borrow at once, beyond its own quota (default: as
    many as the cohort leaves idle; 0: it only lends)."""
    lending_limit: Equivalents | None = None
    """GPU-equivalents of its unused quota that others may borrow (default: all of it;
    0: it only borrows)."""
    borrowed_priority_class: BorrowedPriority = Field(default_factory=BorrowedPriority)
    """The PriorityClass this tenant's borrowed pods run at."""


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
    """CPU and memory in proportion to GPUs (rule resources-per-gpu)."""

    default_cpu: Quantity | None = None
    """CPUs per GPU given to a GPU pod that asks for no CPU in any container."""
    default_memory: Quantity | None = None
    """Memory per GPU given to a GPU pod that asks for no memory in any container."""
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


class Tenant(_Strict):
    """A team: the namespaces it owns and what its GPU pods may use."""

    name: Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]
    """Shown in messages (``[rule ..., tenant NAME]``) and metrics; unique."""
    namespaces: list[Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]] = Field(
        default_factory=list, max_length=4096
    )
    """Namespaces the tenant owns, by name."""
    namespace_selector: LabelSelector | None = None
    """Namespaces the tenant owns, by label; a namespace named in some tenant's
    ``namespaces`` wins over selectors, and the first matching selector among them."""
    allowed_resources: list[str] | None = Field(default=None, max_length=256)
    """GPU resource names this tenant may request (default: every GPU resource)."""
    allowed_products: list[str] | None = Field(default=None, max_length=256)
    """Product short names this tenant may use (default: any; no product pinning)."""
    allowed_device_classes: list[str] | None = Field(default=None, max_length=256)
    """GPU DeviceClasses (of ``spec.deviceClasses``) this tenant's claims may ask (default:
    every one)."""
    default_product: str | None = None
    """The product of pods that do not ask for one; must be in ``allowedProducts``."""
    max_gpus_per_container: Equivalents | None = None
    """GPU-equivalents one container may ask (rule max-gpus-per-container)."""
    max_gpus_per_pod: Equivalents | None = None
    """GPU-equivalents one pod may ask, on its effective request (rule max-gpus-per-pod)."""
    topology: Topology | None = None
    """Rack / NVLink domain pinning (rule topology)."""
    quota: Quota | None = None
    """What the tenant may hold at once (rule quota)."""
    cohort: Cohort | None = None
    """Borrowing idle GPUs from (and lending to) the other tenants of a cohort."""
    mode: Mode | None = None
    """Enforcement mode for this tenant's rules when a rule has no mode of its own."""
    spot: TenantSpot | None = None
    """Whether the tenant's GPU pods may (or must) run on spot capacity, and how spot
    GPUs count against its quota (needs ``spec.spot``)."""
    gpu_routes: GPURoutes | None = None
    """The tenant's own choices of ``spec.gpuRoutes`` (fields unset here take the
    policy's)."""
    priority: PriorityLimits | None = None
    """The PriorityClasses the tenant's pods may name, their default, and the tenant's
    ceiling (over ``spec.priority.ceiling``)."""
    over_quota: OverQuota = OverQuota.DENY
    """A pod over the tenant's quota (or its cohort's room to borrow) now: ``deny``
    refuses it; ``wait`` admits it behind the scheduling gate ``gpu-webhook.dev/quota``,
    uncharged, and the leader replica releases it, charged, when it fits, in order of
    priority then arrival, a gang only whole. A pod that can never fit is refused in
    both."""
    max_runtime: MaxRuntime | None = None
    """How long the tenant's GPU pods may hold their GPUs (``activeDeadlineSeconds``),
    per kind of work (rule max-runtime)."""
    resources_per_gpu: ResourcesPerGPU | None = None
    """The most CPU and memory a GPU pod may ask per GPU, and what a pod asking none is
    given (over ``spec.resourcesPerGpu``; rule resources-per-gpu)."""
    routing: Routing | None = None
    """The scheduler and queue every GPU pod of the tenant is sent to (rule
    queue-routing)."""
    user_quota: UserQuota | None = None
    """What each user of the tenant may hold at once (rule quota); the user is the one
    who created the workload or the bare pod."""
    quota_schedule: QuotaSchedule | None = None
    """Caps that apply in time windows, for pods admitted while a window is open."""

    @model_validator(mode="after")
    def _selects_something(self) -> Tenant:
        if not self.namespaces and self.namespace_selector is None:
            raise ValueError(f"tenant {self.name!r} selects no namespace: give `namespaces` "
                             "or `namespaceSelector`")
        if self.cohort is not None and (self.quota is None or self.quota.gpus is None):
            raise FieldProblem(("cohort",),
                f"tenant {self.name!r}: a cohort shares quota.gpus, and this tenant has "
                "none: set quota.gpus (0 to only borrow)")
        if self.cohort is not None and self.quota_schedule is not None:
            # What a cohort lends and borrows is computed from each member's quota.gpus;
            # a window changing it is not part of that arithmetic.
            raise FieldProblem(("quotaSchedule",),
                f"tenant {self.name!r}: a tenant in a cohort cannot have a quotaSchedule: "
                "remove one of them")
        p = self.priority
        if (p is not None and p.default_class is not None and p.allowed_classes is not None
                and p.default_class not in p.allowed_classes):
            raise FieldProblem(("priority", "defaultClass"),
                f"tenant {self.name!r}: priority.defaultClass {p.default_class!r} is not in "
                f"priority.allowedClasses {p.allowed_classes}: add it there")
        if (
            self.default_product is not None
            and self.allowed_products is not None
            and self.default_product not in self.allowed_products
        ):
            raise FieldProblem(("defaultProduct",),
                f"defaultProduct {self.default_product!r} is not in allowedProducts "
                f"{self.allowed_products}: add it there or pick one of them"
            )
        return self


class RuleSettings(_Strict):
    mode: Mode
    """What the rule does when it finds a violation."""


class Exemptions(_Strict):
    """Requests the webhook passes untouched."""

    namespaces: list[str] = Field(default_factory=list, max_length=4096)
    users: list[str] = Field(default_factory=list, max_length=4096)
    groups: list[str] = Field(default_factory=list, max_length=4096)
    service_accounts: list[Annotated[str, Field(pattern=_SERVICE_ACCOUNT)]] = Field(
        default_factory=list, max_length=4096
    )
    """``namespace/name`` of service accounts."""


class QuotaLedger(_Strict):
    """How quota reservations are committed and what happens when that is impossible."""

    on_unavailable: Literal["deny", "allow"] = "deny"
    """A GPU pod whose reservation cannot be committed (API server unreachable, budget
    spent on conflicts): ``deny`` (fail closed) or ``allow`` (admit uncounted, warn)."""
    # Spelled as Kubernetes spells acronyms in field names (``podIP``, ``clusterIP``: all
    # letters of an acronym share one case), not as to_camel would (``reservationTtl...``).
    reservation_ttl_seconds: Annotated[int, Field(ge=5, le=3600,
                                                  alias="reservationTTLSeconds")] = 60
    """How long a reservation counts while its pod has not been seen; longer than the
    watch lag of every replica, short enough that a refused pod's GPUs come back soon."""


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


class Spec(_Strict):
    mode: Mode = Mode.ENFORCE
    """Mode of every rule that has no mode of its own or from its tenant."""
    rules: dict[Rule, RuleSettings] = Field(default_factory=dict)
    """Per-rule mode, by rule name; wins over tenant and policy modes."""
    gpu_resources: GPUResources = Field(default_factory=GPUResources)
    """Which extended resources are GPUs and what each is worth."""
    device_classes: dict[
        Annotated[str, Field(pattern=_QUALIFIED, max_length=253)], DeviceClass
    ] = Field(default_factory=_default_device_classes, max_length=256)
    """DeviceClasses whose devices are GPUs (DRA), by name; default: NVIDIA's
    ``gpu.nvidia.com`` and ``mig.nvidia.com``."""
    products: Products = Field(default_factory=Products)
    """GPU products and how a pod asks for one."""
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [
            Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
        ],
        max_length=64,
    )
    """Added to every GPU pod that does not already tolerate them."""
    non_gpu_pods_tolerating_gpu_taints: TolerationPolicy = TolerationPolicy.ALLOW
    """A pod that requests no GPU but tolerates a GPU taint: ``strip`` the tolerations,
    ``deny`` the pod, or ``allow`` it."""
    unassigned_namespaces: Literal["deny", "allow"] = "deny"
    """GPU pods in a namespace that belongs to no tenant: ``deny`` (rule tenant-required)
    or ``allow`` (no tenant rules apply; tolerations are still added)."""
    exemptions: Exemptions = Field(default_factory=Exemptions)
    """Requests the webhook passes untouched."""
    quota_ledger: QuotaLedger = Field(default_factory=QuotaLedger)
    """How quota reservations are committed across replicas."""
    workload_kinds: list[WorkloadKind] = Field(default_factory=list, max_length=256)
    """Other workload kinds to check at apply (the training kinds are built in)."""
    tenants: list[Tenant] = Field(default_factory=list, max_length=4096)
    """The teams, their namespaces and limits."""
    spot: SpotCapacity | None = None
    """Spot (preemptible) GPU nodes: which they are, and which pods may land there."""
    gpu_routes: GPURoutes = Field(default_factory=GPURoutes)
    """Routes to a GPU that skip the GPU request (the NVIDIA runtime's variable,
    privilege, device mounts, ``nodeName``, device-taint tolerations): closed by default
    in tenants' namespaces; each tenant may choose otherwise (``tenants[].gpuRoutes``)."""
    priority: PriorityLimits = Field(default_factory=PriorityLimits)
    """The PriorityClass ceiling of tenants' pods (``ceiling`` only; classes and defaults
    are per tenant)."""
    resources_per_gpu: ResourcesPerGPU | None = None
    """The most CPU and memory per GPU for every tenant's GPU pods, per product (a
    tenant's ``resourcesPerGpu`` wins; rule resources-per-gpu)."""
    gpu_capabilities: GPUCapabilities | None = None
    """How a pod asks for GPUs by what they can do (memory, compute capability) instead
    of by product, and the node labels and DRA attributes that say it (rule
    gpu-capability)."""

    @model_validator(mode="after")
    def _priority_is_a_ceiling(self) -> Spec:
        if self.priority.allowed_classes is not None or self.priority.default_class:
            field_name = ("allowedClasses" if self.priority.allowed_classes is not None
                          else "defaultClass")
            raise FieldProblem(("priority", field_name),
                f"spec.priority.{field_name} is a tenant's: move it to "
                f"tenants[].priority.{field_name}")
        return self

    @model_validator(mode="after")
    def _spot_declared(self) -> Spec:
        if self.spot is not None:
            label, _, spot_tolerations = self.spot.resolved()
            spot_keys = {label} | {str(t["key"]) for t in spot_tolerations if t.get("key")}
            for i, tol in enumerate(self.tolerations):
                if tol.key in spot_keys:
                    # Every GPU pod gets these; spot's are for some pods only.
                    raise FieldProblem(("tolerations", i, "key"),
                        f"toleration key {tol.key!r} is a spot key (spec.spot): GPU pods not "
                        "allowed on spot would get it and lose it again; move it to "
                        "spec.spot.tolerations")
        for i, t in enumerate(self.tenants):
            if t.spot is not None and self.spot is None:
                raise FieldProblem(("tenants", i, "spot"),
                    f"tenant {t.name}: spot settings need spec.spot, which says which "
                    "nodes are spot capacity (e.g. `spot: {provider: karpenter}`)")
        return self

    @field_validator("rules", mode="before")
    @classmethod
    def _known_rule(cls, value: object) -> object:
        if isinstance(value, dict):
            known = {r.value for r in Rule}
            for key in value:
                if key not in known:
                    raise FieldProblem((key,),
                        f"unknown rule {key!r}; the rules are: {', '.join(sorted(known))}"
                    )
        return value

    @model_validator(mode="after")
    def _hami_tenants_exist(self) -> Spec:
        hami = self.gpu_resources.hami
        names = {t.name for t in self.tenants}
        for i, name in enumerate(hami.tenants or () if hami is not None else ()):
            if name not in names:
                raise FieldProblem(("gpuResources", "hami", "tenants", i),
                    f"tenant {name!r} is not defined in spec.tenants")
        return self

    @model_validator(mode="after")
    def _per_gpu_products(self) -> Spec:
        for p in self.resources_per_gpu.products if self.resources_per_gpu else {}:
            if p not in self.products.aliases:
                raise FieldProblem(("resourcesPerGpu", "products", p),
                    f"product {p!r} is not defined; add it under spec.products.aliases "
                    f"(defined: {', '.join(sorted(self.products.aliases)) or 'none'})")
        return self

    @model_validator(mode="after")
    def _workload_kinds_unique(self) -> Spec:
        seen: set[tuple[str, str]] = set()
        for i, w in enumerate(self.workload_kinds):
            key = (w.group, w.kind)
            if key in BUILT_IN_KINDS:
                raise FieldProblem(("workloadKinds", i, "kind"),
                    f"{w.kind}.{w.group} is built in: remove it from workloadKinds")
            if key in seen:
                raise FieldProblem(("workloadKinds", i, "kind"),
                    f"{w.kind}.{w.group} is configured twice: keep one entry")
            seen.add(key)
        return self

    @model_validator(mode="after")
    def _cross_references(self) -> Spec:
        names: set[str] = set()
        owner: dict[str, str] = {}
        for i, t in enumerate(self.tenants):
            here: tuple[str | int, ...] = ("tenants", i)
            if t.name in names:
                raise FieldProblem((*here, "name"), f"tenant name {t.name!r} is used twice")
            names.add(t.name)
            for k, ns in enumerate(t.namespaces):
                if ns in owner:
                    raise FieldProblem(
                        (*here, "namespaces", k),
                        f"namespace {ns!r} already belongs to tenant {owner[ns]!r}; "
                        "a namespace has one tenant")
                owner[ns] = t.name
            self._tenant_references(here, t)
        return self

    def _tenant_references(self, here: tuple[str | int, ...], t: Tenant) -> None:
        """What one tenant names exists: its device classes, its products, the namespaces
        of its per-namespace quota; and a per-product quota has a product for every pod."""
        aliases = self.products.aliases
        for k, cls in enumerate(t.allowed_device_classes or []):
            if cls not in self.device_classes:
                raise FieldProblem(
                    (*here, "allowedDeviceClasses", k),
                    f"tenant {t.name}: device class {cls!r} is not a GPU class; add it "
                    f"under spec.deviceClasses (defined: "
                    f"{', '.join(sorted(self.device_classes)) or 'none'})")
        for loc, p in _named_products(t):
            if p not in aliases:
                raise FieldProblem(
                    (*here, *loc),
                    f"tenant {t.name}: product {p!r} is not defined; add it under "
                    f"spec.products.aliases (defined: {', '.join(sorted(aliases)) or 'none'})")
        for ns in t.quota.namespaces if t.quota else {}:
            if t.namespace_selector is None and ns not in t.namespaces:
                raise FieldProblem(
                    (*here, "quota", "namespaces", ns),
                    f"tenant {t.name}: quota for namespace {ns!r}, which is not one of "
                    "the tenant's namespaces")
        if (
            t.quota
            and t.quota.products
            and t.default_product is None
            and len(t.allowed_products or aliases) > 1
        ):
            raise FieldProblem(
                (*here, "quota", "products"),
                f"tenant {t.name}: per-product quota needs every GPU pod pinned to one "
                "product: set defaultProduct for pods that do not ask for one")


def _named_products(t: Tenant) -> list[tuple[tuple[str | int, ...], str]]:
    """Every place a tenant names a product, with the field that names it."""
    products: list[tuple[tuple[str | int, ...], str]] = [
        (("allowedProducts", k), p) for k, p in enumerate(t.allowed_products or [])]
    if t.default_product:
        products.append((("defaultProduct",), t.default_product))
    if t.quota:
        products.extend((("quota", "products", p), p) for p in t.quota.products)
        for ns, limits in t.quota.namespaces.items():
            products.extend((("quota", "namespaces", ns, "products", p), p)
                            for p in limits.products)
    if t.resources_per_gpu:
        products.extend((("resourcesPerGpu", "products", p), p)
                        for p in t.resources_per_gpu.products)
    for i, w in enumerate(t.quota_schedule.windows if t.quota_schedule else ()):
        products.extend((("quotaSchedule", "windows", i, "quota", "products", p), p)
                        for p in w.quota.products)
    return products


class GPUPolicy(_Strict):
    """The whole policy file."""

    api_version: Literal["gpu-webhook.dev/v1alpha1"]
    kind: Literal["GPUPolicy"]
    metadata: Metadata
    spec: Spec = Field(default_factory=Spec)


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """Compile a resource-name pattern where ``*`` matches any run of characters."""
    return re.compile("^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "$")
