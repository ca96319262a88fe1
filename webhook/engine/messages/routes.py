"""Messages of the routes to a GPU that skip the GPU request (engine.routes,
docs/security.md): NVIDIA_VISIBLE_DEVICES, privilege, device paths, nodeName,
PriorityClasses, device-taint tolerations, and what a running pod holds."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from webhook.engine.messages.words import one_of

# --- routes to a GPU that skip the GPU request (engine.routes, docs/security.md) --------

def visible_devices_uncharged(what: str) -> str:
    return (
        f"sets NVIDIA_VISIBLE_DEVICES ({what}) but is given no GPU: NVIDIA's container "
        "runtime would hand it the GPUs the variable names, uncounted by quota. Remove the "
        "variable, or ask for GPUs (resources.limits, e.g. nvidia.com/gpu: 1, or a DRA "
        "claim), which makes them visible to it."
    )


def visible_devices_charged(what: str) -> str:
    return (
        f"sets NVIDIA_VISIBLE_DEVICES ({what}) itself: its value would replace the one the "
        "device plugin gives for the GPUs it asks for, and could show it other GPUs. "
        "Remove the variable: the GPUs it asks for are made visible to it."
    )


def visible_devices_voided(what: str) -> str:
    return (
        f"set NVIDIA_VISIBLE_DEVICES ({what}) but is given no GPU: it is now \"void\", so "
        "NVIDIA's container runtime shows it no GPU. Ask for GPUs (resources.limits, e.g. "
        "nvidia.com/gpu: 1, or a DRA claim) if it needs them."
    )


def visible_devices_removed(what: str) -> str:
    return (
        f"set NVIDIA_VISIBLE_DEVICES ({what}) itself: the entry is removed, so it sees the "
        "GPUs it asks for, as the device plugin sets the variable for them."
    )


def privileged(how: str, reach: str) -> str:
    return (
        f"is privileged ({how}) in a pod that can run on a GPU node ({reach}): it would "
        "see every GPU of its node, uncounted by quota. Remove it, and ask for the GPUs "
        "it needs in resources.limits (or run it in a namespace the platform team exempts)."
    )


def device_host_path(volume: str, path: str, reach: str) -> str:
    return (
        f'mounts the node\'s {path} (hostPath volume "{volume}") in a pod that can run on '
        f"a GPU node ({reach}): the node's GPU devices are there, uncounted by quota. "
        "Remove the volume, and ask for the GPUs it needs in resources.limits."
    )


def node_name(node: str, gpu_node: bool) -> str:
    known = (f'node "{node}" carries GPUs' if gpu_node else
             f'node "{node}" is not one the webhook knows to be without GPUs')
    return (
        f'sets spec.nodeName "{node}", which skips the scheduler, so the taints that keep '
        f"pods off GPU nodes do not apply (the kubelet checks only NoExecute taints); "
        f"{known}. Remove spec.nodeName and choose the node by nodeSelector "
        f"(kubernetes.io/hostname: {node}), which the scheduler checks; ask for GPUs in "
        "resources.limits if it needs them."
    )


def priority_class_not_allowed(cls: str, tenant: str, allowed: Iterable[str]) -> str:
    return (
        f'names PriorityClass "{cls}", which tenant {tenant} may not use (a higher '
        "priority lets the scheduler preempt other tenants' pods). "
        f"Use one of: {one_of(allowed)}, or name none."
    )


def priority_above_ceiling(cls: str | None, value: int, ceiling: int, tenant: str,
                           allowed: Sequence[str] | None) -> str:
    named = f'PriorityClass "{cls}"' if cls else "the cluster's default PriorityClass"
    fix = f"one of: {one_of(allowed)}" if allowed else f"a class of value {ceiling} or less"
    return (
        f"runs at {named} (priority {value}), above tenant {tenant}'s ceiling of "
        f"{ceiling}: the scheduler would let it preempt other tenants' pods of lower "
        f"priority, GPUs in their quota included. Use {fix}."
    )


def device_taint_tolerated(toleration: str) -> str:
    return (
        f"tolerates device taints ({toleration}): NVIDIA's DRA driver taints GPUs it finds "
        "unhealthy, and a claim that tolerates the taints may be given, or keep, a GPU the "
        "platform marked broken. Remove the tolerations; a claim that must reach a tainted "
        "device belongs in a namespace the platform team exempts."
    )


def holds_visible_devices(where: str, what: str, on: str, charged: bool) -> str:
    if charged:
        return (f"{where} sets NVIDIA_VISIBLE_DEVICES ({what}) itself {on}, over the "
                "device plugin's value: it may see GPUs it did not ask for. Remove the "
                "variable and create the pod again.")
    return (f"{where} is given no GPU but may see GPUs {on} through NVIDIA_VISIBLE_DEVICES "
            f"({what}), uncounted by quota. Create the pod again: the webhook now sets "
            "the variable to void.")


def holds_privileged(where: str, how: str, on: str) -> str:
    return (f"{where} is privileged ({how}) {on}: it sees every GPU of the node, uncounted "
            "by quota. Remove the privilege and ask for the GPUs it needs.")


def holds_host_path(volume: str, path: str, on: str) -> str:
    return (f'hostPath volume "{volume}" mounts the node\'s {path} {on}: its GPU devices '
            "are there, uncounted by quota. Remove the volume and ask for the GPUs it needs.")
