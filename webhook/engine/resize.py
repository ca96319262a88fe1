"""In-place resize of a running pod (``pods/resize``, GA in 1.35).

A resize changes the CPU and memory of a pod's containers (and, where the API server
allows it, its pod-level resources) while the pod runs. The API server refuses any other
change through this subresource, GPU counts included, so what a resize can break is the
tenant's CPU and memory per GPU (``resourcesPerGpu``, rule resources-per-gpu): the new
resources are held to the same caps as a pod's creation. Quota counts GPUs, which a
resize cannot change, so it is not asked. The webhook configuration sends only resizes
of GPU pods: any other resize is never sent.
"""

from __future__ import annotations

from webhook.engine import holding
from webhook.engine.charge import pod_cost
from webhook.engine.decision import Checker, Decision, malformed, subject_of
from webhook.engine.target import NamespaceLabels, read_targets
from webhook.k8s.objects import MalformedObject
from webhook.k8s.review import AdmissionRequest
from webhook.k8s.workloads import read_workload
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule

SUBRESOURCE = "resize"
OWNED = frozenset({Rule.RESOURCES_PER_GPU})


def is_resize(req: AdmissionRequest) -> bool:
    return req.kind == "Pod" and req.group == "" and req.sub_resource == SUBRESOURCE


def resize(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels
           ) -> Decision:
    """The resized pod's CPU and memory per GPU against its tenant's caps."""
    obj = req.object
    if req.operation != "UPDATE" or obj is None:
        return Decision.skip("operation")
    if policy.is_exempt(req.namespace, req.username, req.groups):
        return Decision.skip("exempt")
    subject = subject_of("Pod", req.namespace, obj, req.name)
    try:
        workload = read_workload("", "Pod", obj)
        if workload is None:
            return Decision.skip("kind")
        target = read_targets(workload, req.namespace, obj, req.name, policy,
                              labels).roles[0].target
        tenant = target.tenant
        if not target.has_gpu or tenant is None or tenant.ratios is None:
            return Decision.skip("operation", tenant.name if tenant else None)
        # The pod was admitted: what its creation was checked for is not asked again,
        # only its GPUs and their product are read.
        cost = pod_cost(Checker(policy, tenant, subject, frozenset()), policy, target)
        check = Checker(policy, tenant, subject, OWNED)
        holding.ratios(check, target, cost, resized=True)
    except MalformedObject as exc:
        return malformed(subject, exc)
    return check.decide()
