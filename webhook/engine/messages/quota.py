"""Messages of quota (rule quota): caps exceeded (tenant, namespace, user, window), the
words controllers key on, gangs that never fit or do not fit now, the quota step
unavailable, names taken, scaling unchecked."""

from __future__ import annotations

import math

from webhook.engine.messages.words import FAILS_CLOSED, PERSISTS, _pods, num, owners

# The words the API server's own ResourceQuota denial starts with ("exceeded quota:
# compute, requested: ..."). Controllers key on them: Argo Workflows retries a pod
# creation refused as Forbidden only when the message contains "exceeded quota"
# (argoproj/argo-workflows util/errors/errors.go, isExceededQuotaErr:
# apierr.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota")), and treats
# any other Forbidden as final, failing the workflow step. Our denials are code 403.
EXCEEDED_QUOTA = "exceeded quota"


def alternative(product: str, free: float, label: str | None, annotation: str | None,
                node_label: str, node_value: str) -> str:
    """``a100 has 22 free (set label gpu.example.com/product: a100)``: another product
    with room, and how to ask for it, so the hint can be acted on without the policy
    file. Without a request label or annotation in the policy, a nodeSelector asks."""
    how = (f"label {label}: {product}" if label else
           f"annotation {annotation}: {product}" if annotation else
           f'nodeSelector {node_label}: "{node_value}"')
    return f"{product} has {num(free)} free (set {how})"


def quota_exceeded(scope: str, what: str, used: float, asked: float, cap: float,
                   top: list[tuple[str, float]], asker: str, alternatives: list[str],
                   asked_as: str | None = None, others: int = 0,
                   unit: tuple[str, float] | None = None) -> str:
    """``exceeded quota: tenant team-a would use 10 of its 8 GPUs (product a100): 6 in use
    (...), this pod asks 4. 2 are free now; h100 has 4 free (set label ...).``
    ``others``: the other caps the pod exceeds, of which this one binds. ``unit``: the
    one resource the pod asks and its GPU-equivalents each, so that what to ask for is
    said in whole devices (1.875 GPUs free is 1 GPU to ask for, or 3 half-GPU slices)."""
    free = max(cap - used, 0)
    held = f"{num(used)} in use" + (f" ({owners(top)})" if top and used else "")
    fits = (f"{num(free)} {'is' if free == 1 else 'are'} free now" if free
            else "none is free now")
    alt = f"; {'; '.join(alternatives)}" if alternatives else ""
    ask = num(free)
    if unit is not None:
        resource, weight = unit
        whole = math.floor(free / weight + 1e-9) if weight > 0 else 0
        ask = (num(whole) if weight == 1 else f"{num(whole)} {resource}") if whole else ""
    hint = (f" Ask for {ask} or fewer, wait for running pods to finish, or ask the "
            "platform team for more quota." if free and ask else
            " Wait for running pods to finish, free some up, or ask the platform team for "
            "more quota.")
    return (f"{EXCEEDED_QUOTA}: {scope} would use {num(used + asked)} of its {num(cap)} "
            f"{what}{tightest(others)}: {held}, {asker} {asked_as or num(asked)}. "
            f"{fits[0].upper() + fits[1:]}{alt}.{hint}")


def user_quota_exceeded(user: str, tenant: str, what: str, used: float, asked: float,
                        cap: float, top: list[tuple[str, float]], asker: str,
                        others: int = 0) -> str:
    """``exceeded quota: user alice holds 4 of their 4 GPUs in tenant research (...), and
    this pod asks 1 more.`` A user's cap (tenants[].userQuota): the pods of workloads
    they created and the bare pods they created themselves."""
    free = max(cap - used, 0)
    held = f" ({owners(top)})" if top and used else ""
    fits = (f"{num(free)} {'is' if free == 1 else 'are'} free for them now" if free
            else "None is free for them now")
    hint = (f" Ask for {num(free)} or fewer, wait for their running pods to finish, or ask "
            "the platform team for more quota." if free else
            " Wait for their running pods to finish, free some up, or ask the platform "
            "team for more quota.")
    return (f"{EXCEEDED_QUOTA}: user {user} holds {num(used)} of their {num(cap)} {what} "
            f"in tenant {tenant}{tightest(others)}{held}, and {asker} "
            f"{num(asked)} more. {fits}.{hint}")


