"""What the validating engine hands the quota step: a closed union of small frozen
records, one per kind of thing quota counts, built by keyword.

The engine decides every rule but quota (quota needs the usage store, which the engine
never touches) and returns a :class:`Validation`: that decision and, when the object is
otherwise allowed and its tenant has a quota, a :data:`QuotaStep` saying what to check
and, for a real creation, what to reserve atomically:

- :class:`PodQuota`: a Pod, or the pods of a workload of one template (a Deployment's
  replicas x its pod); a pod creation that is not a dry run carries its
  :class:`Reservation`; a pod marked borrowed is checked against its cohort's room;
- :class:`GangQuota`: a workload with roles (a training job), checked whole; the CREATE of
  a kind that reserves its gang carries a :class:`GangReservation`;
- :class:`ClaimQuota`: a ResourceClaim, not a pod (it counts under no pod cap), charged
  once however many pods share it.

The admission pipeline (:mod:`webhook.admission.quota`) runs the step, one case per
record, with no field left unset behind an assertion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from webhook.engine.cost import Ask, Charge
from webhook.engine.decision import Decision
from webhook.engine.gang import GangAsk
from webhook.policy.tenantrules import CohortRules, TenantRules


@dataclass(frozen=True, slots=True, kw_only=True)
class Reservation:
    """A creation's quota, to be reserved atomically under ``key`` (its uid)."""

    key: str
    charge: Charge
    gangs: tuple[str, ...] = ()  # the gangs the pod may belong to (its owners, labels)
    # "namespace/name": a retry of the same create is one charge, and a create that
    # fails because the name is taken holds nothing (see quota.ledger).
    name: str | None = None
    # The PodGroup the pod joins (the core gang API, ``webhook.k8s.podgroups``): the
    # pipeline reads its gang size and, at its first pod, checks and reserves it whole.
    group: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GangReservation:
    """A gang workload's CREATE: the reservation of its whole gang when it fits now."""

    key: str  # the workload's uid
    owner: str  # "jobset/llm-pretrain", who holds the reserved GPUs
    ids: tuple[str, ...]  # what its pods find it by (uid, the controller's label)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodQuota:
    """A Pod, or the pods of a workload of one unnamed template."""

    tenant: TenantRules
    subject: str
    ask: Ask
    reservation: Reservation | None = None  # a real pod creation; None: check only
    # A pod marked as running on GPUs borrowed from its tenant's cohort: that cohort.
    borrowing: CohortRules | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GangQuota:
    """A workload with roles, asked of quota as one gang."""

    tenant: TenantRules
    subject: str
    gang: GangAsk
    reservation: GangReservation | None = None  # None: a dry run, an update: check only


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimQuota:
    """A ResourceClaim: its devices, charged once to the tenant of its namespace."""

    tenant: TenantRules
    subject: str
    ask: Ask
    reservation: Reservation | None = None  # a real creation; None: check only


QuotaStep = PodQuota | GangQuota | ClaimQuota

# What a pod creation asks of its tenant's quota, as the validating webhook will count it
# (None: nothing, or not a pod's ask), asked by the mutating webhook's forecasts
# (borrowing, waiting) and computed once per review by the pipeline.
PodAsk = Callable[[], "PodQuota | None"]


@dataclass(frozen=True, slots=True)
class Validation:
    """The validating engine's result: every rule but quota, and what quota must do."""

    decision: Decision
    quota: QuotaStep | None = None
