"""The policy model's common ground: the API version and kind, the name patterns every
section checks against, the rule names and modes, the cross-field error that names its
field, the strict base every model derives from, and the policy's metadata."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

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

# A PriorityClass name: a DNS subdomain (``kubectl create priorityclass`` checks the same).
_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


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


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """Compile a resource-name pattern where ``*`` matches any run of characters."""
    return re.compile("^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "$")


def iana_zone(value: str) -> str:
    """``value`` if it names an IANA time zone; a ValueError that says what one is."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"time zone {value!r} is not an IANA time zone (e.g. "
                         "Europe/Berlin, America/New_York, UTC)") from None
    return value
