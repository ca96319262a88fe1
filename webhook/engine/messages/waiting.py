"""Messages of pods waiting for quota (tenants[].overQuota: wait): the gate, the line,
the events."""

from __future__ import annotations

from webhook.engine.messages.words import num

# --- waiting for quota (tenants[].overQuota: wait) -----------------------------------


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def waits_for_quota(asked: float, what: str, free: float, cap: float, scope: str) -> str:
    """The warning (and the pod's annotation) when a pod is admitted to wait."""
    return (
        f"this pod waits for GPU quota: it asks {num(asked)} {what} and {scope} has "
        f"{num(free)} of its {num(cap)} free. It is created now behind the scheduling gate "
        "gpu-webhook.dev/quota, holds no GPU while it waits, and starts when its GPUs are "
        "free (in order of priority, then arrival; kubectl describe pod shows its place)."
    )


def waits_to_borrow(asked: float, tenant: str, cap: float, cohort: str,
                    priority_class: str) -> str:
    """The warning (and annotation) on a pod only borrowed GPUs can ever hold, admitted
    to wait for them."""
    return (
        f"this pod waits for GPUs to borrow from cohort {cohort}: it asks {num(asked)} "
        f"GPUs, more than tenant {tenant}'s own quota of {num(cap)} can ever hold. It is "
        "created now behind the scheduling gate gpu-webhook.dev/quota, holds no GPU while "
        "it waits, and starts on GPUs the cohort's other tenants leave idle, at "
        f"PriorityClass {priority_class} (label gpu-webhook.dev/borrowed=true): it may be "
        "preempted when they need them back."
    )


def waiting_borrow_event(asked: float, free: float, place: int, tenant: str,
                         cohort: str) -> str:
    """The event on a pod waiting for GPUs to borrow: what its cohort can lend now."""
    return (f"waiting to borrow GPUs from cohort {cohort}: {num(asked)} GPUs asked, "
            f"{num(free)} to lend; {ordinal(place)} in line in tenant {tenant}")


def gang_pod_in_line(asked: float, tenant: str, of: str = "a Job") -> str:
    """A gang's pod in a waiting tenant (``of``: "a Job", "pytorchjob.kubeflow.org/train"):
    it goes through the line whether or not it fits."""
    whose = "the Job's pods" if of == "a Job" else "its gang's pods"
    return (
        f"this pod of {of} ({num(asked)} GPUs) starts through tenant {tenant}'s quota "
        f"line: the webhook releases {whose} together, behind the scheduling gate "
        "gpu-webhook.dev/quota, once all of them fit (within seconds when they do now)."
    )


def waiting_event(asked: float, free: float, place: int, tenant: str) -> str:
    """The event on a waiting pod: the numbers and its place in its tenant's line."""
    return (f"waiting for GPU quota: {num(asked)} GPUs asked, {num(free)} free; "
            f"{ordinal(place)} in line in tenant {tenant}")


def waiting_gang_event(asked: float, free: float, place: int, tenant: str, present: int,
                       size: int) -> str:
    """A waiting pod of a gang: the gang's numbers, and how many of its pods exist."""
    have = "" if present >= size else f"; {present} of its {size} pods created"
    return (f"waiting for GPU quota: gang of {size} pods, {num(asked)} GPUs asked, "
            f"{num(free)} free; {ordinal(place)} in line in tenant {tenant}{have}")


def never_fits_event(why: str) -> str:
    """A waiting pod its quota could not hold even with nothing else running (the quota
    was cut after it was created): it is passed over, and told what to do."""
    return (f"can never be released under the quota now: {why} Delete it and create it "
            "asking for less, or ask the platform team for the quota back; the pods "
            "behind it in line are released without it.")


def released_event(seconds: float) -> str:
    return (f"GPU quota free: charged and released to the scheduler after waiting "
            f"{seconds:.0f}s")


def gate_removed_by_other(gate: str, user: str) -> str:
    return (
        f"only the GPU webhook removes the scheduling gate {gate} ({user or 'this user'} "
        "may not): it charges the pod's GPUs to its tenant's quota first, when they are "
        "free. Leave the gate; delete the pod to take it out of the line."
    )
