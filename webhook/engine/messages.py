"""Every developer-facing sentence the engine produces, in one place.

A denial reads resource -> rule -> reason -> how to fix, and ends with the rule and
tenant in brackets so a platform engineer can find the policy line. Golden files in
``tests/golden/`` pin the wording: a change here shows up as a diff there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def num(x: float) -> str:
    """A count as people write it: 2 not 2.0, 0.125 kept."""
    if x == int(x):
        return str(int(x))
    return f"{x:.3f}".rstrip("0").rstrip(".")


def one_of(items: Iterable[str]) -> str:
    items = list(items)
    return ", ".join(items) if items else "none"


def tag(rule: str, policy: str, tenant: str | None) -> str:
    return f"[rule {rule}, tenant {tenant}]" if tenant else f"[rule {rule}, policy {policy}]"


def no_tenant(namespace: str, policy: str, unread_selectors: Sequence[str] = ()) -> str:
    if unread_selectors:
        # Without the namespace's labels a tenant chosen by them cannot match: "belongs to
        # no tenant" would be false, and "ask to be added" the wrong fix.
        return (
            f'namespace "{namespace}" is in no tenant\'s namespaces, and the webhook does '
            "not know its labels, so the tenants chosen by namespace labels "
            f"({one_of(unread_selectors)}) cannot match it: it may not run GPU pods until "
            "the webhook knows them. The webhook reads namespaces from the cluster: a "
            "namespace created just now is known within seconds, so retry; if this "
            "persists, the webhook has no access to the cluster's namespaces (ask the "
            "platform team). Offline, give gpu-webhook review --namespace-labels."
        )
    return (
        f'namespace "{namespace}" belongs to no GPU tenant, so it may not run GPU pods. '
        f"Ask the platform team to add it to a tenant in GPU policy {policy}, "
        "or remove the GPU request."
    )


def bad_quantity(resource: str, field: str, reason: str) -> str:
    return (
        f"{resource} {field} {reason}. GPUs are whole devices: ask for a whole number "
        f'of 1 or more, e.g. "1" (or remove it, or write 0, for no GPU).'
    )


def bad_kai_fraction(problem: str) -> str:
    return (f"KAI-Scheduler GPU share: {problem}. It is charged a whole GPU per device "
            "until it says a share the webhook can read.")


def bad_share(resource: str, reason: str) -> str:
    return (f"{resource} {reason}. It is a share of each GPU (MiB of memory, or percent): "
            f'ask for a whole number, e.g. "4096" or "25".')


def request_differs(resource: str, request: int, limit: int) -> str:
    return (
        f"{resource} request {request} differs from limit {limit}. GPU requests must equal "
        f"limits: set both to {limit}, or drop the request (it defaults to the limit)."
    )


def resource_not_allowed(resource: str, tenant: str, allowed: Iterable[str]) -> str:
    return (
        f"{resource} is not a GPU resource tenant {tenant} may use. "
        f"Use one of: {one_of(sorted(allowed))}."
    )


def unknown_product(asked: str, source: str, usable: Iterable[str]) -> str:
    return (
        f'asks for GPU product "{asked}" ({source}), which is not a product this cluster '
        f"defines. Ask for one of: {one_of(usable)}."
    )


def product_not_allowed(product: str, source: str, tenant: str, allowed: Iterable[str]) -> str:
    return (
        f'asks for GPU product "{product}" ({source}), which tenant {tenant} may not use. '
        f"Ask for one of: {one_of(allowed)}."
    )


def selector_short_name(label: str, short: str, value: str) -> str:
    return (
        f'has nodeSelector {label}: "{short}", the short name of a product; nodes carry the '
        f'full value, so no node matches it. Set it to "{value}".'
    )


def affinity_short_name(label: str, short: str, value: str) -> str:
    return (
        f'has a node affinity requirement {label} In ["{short}"], the short name of a '
        f'product; nodes carry the full value, so no node matches it. Use "{value}".'
    )


def products_disagree(asked: Iterable[str]) -> str:
    return (
        f"asks for several GPU products at once ({one_of(asked)}). "
        "Name one product in the label, annotation and nodeSelector."
    )


def placement_conflict(what: str, label: str, values: Iterable[str], tenant: str,
                       allowed: Iterable[str]) -> str:
    return (
        f"its {what} allows only {label} in [{one_of(values)}], but tenant {tenant}'s GPU pods "
        f"may run only on {label} in [{one_of(allowed)}]. Change or remove that "
        "requirement so it includes an allowed value."
    )


def devices(asked: Sequence[tuple[str, float, float]], gpus: float) -> str:
    """What a pod asked for, in the resources it named, then in GPU-equivalents when
    those differ: ``3 nvidia.com/mig-3g.40gb (3 x 0.5 = 1.5 GPUs)``; plain ``2 GPUs``
    for whole GPUs. ``asked``: (resource, count, weight). A developer who asked for
    three MIG slices does not recognise "1.5 GPUs" as their request until it is named."""
    asked = [(r, n, w) for r, n, w in asked if n]
    if not asked or (len(asked) == 1 and asked[0][2] == 1):
        return f"{num(gpus)} GPUs"
    named = " + ".join(f"{num(n)} {r}" for r, n, _ in asked)
    sums = " + ".join(f"{num(n)} x {num(w)}" for _, n, w in asked)
    return f"{named} ({sums} = {num(gpus)} {'GPU' if gpus == 1 else 'GPUs'})"


def within(asked: Sequence[tuple[str, float, float]], cap: float) -> str:
    """The most a cap of ``cap`` GPUs allows, in the resource the developer asked for
    when it is one resource counted at a weight (``2 nvidia.com/mig-3g.40gb (1 GPU)``:
    slices, not GPU-equivalents, are what they write); else ``cap`` as a number."""
    asked = [(r, n, w) for r, n, w in asked if n]
    if len(asked) == 1 and asked[0][2] not in (0, 1):
        r, _, w = asked[0]
        return f"{int(cap / w + 1e-9)} {r} ({_gpus(cap)})"
    return num(cap)


def per_container_max(asked: float, tenant: str, cap: float, what: str | None = None,
                      fewer: str | None = None) -> str:
    what = what or f"{num(asked)} GPUs"
    return (
        f"asks for {what}; tenant {tenant} allows at most {_gpus(cap)} per container. "
        f"Ask for {fewer or num(cap)} or fewer, or split the work across pods."
    )


def per_pod_max(asked: float, tenant: str, cap: float, what: str | None = None,
                fewer: str | None = None) -> str:
    what = what or f"{num(asked)} GPUs"
    return (
        f"asks for {what} in all (counted as Kubernetes does: app containers and "
        f"sidecars together, or the largest init container); tenant {tenant} allows at most "
        f"{_gpus(cap)} per pod. Ask for {fewer or num(cap)} or fewer, or split the work "
        "across pods."
    )


def unpinned(label: str, tenant: str, allowed: Iterable[str]) -> str:
    return (
        f"may be scheduled on any {label}, but tenant {tenant}'s GPU pods must be pinned to "
        f"[{one_of(allowed)}]. Add a required node affinity (the mutating webhook does this "
        "when it runs) or a nodeSelector with an allowed value."
    )


def asked_product_ruled_out(product: str, value: str, label: str) -> str:
    return (
        f"asks for GPU product {product}, but its required node affinity leaves no term "
        f"that admits {label}={value}: it could never run on {product}. Change the node "
        "affinity to allow it, or drop the product request."
    )


def one_product_needed(label: str, values: list[str] | None, tenant: str,
                       capped: Iterable[str]) -> str:
    where = f"{label} in [{one_of(values)}]" if values else f"any {label}"
    return (
        f"may be scheduled on {where}, but tenant {tenant}'s quota counts GPUs per product "
        f"([{one_of(capped)}]), so each of its GPU pods must be pinned to exactly one. "
        f"Keep one value of {label} in the pod's node affinity, or set a nodeSelector on "
        "it (the mutating webhook pins the tenant's default when it runs)."
    )


def tolerates_gpu_taint(keys: Iterable[str]) -> str:
    return (
        f"requests no GPU but tolerates the GPU nodes' taint ({one_of(keys)}), which would let "
        "it take a GPU node's CPU and memory. Remove the toleration, or request a GPU."
    )


def malformed(pointer: str, expected: str) -> str:
    return f"the object is malformed: {pointer} must be {expected}."


def owners(top: Iterable[tuple[str, float]]) -> str:
    return ", ".join(f"{o} {num(n)}" for o, n in top)


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
                   asked_as: str | None = None, others: int = 0) -> str:
    """``exceeded quota: tenant team-a would use 10 of its 8 GPUs (product a100): 6 in use
    (...), this pod asks 4. 2 are free now; h100 has 4 free (set label ...).``
    ``others``: the other caps the pod exceeds, of which this one binds."""
    free = max(cap - used, 0)
    held = f"{num(used)} in use" + (f" ({owners(top)})" if top and used else "")
    fits = (f"{num(free)} {'is' if free == 1 else 'are'} free now" if free
            else "none is free now")
    alt = f"; {'; '.join(alternatives)}" if alternatives else ""
    hint = (f" Ask for {num(free)} or fewer, wait for running pods to finish, or ask the "
            "platform team for more quota." if free else
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


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


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
            "counted against its quota. Retry in a moment; if it persists, tell the "
            "platform team (the webhook's quota setting fails closed).")


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


# --- Dynamic Resource Allocation -------------------------------------------------------


def device_class_not_allowed(cls: str, tenant: str, allowed: Iterable[str]) -> str:
    return (f"asks for devices of class {cls}; tenant {tenant} may use GPU device classes "
            f"[{one_of(allowed)}]. Use one of those in deviceClassName.")


def admin_access(cls: str) -> str:
    return (f"asks for {cls} devices with adminAccess, which gives access to devices in use "
            "by other pods. Only the platform's exempt namespaces may do that: drop "
            "adminAccess.")


def fake_extended_resource_claim(annotation: str) -> str:
    return (f"carries the annotation {annotation}, which only the scheduler may set (it marks "
            "a claim made for a plain nvidia.com/gpu request, which is not counted again). "
            "Remove the annotation.")


def claim_per_pod_max(asked: float, tenant: str, cap: float) -> str:
    return (f"asks for {num(asked)} GPUs in all; tenant {tenant} allows at most {_gpus(cap)} "
            f"per pod, and every pod using this claim would hold them. Ask for {num(cap)} or "
            "fewer devices.")


def claim_unpinned(attribute: str, tenant: str, allowed: Iterable[str]) -> str:
    return (f"may be allocated a GPU of any product, but tenant {tenant}'s GPUs must be "
            f"[{one_of(allowed)}]. Add a selector on {attribute} (the mutating webhook adds "
            "it when it runs).")


def template_unknown(name: str, why: str | None = None) -> str:
    """``why``: "absent" when the API server was asked and has no such template, the
    reason its read failed, or None when it was not asked (offline: the manifests
    given)."""
    if why == "absent":
        return (f"uses ResourceClaimTemplate {name}, which does not exist in its namespace "
                "(the webhook asked the API server), so the GPUs it asks for cannot be "
                "counted. Create the template first, or fix its name in "
                "spec.resourceClaims.")
    if why is not None:
        return (f"uses ResourceClaimTemplate {name}, which the webhook has not seen yet and "
                f"could not read from the API server ({why}), so the GPUs it asks for "
                "cannot be counted. Retry in a moment; if it persists, tell the platform "
                "team.")
    return (f"uses ResourceClaimTemplate {name}, which the webhook has not seen, so the GPUs "
            "it asks for cannot be counted. Wait a few seconds and retry if the template was "
            "just created (the webhook learns of it a moment later); otherwise create it "
            "first.")
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
                   unreserved: bool, kind: str = "", others: int = 0) -> str:
    free = max(cap - used, 0.0)
    if gang_pods is not None:
        now = (f"its gang of {_pods(gang_pods)} needs {num(gang_total)} {what} and cannot "
               "start until quota frees up")
    else:
        now = "its pods beyond that will be refused until quota frees up"
    tail = (" No GPUs are reserved for it: its pods will compete with other pods as they "
            "are created." if unreserved else "")
    if kind:
        tail += f" {events_on(kind)}"
    return (f"asks for {breakdown} = {num(asked)} {what}, but only {num(free)} of "
            f"{scope}'s {num(cap)} {what}{tightest(others)} are free now ({num(used)} in "
            f"use): {now}.{tail}")


def role_pod_never_fits(scope: str, what: str, role: str, per_pod: float, cap: float,
                        others: int = 0) -> str:
    return (f"{role} asks for {num(per_pod)} {what} per pod, but {scope}'s quota is "
            f"{num(cap)} {what}: its pod can never run. Ask for {num(cap)} or fewer"
            f"{tightest(others)}.")


# --- spot capacity (rule spot-placement) ------------------------------------------------

def spot_how_to_say(label: str | None, annotation: str | None,
                    classes: Iterable[str]) -> str:
    """How a pod says it is fault tolerant, as the policy lets it."""
    ways = [f'label {label}: "true"'] if label else []
    if annotation:
        ways.append(f'annotation {annotation}: "true"')
    classes = sorted(classes)
    if classes:
        ways.append(f"priorityClassName {' or '.join(classes)}")
    return " or ".join(ways) if ways else "its tenant's spot defaults"


def spot_unclear(where: str, value: object) -> str:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return (f"has {where}: {shown}, which says neither yes nor no to spot capacity. "
            'Set it to "true" (the pod survives losing its node) or "false", or remove it.')


def spot_not_fault_tolerant(how: str) -> str:
    return (f"the pod is not fault tolerant (only fault-tolerant pods may use spot "
            f"capacity; a pod that survives losing its node says so with {how})")


def spot_tenant_never(tenant: str | None) -> str:
    if tenant is None:
        return "GPU pods of no tenant may not use spot capacity"
    return f"tenant {tenant} may not use spot capacity"


def spot_asked(source: str, label: str, values: Iterable[str], why: str) -> str:
    return (
        f"asks for spot nodes ({source} {label} in [{one_of(values)}]), but {why}. Drop "
        "that requirement: spot nodes can be reclaimed at any time."
    )


def spot_tolerated(keys: Iterable[str], why: str) -> str:
    return (
        f"tolerates the spot nodes' taint ({one_of(keys)}), but {why}. Remove the "
        "toleration: spot nodes can be reclaimed at any time."
    )


def spot_unguarded(label: str, values: Iterable[str], why: str) -> str:
    return (
        f"may be scheduled on spot nodes ({label} in [{one_of(values)}]), but {why}. Add a "
        f"required node affinity {label} NotIn [{one_of(values)}] (the mutating webhook "
        "does this when it runs)."
    )


def spot_only(tenant: str | None, said: str) -> str:
    who = f"tenant {tenant} runs its GPU pods" if tenant else "GPU pods of no tenant run"
    return (
        f"says it is not fault tolerant ({said}), but {who} on "
        "spot capacity only, which can be reclaimed at any time. Drop that label or "
        "annotation (and make the work survive losing its node), or run it in another "
        "tenant's namespace."
    )


def spot_ruled_out(source: str, label: str, values: Iterable[str], tenant: str) -> str:
    return (
        f"its {source} rules out spot nodes ({label} in [{one_of(values)}]), but tenant "
        f"{tenant} runs its GPU pods on spot capacity only. Change or remove that "
        "requirement."
    )


def spot_unpinned(label: str, values: Iterable[str], tenant: str) -> str:
    return (
        f"may be scheduled on nodes other than spot ones, but tenant {tenant} runs its GPU "
        f"pods on spot capacity only. Add a required node affinity {label} In "
        f"[{one_of(values)}] (the mutating webhook does this when it runs)."
    )
# --- borrowing in a cohort (webhook.quota.borrow) ---------------------------------------


def _gpus(n: float) -> str:
    return f"{num(n)} GPU" if n == 1 else f"{num(n)} GPUs"


def borrowed(tenant: str, cohort: str, asked: float, used: float, cap: float,
             priority_class: str) -> str:
    """The warning on a pod admitted on GPUs its tenant borrows from its cohort."""
    return (f"this pod runs on {_gpus(asked)} borrowed from cohort {cohort}: tenant "
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
    return (f"{EXCEEDED_QUOTA}: tenant {tenant} would borrow {_gpus(asked)} from cohort "
            f"{cohort} for this pod, but {why}. Wait for running pods to finish, ask for "
            f"fewer, or ask the platform team for more quota.")


def not_borrowed(cohort: str, asked: float, free: float, bound: str, left: float,
                 limit: float | None) -> str:
    """Said with a cohort tenant's pod refused on its own quota."""
    if asked <= free + 1e-9:  # the cohort had room by the time the pod was committed
        return (f"cohort {cohort} has {_gpus(free)} idle to lend now: create the pod "
                f"again and it runs on borrowed GPUs (preemptible).")
    why = _BOUNDS[bound].format(limit=num(limit) if limit is not None else "?",
                                left=num(max(left, 0)))
    return f"it cannot borrow {_gpus(asked)} from cohort {cohort} either: {why}."


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


