"""A pod on borrowed GPUs: how it is marked, and the account it is charged to.

A tenant of a cohort (``tenants[].cohort``) whose own quota is full may run a pod on GPUs
the rest of its cohort leaves idle. The mutating webhook marks such a pod: the label
``gpu-webhook.dev/borrowed: "true"`` and the cohort's borrowed PriorityClass. The
PriorityClass is written three times over, as ``priorityClassName``, ``priority`` and
``preemptionPolicy``: the API server's Priority admission plugin resolves the class
before the mutating webhooks run and checks afterwards (in its validation phase) that
the pod's integer priority and preemption policy are the class's, refusing the pod
("the integer value of priority (0) must not be provided in pod spec; priority admission
controller computed -100 from the given PriorityClass name") when only the name changed.

A marked pod is charged to its tenant's *borrowed account* (:func:`account`), apart from
its own use, by admission and by the cluster cache alike (``webhook.engine.charge``): so
the tenant's own quota checks never see it, and the cohort's arithmetic
(``webhook.quota.cohort``) sees what is borrowed.
"""

from __future__ import annotations

from typing import Any

from webhook.k8s.identity import ObjectId
from webhook.k8s.objects import child_map
from webhook.k8s.patch import Patch
from webhook.policy.model import BorrowedPriority
from webhook.policy.tenantrules import TenantRules

BORROWED_LABEL = "gpu-webhook.dev/borrowed"
ACCOUNT_SUFFIX = "/borrowed"  # a tenant name is a DNS label: it never contains "/"


def account(tenant: str) -> str:
    """The usage key a tenant's borrowed pods are charged under (apart from its own)."""
    return tenant + ACCOUNT_SUFFIX


def borrower_of(key: str) -> str | None:
    """The tenant whose borrowed account ``key`` is, or None for a tenant's own key."""
    return key[: -len(ACCOUNT_SUFFIX)] if key.endswith(ACCOUNT_SUFFIX) else None


def is_marked(obj: dict[str, Any]) -> bool:
    """Whether a pod carries the borrowed label (value "true")."""
    return ObjectId.of(obj).labels.get(BORROWED_LABEL) == "true"


def charged_to(tenant: TenantRules, obj: dict[str, Any]) -> str:
    """The account a pod of ``tenant`` is charged to: its borrowed account when it is
    marked and the tenant is in a cohort, else the tenant's own."""
    if tenant.cohort is not None and is_marked(obj):
        return account(tenant.name)
    return tenant.name


def mark(pod: dict[str, Any], priority: BorrowedPriority, patch: Patch) -> bool:
    """Mark a pod as running on borrowed GPUs (label and PriorityClass), recording the
    patch; only what differs is written, so marking a marked pod changes nothing."""
    n_ops = len(patch.ops)
    meta = child_map(pod, "metadata", "")
    labels = child_map(meta, "labels", "/metadata") if meta is not None else None
    if labels is None or labels.get(BORROWED_LABEL) != "true":
        patch.put(pod, "", ("metadata", "labels", BORROWED_LABEL), "true")
    spec = child_map(pod, "spec", "")
    if spec is not None:
        for key, value in (("priorityClassName", priority.name),
                           ("priority", priority.value),
                           ("preemptionPolicy", priority.preemption_policy)):
            if spec.get(key) != value:
                patch.set(spec, key, "/spec", value)
    return len(patch.ops) > n_ops


def priority_mismatch(pod: dict[str, Any], priority: BorrowedPriority) -> str | None:
    """What of a marked pod's priority is not the borrowed class's (another mutating
    webhook changed it after this one), or None when it is the class's."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    for key, value in (("priorityClassName", priority.name), ("priority", priority.value),
                       ("preemptionPolicy", priority.preemption_policy)):
        if spec.get(key) != value:
            return f"spec.{key} is {spec.get(key)!r}, not {value!r}"
    return None
