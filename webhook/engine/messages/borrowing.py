"""Messages of borrowing in a cohort (webhook.quota.borrow)."""

from __future__ import annotations

from webhook.engine.messages.quota import EXCEEDED_QUOTA, most_pods, tightest
from webhook.engine.messages.words import _pods, gpus_of, num

# --- borrowing in a cohort (webhook.quota.borrow) ---------------------------------------


def borrowed(tenant: str, cohort: str, asked: float, used: float, cap: float,
             priority_class: str) -> str:
    """The warning on a pod admitted on GPUs its tenant borrows from its cohort."""
    return (f"this pod runs on {gpus_of(asked)} borrowed from cohort {cohort}: tenant "
            f"{tenant}'s own quota has {num(max(cap - used, 0))} of its {num(cap)} GPUs "
            f"free. It runs at PriorityClass {priority_class} (label "
            f"gpu-webhook.dev/borrowed=true) and may be preempted when the tenants that "
            f"lent the GPUs need them back.")


_BOUNDS = {
    "borrowingLimit": "its borrowing limit of {limit} GPUs has {left} left",
    "lenders": "the other tenants of the cohort have {left} idle GPUs to lend it",
    "cohort": "the cohort has {left} idle GPUs left to lend",
}


def borrow_refused(tenant: str, cohort: str, asked: float, bound: str, left: float,
                   limit: float | None) -> str:
    """A pod marked as borrowed for which the cohort has no room."""
    why = _BOUNDS[bound].format(limit=num(limit) if limit is not None else "?",
                                left=num(max(left, 0)))
    return (f"{EXCEEDED_QUOTA}: tenant {tenant} would borrow {gpus_of(asked)} from cohort "
            f"{cohort} for this pod, but {why}. Wait for running pods to finish, ask for "
            f"fewer, or ask the platform team for more quota.")


def not_borrowed(cohort: str, asked: float, free: float, bound: str, left: float,
                 limit: float | None) -> str:
    """Said with a cohort tenant's pod refused on its own quota."""
    if asked <= free + 1e-9:  # the cohort had room by the time the pod was committed
        return (f"cohort {cohort} has {gpus_of(free)} idle to lend now: create the pod "
                f"again and it runs on borrowed GPUs (preemptible).")
    why = _BOUNDS[bound].format(limit=num(limit) if limit is not None else "?",
                                left=num(max(left, 0)))
    return f"it cannot borrow {gpus_of(asked)} from cohort {cohort} either: {why}."


def borrowed_priority_changed(priority_class: str, problem: str) -> str:
    """A marked pod whose priority is not the borrowed class's."""
    return (f"a pod on borrowed GPUs (label gpu-webhook.dev/borrowed=true) must run at "
            f"PriorityClass {priority_class}, so that the tenants that lent the GPUs can "
            f"take them back: {problem}. Remove the label (the pod then uses its tenant's "
            f"own quota), or leave the pod's priority to the webhook.")


def gang_borrows(scope: str, pods: int, per_pod: float, cap: float, cohort: str) -> str:
    """A workload larger than its tenant's own GPUs that borrowing could cover."""
    own = most_pods(cap, per_pod)
    return (f"asks for {_pods(pods)} x {num(per_pod)} = {num(pods * per_pod)} GPUs at once, "
            f"more than {scope}'s own {num(cap)}: pods beyond {own} run only on GPUs "
            f"borrowed from cohort {cohort} while it has them idle, and may be preempted.")


def gang_never_fits_borrowing(scope: str, pods: int, per_pod: float, cap: float,
                              extra: float, cohort: str, others: int = 0) -> str:
    """A workload larger than its tenant's own GPUs and all it could ever borrow."""
    total = cap + extra
    return (f"asks for {_pods(pods)} x {num(per_pod)} = {num(pods * per_pod)} GPUs at once, "
            f"but {scope}'s own {num(cap)} GPUs and the {num(extra)} it may ever borrow "
            f"from cohort {cohort} are {num(total)}: it can never run in full. Run at most "
            f"{_pods(most_pods(total, per_pod))} of this size{tightest(others)}, or fewer "
            f"GPUs per pod.")