def job_pod_in_line(asked: float, tenant: str) -> str:
    """A Job's pod in a waiting tenant: it goes through the line whether or not it fits."""
    return (
        f"this pod of a Job ({num(asked)} GPUs) starts through tenant {tenant}'s quota "
        "line: the webhook releases the Job's pods together, behind the scheduling gate "
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


def released_event(seconds: float) -> str:
    return (f"GPU quota free: charged and released to the scheduler after waiting "
            f"{seconds:.0f}s")


def gate_removed_by_other(gate: str, user: str) -> str:
    return (
        f"only the GPU webhook removes the scheduling gate {gate} ({user or 'this user'} "
        "may not): it charges the pod's GPUs to its tenant's quota first, when they are "
        "free. Leave the gate; delete the pod to take it out of the line."
    )


# --------------------------------------------------------------- how GPUs are held


def duration(seconds: int) -> str:
    """``28800`` -> ``8h``, ``90`` -> ``1m30s``, ``172800`` -> ``2d``."""
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(out) or "0s"


def runtime_cap(seconds: int, kind: str | None) -> str:
    """The value of the pod's max-runtime annotation: when its GPUs are taken back."""
    of = f", kind {kind}" if kind else ""
    return (f"{duration(seconds)} ({seconds}s{of}): the kubelet ends the pod and frees its "
            f"GPUs {duration(seconds)} after it starts")


def _whose(kind: str | None) -> str:
    return f"pods of kind {kind}" if kind else "GPU pods"


def runtime_longer(field: str, asked: int, seconds: int, kind: str | None, tenant: str,
                   shortened: bool) -> str:
    head = (f"{field} {asked} ({duration(asked)}) is longer than the {duration(seconds)} "
            f"({seconds}s) that {_whose(kind)} of tenant {tenant} may hold their GPUs")
    if shortened:
        return (f"{head}, so it was shortened to {seconds}: the kubelet ends the pod and "
                f"frees its GPUs {duration(seconds)} after it starts. Set {field} to "
                f"{seconds} or less (or leave it out) to keep the deadline you ask for.")
    return (f"{head}. Set {field} to {seconds} or less (or leave it out to be given "
            f"{seconds}); the GPUs are taken back that long after the start.")


def runtime_missing(field: str, seconds: int, kind: str | None, tenant: str) -> str:
    return (f"has no {field}, and {_whose(kind)} of tenant {tenant} may hold their GPUs at "
            f"most {duration(seconds)} ({seconds}s). Set {field} to {seconds} or less.")


def per_gpu(gpus: float, what: str, asked: str, cap: str, most: str, tenant: str,
            product: str | None) -> str:
    """``1 GPU with 64 CPUs: at most 16 CPUs per GPU in tenant research, ...``"""
    unit, noun = ("CPUs", "CPU") if what == "cpu" else ("of memory", "memory")
    per = f"per {product} GPU" if product else "per GPU"
    return (f"{num(gpus)} GPU{'' if gpus == 1 else 's'} with {asked} {unit}: at most "
            f"{cap} {unit} {per} in tenant {tenant}, so at most {most} {unit} for this pod. Ask "
            f"for less {noun}, or for more GPUs if the work needs them (a pod that holds "
            "a node's CPUs or memory strands the GPUs it leaves).")


def queue_unrouted(wrong: str) -> str:
    return (f"is not sent where its tenant's GPU pods go ({wrong}). Set them, or create "
            "it again through the webhook, which sets them.")


def capability_unreadable(source: str, value: object, example: str) -> str:
    return (f'asks by {source} for GPUs by what they can do, but "{value}" is not '
            f"readable. Use e.g. {example}.")


def capability_unpinned(what: str) -> str:
    return (f"asks for GPUs with {what}, but its node affinity does not keep it to such "
            "GPUs. Add the requirement to every nodeSelectorTerm, or create it again "
            "through the webhook, which adds it.")
