"""Messages of workloads with roles (training jobs): a gang of roles against quota."""

from __future__ import annotations

from collections.abc import Iterable

from webhook.engine.messages.quota import events_on, most_pods, tightest
from webhook.engine.messages.words import _pods, num

# --- workloads with roles (training jobs) ------------------------------------------------


def parts(items: Iterable[tuple[str, int, float]]) -> str:
    """``task worker 3 x 2 + task ps 1 x 1``: each role's pods x per-pod amount."""
    return " + ".join(f"{label} {n} x {num(per)}" for label, n, per in items)


def roles_never_fit(scope: str, what: str, breakdown: str, total: float, pods: int,
                    cap: float, gang: bool, others: int = 0) -> str:
    if gang:
        return (f"its gang of {_pods(pods)} must start together, and its GPU pods "
                f"({breakdown}) need {num(total)} {what} at once, but {scope}'s quota is "
                f"{num(cap)} {what}{tightest(others)}: it can never start. Make the gang "
                f"need at most {num(cap)} {what} (fewer pods, or fewer per pod), or "
                "ask the platform "
                "team for more quota.")
    return (f"asks for {_pods(pods)} at once, {breakdown} = {num(total)} {what}, but "
            f"{scope}'s quota is {num(cap)} {what}{tightest(others)}: it can never run in "
            f"full. Ask for at most {num(cap)} {what} (fewer pods, or fewer per pod).")


def roles_exceed_quota(scope: str, what: str, breakdown: str, total: float, pods: int,
                       cap: float, gang_pods: int, gang_total: float, others: int = 0
                       ) -> str:
    return (f"asks for {_pods(pods)} in all, {breakdown} = {num(total)} {what}, but "
            f"{scope}'s quota is {num(cap)} {what}{tightest(others)}: its gang of "
            f"{_pods(gang_pods)} "
            f"({num(gang_total)} {what}) can start, but never all of its pods at once.")


def roles_not_free(scope: str, what: str, breakdown: str, asked: float, used: float,
                   cap: float, gang_pods: int | None, gang_total: float,
                   unreserved: bool, kind: str = "", others: int = 0,
                   waits: bool = False) -> str:
    free = max(cap - used, 0.0)
    if gang_pods is not None:
        now = (f"its gang of {_pods(gang_pods)} needs {num(gang_total)} {what} and cannot "
               "start until quota frees up")
    else:
        now = "its pods beyond that will be refused until quota frees up"
    tail = (" No GPUs are reserved for it: its pods will compete with other pods as they "
            "are created." if unreserved else "")
    if unreserved and waits:  # tenants[].overQuota: wait
        tail = (" Its pods wait behind the scheduling gate gpu-webhook.dev/quota, holding "
                "no GPU, and start together once the whole gang fits (kubectl describe pod "
                "shows their place in line).")
    elif kind:
        tail += f" {events_on(kind)}"
    return (f"asks for {breakdown} = {num(asked)} {what}, but only {num(free)} of "
            f"{scope}'s {num(cap)} {what}{tightest(others)} are free now ({num(used)} in "
            f"use): {now}.{tail}")


def role_pod_never_fits(scope: str, what: str, role: str, per_pod: float, cap: float,
                        others: int = 0) -> str:
    return (f"{role} asks for {num(per_pod)} {what} per pod, but {scope}'s quota is "
            f"{num(cap)} {what}: its pod can never run. Ask for {num(cap)} or fewer"
            f"{tightest(others)}.")


# --- PodGroups of the core gang API (scheduling.k8s.io) -----------------------------------


def group_never_fits(group: str, scope: str, what: str, pods: int, per_pod: float,
                     cap: float, others: int = 0, composite: bool = False) -> str:
    """A PodGroup's gang (``group``: "PodGroup train", "CompositePodGroup llm") that no
    usage could hold, told at its first pod."""
    most = most_pods(cap, per_pod)
    fix = (f"Lower the minGroupCount of the CompositePodGroup or the minCount of its "
           f"PodGroups so that at most {most} pods start together"
           if composite else f"Lower the PodGroup's minCount to {most} or less")
    return (f"its {group} starts {_pods(pods)} together ({_rule(composite)}), {_pods(pods)} "
            f"x {num(per_pod)} {what} = {num(pods * per_pod)} {what} at once, but {scope}'s "
            f"quota is {num(cap)} {what}{tightest(others)}: the gang can never start, so "
            f"none of its pods is admitted. {fix} (or ask less per pod), or ask the "
            "platform team for more quota.")


def group_not_free(group: str, scope: str, what: str, pods: int, per_pod: float,
                   used: float, cap: float, others: int = 0, composite: bool = False) -> str:
    """A PodGroup's gang that does not fit what is free now, told at its first pod."""
    free = max(cap - used, 0.0)
    return (f"its {group} starts {_pods(pods)} together ({_rule(composite)}), {_pods(pods)} "
            f"x {num(per_pod)} {what} = {num(pods * per_pod)} {what} at once, but only "
            f"{num(free)} of {scope}'s {num(cap)} {what} are free now{tightest(others)}: "
            "none of its pods is admitted until the whole gang fits, so that no part of "
            "it holds GPUs the rest waits for. Retry once quota frees up (kubectl get "
            "gpuquota shows what is used).")


def _rule(composite: bool) -> str:
    return "minGroupCount x minCount" if composite else "minCount"


def group_unread(group: str, why: str) -> str:
    """The pod's PodGroup (or a CompositePodGroup above it) could not be read: the pod
    is counted alone."""
    return (f"its {group} could not be read ({why}), so its gang was not checked "
            "against the quota whole: this pod is counted alone, and the gang's other pods "
            "may be refused after some of it starts. Create the PodGroup before its pods.")
