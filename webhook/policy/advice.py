"""What a policy that loads may still do that its author did not mean: said by
``gpu-webhook policy check`` and ``review`` as warnings (the policy is served as it is).

- A tenant with ``userQuota`` and no ``userQuota.controllers``: the pods a training
  operator creates (Kubeflow, Volcano, JobSet, LeaderWorkerSet, KubeRay, ...) are made by
  the operator's service account, which is trusted to carry the workload's user only when
  listed there (kube-system's controllers always are). Unlisted, every such pod is charged
  to the operator's account, so all users' training pods share one user's cap.
"""

from __future__ import annotations

from webhook.policy.model import GPUPolicy


def advice(policy: GPUPolicy) -> list[str]:
    """One sentence per finding, naming the tenant and the field to set."""
    out = []
    for t in policy.spec.tenants:
        users = t.user_quota
        if users is not None and not users.controllers:
            out.append(
                f"tenant {t.name}: userQuota caps each user, but userQuota.controllers names "
                "no training operator: the pods an operator creates from a workload "
                "(Kubeflow, Volcano, JobSet, LeaderWorkerSet, KubeRay) are charged to the "
                "operator's service account, all users' together, not to the user who "
                "created the workload. List each operator's service account there "
                "(namespace/name, e.g. kubeflow/training-operator); the Job, Deployment "
                "and StatefulSet controllers of kube-system are trusted already.")
    return out
