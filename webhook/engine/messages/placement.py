"""Messages of a pod's GPU requests and where they send it: the tenant, quantities and
shares, allowed resources and products, product pinning, per-container and per-pod
caps, tolerations of GPU taints, a malformed object."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from webhook.engine.messages.words import MUTATOR_DOES, gpus_of, num, one_of


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
        return f"{int(cap / w + 1e-9)} {r} ({gpus_of(cap)})"
    return num(cap)


def per_container_max(asked: float, tenant: str, cap: float, what: str | None = None,
                      fewer: str | None = None) -> str:
    what = what or f"{num(asked)} GPUs"
    return (
        f"asks for {what}; tenant {tenant} allows at most {gpus_of(cap)} per container. "
        f"Ask for {fewer or num(cap)} or fewer, or split the work across pods."
    )


def per_pod_max(asked: float, tenant: str, cap: float, what: str | None = None,
                fewer: str | None = None) -> str:
    what = what or f"{num(asked)} GPUs"
    return (
        f"asks for {what} in all (counted as Kubernetes does: app containers and "
        f"sidecars together, or the largest init container); tenant {tenant} allows at most "
        f"{gpus_of(cap)} per pod. Ask for {fewer or num(cap)} or fewer, or split the work "
        "across pods."
    )


def unpinned(label: str, tenant: str, allowed: Iterable[str]) -> str:
    return (
        f"may be scheduled on any {label}, but tenant {tenant}'s GPU pods must be pinned to "
        f"[{one_of(allowed)}]. Add a required node affinity {MUTATOR_DOES} or a nodeSelector "
        "with an allowed value."
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
