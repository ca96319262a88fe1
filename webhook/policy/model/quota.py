"""What a tenant may hold: its quota (per tenant and per namespace), per-user caps, and
caps that change with the clock (quota windows in a time zone)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from webhook.policy.model.core import (
    _DNS_LABEL,
    _SERVICE_ACCOUNT,
    FieldProblem,
    _Strict,
    iana_zone,
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
        return iana_zone(value)

    @model_validator(mode="after")
    def _names_unique(self) -> QuotaSchedule:
        seen: set[str] = set()
        for i, w in enumerate(self.windows):
            if w.name in seen:
                raise FieldProblem(("windows", i, "name"),
                                   f"window name {w.name!r} is used twice")
            seen.add(w.name)
        return self