def user_not_recorded(said: str | None, user: str) -> str:
    """A pod created by a user that does not carry their name (the mutating webhook was
    skipped): its GPUs would be counted for someone else."""
    says = f"says it is {said}'s" if said else "records no user"
    return (f"{says} (annotation gpu-webhook.dev/requested-by), but {user} creates it: "
            "GPUs are charged to the user who creates a pod. Remove the annotation and "
            "create the pod again; the webhook records the creator itself.")


def in_window(what: str, window: str) -> str:
    """``GPUs in window working-hours``: a cap a quota window gives now."""
    return f"{what} in window {window}" if window else what


PODS = "GPU pods"  # what a pod-count cap counts (quota.check's Line.what)
SPOT_GPUS = "spot GPUs"  # what a tenant's spot cap counts (tenants[].spot.gpus)
SHARED_GPUS = "shared GPUs"  # what quota.sharedGpus counts: shares of devices


def most_pods(cap: float, per_pod: float) -> int:
    """How many pods of this size a cap holds."""
    return int(cap // per_pod) if per_pod else 0


def tightest(others: int) -> str:
    # Several caps broken at once would each give their own "at most N": only the
    # smallest answers the question, so it is the one given, said to be the tightest.
    return f" (the tightest of the {others + 1} caps it exceeds)" if others else ""


def events_on(kind: str) -> str:
    """Where a controller's refused pod creations show up: the developer is not there
    to read a denial when the controller creates the pods later."""
    where = {"deployment": "its ReplicaSet", "job": "the Job", "cronjob": "its Jobs"}.get(
        kind.lower(), f"the {kind.lower()} (or the Job or ReplicaSet that creates them)")
    return (f"A refused pod is not shown at kubectl apply: it shows up as an event on "
            f"{where} (kubectl get events).")


def gang_never_fits(scope: str, what: str, pods: int, per_pod: float, cap: float,
                    others: int = 0) -> str:
    return (f"asks for {_pods(pods)} x {num(per_pod)} = {num(pods * per_pod)} {what} at once, "
            f"but {scope}'s quota is {num(cap)} {what}: it can never run in full. "
            + (f"Run at most {_pods(most_pods(cap, per_pod))}{tightest(others)}."
               if what == PODS else
               f"Run at most {_pods(most_pods(cap, per_pod))} of this size"
               f"{tightest(others)}, or fewer {what} per pod."))


def gang_not_free(scope: str, what: str, pods: int, per_pod: float, free: float,
                  cap: float, kind: str = "", others: int = 0) -> str:
    now = most_pods(free, per_pod)
    tail = f" {events_on(kind)}" if kind else ""
    return (f"asks for {_pods(pods)} x {num(per_pod)} {what}, but only {num(free)} of "
            f"{scope}'s {num(cap)} {what} are free now: {now} of its pods can start now"
            f"{tightest(others)} and the rest will be refused until quota frees up.{tail}")


def quota_unavailable(reason: str) -> str:
    return (f"the GPU quota ledger cannot be reached ({reason}), so this GPU pod cannot be "
            f"counted against its quota. {PERSISTS} {FAILS_CLOSED}.")


def quota_not_decided(reason: str) -> str:
    return (f"GPU quota is decided by one webhook replica, and none decides it now: {reason}."
            " This GPU pod cannot be counted against its quota until one does, so it is "
            f"refused (controllers create it again). {PERSISTS} {FAILS_CLOSED}.")


def name_taken(name: str) -> str:
    namespace, _, pod = name.partition("/")
    return (f"a pod named {pod!r} already exists in namespace {namespace!r}, so this one "
            "cannot be created and is not counted against GPU quota. Delete that pod first "
            f"(kubectl delete pod {pod} -n {namespace}) or choose another name.")


def gang_unreserved(reason: str) -> str:
    return (f"no GPUs are reserved for its gang: the GPU quota ledger cannot be reached "
            f"({reason}). Its pods will compete with other pods as they are created, "
            "each counted against quota then.")


def scale_unchecked(kind: str, reason: str) -> str:
    return (f"not checked against GPU quota: the webhook could not read the {kind.lower()} "
            f"to see its pod template ({reason}). Its pods are still checked one by one "
            "when they are created; a pod refused then shows as an event "
            "(kubectl get events).")
