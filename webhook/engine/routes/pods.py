"""A tenant's Pod at creation, every route to a GPU checked: ``NVIDIA_VISIBLE_DEVICES``
neutralized, ``spec.nodeName``, privilege and ``/dev`` mounts in a pod that can reach a
GPU node, and the PriorityClass (its tenant's default given). A workload's pod template
is checked only: its pods are changed when they are created."""

from __future__ import annotations

from webhook.engine import messages
from webhook.engine.decision import Checker
from webhook.engine.routes.containers import (
    charged_containers,
    describe,
    device_host_paths,
    report_privileged,
    visible_devices,
)
from webhook.engine.routes.priority import priority
from webhook.engine.routes.rules import applies
from webhook.engine.routes.sights import Sights
from webhook.engine.target import Target
from webhook.engine.tolerations import covers
from webhook.k8s.objects import child_list
from webhook.k8s.patch import Patch
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule

NODE_USER_PREFIX = "system:node:"  # the kubelet's own identity (mirror pods)


def pod(check: Checker, policy: CompiledPolicy, target: Target, patch: Patch | None,
        changes: list[str], sights: Sights, username: str) -> None:
    """A tenant's Pod at CREATE: every route checked, the variable neutralized, the
    default PriorityClass given (``patch`` None: checked only, nothing changed). A
    workload's pod template is checked only, for an answer at ``kubectl apply``: its pods
    are changed when they are created. Raises MalformedObject."""
    rules = applies(target)
    if rules is None:
        return
    assert target.tenant is not None
    if not target.template.is_pod:
        patch = None
    spec, sptr = target.template.spec, target.template.spec_pointer
    charged = charged_containers(target)
    if rules.visible_devices != "allow" and patch is not None:
        n = len(patch.ops)
        for key in ("initContainers", "containers"):
            for i, c in enumerate(child_list(spec, key, sptr) or []):
                if isinstance(c, dict):
                    visible_devices(check, rules, c, f"{sptr}/{key}/{i}",
                                    describe(key, c, i), f"{key}/{i}" in charged, patch)
        if len(patch.ops) > n:
            changes.append("gpu-visible-devices")
    node = spec.get("nodeName")
    if (rules.node_name and isinstance(node, str) and node
            and not username.startswith(NODE_USER_PREFIX)):
        has = sights.node_gpus(node)
        if has is not False:
            check.report(Rule.NODE_NAME, messages.node_name(node, has is True))
    reach = reaches_gpu_nodes(policy, target, sights)
    if reach is not None:
        containers = [(key, i, c) for key in ("initContainers", "containers")
                      for i, c in enumerate(child_list(spec, key, sptr) or [])
                      if isinstance(c, dict)]
        report_privileged(check, rules, containers, reach)
        if rules.device_host_paths:
            for name, path in device_host_paths(spec, sptr):
                check.report(Rule.DEVICE_HOST_PATHS, messages.device_host_path(
                    name, path, reach))
    if priority(check, target.tenant, spec, sptr, patch, sights):
        changes.append("priority-class-default")


def reaches_gpu_nodes(policy: CompiledPolicy, target: Target, sights: Sights) -> str | None:
    """Why the pod can run on a GPU node (for messages), or None when it cannot: it asks
    for GPUs or DRA devices, is bound to a node not known to be without GPUs, or tolerates
    the GPU nodes' taints (a key-less ``Exists`` tolerates them all)."""
    if target.has_gpu:
        return "it asks for GPUs"
    if target.claims:
        return "it names DRA claims"
    spec, sptr = target.template.spec, target.template.spec_pointer
    node = spec.get("nodeName")
    if isinstance(node, str) and node:
        has = sights.node_gpus(node)
        if has is False:
            return None
        return (f'its node "{node}" carries GPUs' if has else
                f'its node "{node}" is not known to be without GPUs')
    if not policy.tolerations:
        return "the policy names no GPU node taint, so any node may be a GPU node"
    for t in child_list(spec, "tolerations", sptr) or []:
        if not isinstance(t, dict):
            continue
        for w in policy.tolerations:
            if covers(t, w):
                return (f"it tolerates the GPU taint {w.get('key')}" if t.get("key")
                        else "it tolerates every taint")
    return None
