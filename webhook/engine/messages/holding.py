"""Messages of how GPUs are held: runtime caps, CPU and memory per GPU, queue routing,
GPU capabilities."""

from __future__ import annotations

from webhook.engine.messages.words import num

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


def per_gpu_resized(gpus: float, what: str, asked: str, cap: str, most: str, tenant: str,
                    product: str | None) -> str:
    """``cannot be resized to 64 CPUs: its 1 GPU allows at most 16 CPUs per GPU ...``"""
    unit, noun = ("CPUs", "CPU") if what == "cpu" else ("of memory", "memory")
    per = f"per {product} GPU" if product else "per GPU"
    return (f"cannot be resized to {asked} {unit}: its {num(gpus)} "
            f"GPU{'' if gpus == 1 else 's'} allow{'s' if gpus == 1 else ''} at most {cap} "
            f"{unit} {per} in tenant {tenant}, so at most {most} {unit}. Resize to {most} "
            f"{unit} or less; a running pod's GPUs cannot be resized, so work that needs "
            f"more {noun} needs a new pod with more GPUs.")


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
