"""What a training workload asks of quota: each role's pods and what one of them costs,
and the gang, the pods that must start together.

A Deployment's one template is asked as an :class:`~webhook.engine.charge.Ask`
(replicas x one pod); a workload with named roles (a Volcano Job's tasks, a JobSet's
replicated jobs, ...) as a :class:`GangAsk`, which the quota arithmetic
(``webhook.quota.check.check_gang``) sums over the roles for each cap.

Which pods make up the gang when it is smaller than the workload: each role's own
minimum first (a Volcano task's ``minAvailable``), then the remaining pods in the
order the roles are written, up to the gang minimum. The same choice is checked
against the caps and, when it fits now, reserved (``webhook.quota.gang``).
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.engine.cost import Cost
from webhook.k8s.identity import ObjectId
from webhook.k8s.workloads import POD_LABELS


@dataclass(frozen=True, slots=True)
class RoleAsk:
    """One role of a workload: its pods and what one costs."""

    name: str
    cost: Cost
    pods: int  # pods of this role at once
    pods_added: int  # pods this request adds (an UPDATE that grows a role)
    minimum: int | None  # pods of this role the gang needs first


@dataclass(frozen=True, slots=True)
class GangAsk:
    """What admitting a workload with roles would add to its tenant's usage."""

    tenant: str
    namespace: str
    kind: str
    noun: str  # "volcano job", for messages
    role_word: str  # "task", for messages
    roles: tuple[RoleAsk, ...]  # the roles with GPUs
    gang: int | None  # pods that must start together; None: no gang
    sequential: bool = False  # pods run one at a time (Argo steps): checked per pod
    user: str | None = None  # whose pods they are (tenants[].userQuota); None: no one's

    def members(self) -> list[int]:
        """Pods of each role in the gang (every pod when there is no gang)."""
        if self.gang is None:
            return [r.pods for r in self.roles]
        left = self.gang
        out = []
        for r in self.roles:
            n = min(r.minimum if r.minimum is not None else 0, r.pods, left)
            out.append(n)
            left -= n
        for i, r in enumerate(self.roles):
            more = min(r.pods - out[i], left)
            out[i] += more
            left -= more
        return out

    @property
    def pods(self) -> int:
        return sum(r.pods for r in self.roles)

    def role_label(self, r: RoleAsk) -> str:
        return f"{self.role_word} {r.name}" if self.role_word else r.name


_LABEL_KEYS = frozenset(POD_LABELS.values())


def workload_ids(group: str, kind: str, namespace: str, name: str, uid: str) -> tuple[str, ...]:
    """What a gang is found by: its uid, and the label its pods carry (if its kind has
    one)."""
    label = POD_LABELS.get((group, kind))
    return (uid, f"{namespace}/{label}={name}") if label else (uid,)


def pod_ids(pod: ObjectId) -> tuple[str, ...]:
    """The gangs a pod may belong to: its owners' uids and the workload labels it has."""
    out = [ref.uid for ref in pod.owners if ref.uid]
    out.extend(f"{pod.namespace}/{k}={v}" for k, v in pod.labels.items() if k in _LABEL_KEYS)
    uid = pod.labels.get("jobset.sigs.k8s.io/jobset-uid")
    if uid is not None:
        out.append(uid)
    return tuple(out)
