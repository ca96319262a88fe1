"""GPU requests in a pod spec, and the pod's effective request as Kubernetes computes it.

Kubernetes charges a pod (for scheduling and for ResourceQuota) with
``max(sum over app containers + restartable init "sidecars",
       max over plain init containers of (its request + sidecars started before it))``.
Quota and per-pod maximums here use the same arithmetic, so a pod is never charged
differently by this webhook and by the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from webhook.k8s.objects import MalformedObject, child_list, child_map
from webhook.k8s.quantity import is_zero

ContainerKind = Literal["container", "init", "sidecar"]


@dataclass(slots=True)
class ContainerGPUs:
    """One container's GPU resources as written in the spec (values not yet parsed)."""

    name: str
    kind: ContainerKind
    pointer: str  # JSON Pointer of the container
    container: dict[str, Any]
    requests: dict[str, Any] | None
    limits: dict[str, Any] | None
    names: list[str] = field(default_factory=list)  # GPU resource names present

    def describe(self) -> str:
        label = {"container": "container", "init": "init container",
                 "sidecar": "sidecar container"}[self.kind]
        return f'{label} "{self.name}"'


def gpu_containers(
    spec: Mapping[str, Any], spec_ptr: str, is_gpu: Callable[[str], bool]
) -> list[ContainerGPUs]:
    """Every init and app container, with the GPU resources each names (possibly none).

    Raises MalformedObject when containers/resources have the wrong JSON types.
    """
    out: list[ContainerGPUs] = []
    for key in ("initContainers", "containers"):
        containers = child_list(dict(spec), key, spec_ptr)
        if not containers:
            continue
        for i, c in enumerate(containers):
            ptr = f"{spec_ptr}/{key}/{i}"
            if not isinstance(c, dict):
                raise MalformedObject(ptr, "a container mapping")
            kind: ContainerKind = "container"
            if key == "initContainers":
                kind = "sidecar" if c.get("restartPolicy") == "Always" else "init"
            res = child_map(c, "resources", ptr)
            requests = child_map(res, "requests", ptr + "/resources") if res else None
            limits = child_map(res, "limits", ptr + "/resources") if res else None
            names: list[str] = []
            for m in (limits, requests):
                if m:
                    # A null or zero value asks for nothing: the resource counts when
                    # some value of it asks for devices (or is invalid, to be reported).
                    names.extend(k for k, v in m.items()
                                 if v is not None and k not in names and is_gpu(k)
                                 and not is_zero(v))
            name = c.get("name")
            out.append(ContainerGPUs(name if isinstance(name, str) else f"#{i}", kind, ptr, c,
                                     requests, limits, names))
    return out


def effective_request(per_container: Iterable[tuple[ContainerKind, Mapping[str, float]]]
                      ) -> dict[str, float]:
    """The pod-level request per resource from per-container amounts, in spec order
    (init containers first, in their order, then app containers)."""
    app: dict[str, float] = {}
    sidecars: dict[str, float] = {}
    init_peak: dict[str, float] = {}
    for kind, amounts in per_container:
        if kind == "container":
            _add(app, amounts)
        elif kind == "sidecar":
            _add(sidecars, amounts)
        else:
            # A plain init container runs alone with the sidecars started before it.
            for r, v in amounts.items():
                init_peak[r] = max(init_peak.get(r, 0), v + sidecars.get(r, 0))
            for r, v in sidecars.items():
                if r not in amounts:
                    init_peak[r] = max(init_peak.get(r, 0), v)
    steady = dict(app)
    _add(steady, sidecars)
    out = dict(steady)
    for r, v in init_peak.items():
        out[r] = max(out.get(r, 0), v)
    return {r: v for r, v in out.items() if v}


def _add(into: dict[str, float], amounts: Mapping[str, float]) -> None:
    for r, v in amounts.items():
        into[r] = into.get(r, 0) + v


# What ``spec.resources`` (pod-level resources, KEP-2837: beta and on by default since
# 1.34) may set that the product reads; hugepages are the others it allows.
POD_LEVEL = ("cpu", "memory")


def pod_level(spec: Mapping[str, Any], spec_ptr: str
              ) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The pod-level requests and limits of ``spec`` (``spec.resources``), values not yet
    parsed; empty when unset. Raises MalformedObject for a level of the wrong JSON type."""
    res = child_map(dict(spec), "resources", spec_ptr)
    if not res:
        return {}, {}
    ptr = spec_ptr + "/resources"
    return child_map(res, "requests", ptr) or {}, child_map(res, "limits", ptr) or {}


def with_pod_level(effective: Mapping[str, float], requests: Mapping[str, float],
                   limits: Mapping[str, float]) -> dict[str, float]:
    """The pod's request per resource as the scheduler reads it when the pod sets
    pod-level resources (``component-helpers/resource.PodRequests``): a pod-level request
    wins over what the containers add up to. The API server defaults a pod-level request
    from the containers' requests where they ask the resource, else from the pod-level
    limit; a spec read before defaulting (``review``, the audit of a file) is read the
    same way."""
    out = dict(effective)
    for r in POD_LEVEL:
        if r in requests:
            out[r] = requests[r]
        elif r in limits and not effective.get(r):
            out[r] = limits[r]
    return {r: v for r, v in out.items() if v}
