"""Per-user caps within a tenant, compiled: what each user may hold, and whose word
on a pod's recorded user is trusted.

Pods are made by controllers, so the user behind a pod is gone by the time the pod is
admitted. The mutating webhook records the requesting user (the review's
``userInfo.username``) on a workload at its CREATE and on its pod templates, in the
annotation :data:`~webhook.policy.model.USER_ANNOTATION`; a pod's recorded user is
believed only when the pod's creator is a controller: the kube-controller-manager (or
one of its kube-system service accounts), or a service account the policy names. A
pod anyone else creates is charged to its creator, whatever it carries.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.policy.model import UserQuota

CONTROLLER_MANAGER = "system:kube-controller-manager"
# The controllers of the kube-controller-manager run as kube-system service accounts
# (``--use-service-account-credentials``): deployment-controller, job-controller, ...
KUBE_SYSTEM_ACCOUNTS = "system:serviceaccount:kube-system:"


@dataclass(frozen=True, slots=True)
class UserLimits:
    """``tenants[].userQuota`` in the engine's terms (None = no cap)."""

    gpus: float | None
    pods: int | None
    controllers: frozenset[str]  # usernames of the service accounts the policy names

    def trusts(self, username: str) -> bool:
        """Whether ``username`` creates pods from templates whose user it keeps."""
        return (username == CONTROLLER_MANAGER or username.startswith(KUBE_SYSTEM_ACCOUNTS)
                or username in self.controllers)

    def over(self, q: UserQuota | None) -> UserLimits:
        """These limits with the fields ``q`` sets (a quota window's) replacing them."""
        if q is None:
            return self
        given = q.model_fields_set
        return UserLimits(q.gpus if "gpus" in given else self.gpus,
                          q.pods if "pods" in given else self.pods,
                          self.controllers | _accounts(q.controllers))


def _accounts(names: list[str]) -> frozenset[str]:
    return frozenset("system:serviceaccount:" + sa.replace("/", ":", 1) for sa in names)


def compile_users(q: UserQuota | None) -> UserLimits | None:
    if q is None:
        return None
    return UserLimits(q.gpus, q.pods, _accounts(q.controllers))
