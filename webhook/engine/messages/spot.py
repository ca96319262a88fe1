"""Messages of spot capacity (rule spot-placement)."""

from __future__ import annotations

from collections.abc import Iterable

from webhook.engine.messages.words import MUTATOR_DOES, RECLAIMED, one_of

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
        f"that requirement: {RECLAIMED}."
    )


def spot_tolerated(keys: Iterable[str], why: str) -> str:
    return (
        f"tolerates the spot nodes' taint ({one_of(keys)}), but {why}. Remove the "
        f"toleration: {RECLAIMED}."
    )


def spot_unguarded(label: str, values: Iterable[str], why: str) -> str:
    return (
        f"may be scheduled on spot nodes ({label} in [{one_of(values)}]), but {why}. Add a "
        f"required node affinity {label} NotIn [{one_of(values)}] {MUTATOR_DOES}."
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
        f"[{one_of(values)}] {MUTATOR_DOES}."
    )
