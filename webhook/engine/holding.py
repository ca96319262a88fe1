"""How a tenant's GPUs are held, beyond how many: for how long, with how much CPU and
memory, sent to which scheduler and queue, and on GPUs that can do what the pod asks.

- ``maxRuntime``: a GPU pod gets ``spec.activeDeadlineSeconds`` (the kubelet ends a pod
  that long after it starts, and its GPUs are free), never longer than the cap of its
  kind of work (a label, a PriorityClass, a namespace); a longer one is shortened (with
  a warning) or refused. A Job, or a CronJob's Job, gets its own
  ``spec.activeDeadlineSeconds`` at apply (the Job controller ends every pod of it). A
  Deployment's template may not carry a deadline (apps validation refuses one): its
  pods get theirs when they are created.
- ``resourcesPerGpu``: the most CPU and memory a pod may ask per GPU-equivalent (per
  product), on the pod's effective request; a pod asking none is given the default.
- ``routing``: ``schedulerName`` and the queue label or annotation of Kueue, Volcano or
  KAI-Scheduler on every GPU pod, and the labels on a workload itself at apply (Kueue
  and KAI read a Job's or a Deployment's own label).
- ``spec.gpuCapabilities``: a pod asking for a least GPU memory or compute capability
  gets node affinity on GPU Feature Discovery's labels (``Gt``), ANDed into every term
  (a capability of a minor version above 0 doubles the terms: a higher major, or the
  same major and a higher minor); a GPU claim gets a CEL selector on the DRA driver's
  attributes. The tenant's product pinning still applies.

Every change is made only when missing, so mutating the output again adds nothing; the
validating webhook checks the final Pod again, to enforce only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from webhook.engine import messages
from webhook.engine.cost import Cost
from webhook.engine.decision import Checker
from webhook.engine.target import Target, Targets
from webhook.k8s.claims import DeviceRequest
from webhook.k8s.objects import MalformedObject, child_map, parse_pointer
from webhook.k8s.patch import Patch
from webhook.k8s.quantity import QuantityError, gpu_count, parse
from webhook.k8s.resources import (
    ContainerKind,
    effective_request,
    pod_level,
    with_pod_level,
)
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CapabilityRules, CompiledPolicy
from webhook.policy.model import Mode, Rule
from webhook.policy.tenantrules import TenantRules

RUNTIME_ANNOTATION = "gpu-webhook.dev/max-runtime"
DEADLINE = "activeDeadlineSeconds"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
GI = 2**30
MI = 2**20

# Rules the mutating webhook reports (the validating webhook: enforce only); the
# per-GPU caps are the validating webhook's, where the pod's product is known.
RULES = frozenset({Rule.MAX_RUNTIME, Rule.QUEUE_ROUTING, Rule.GPU_CAPABILITY})


# --------------------------------------------------------------------------- pods


def pod(check: Checker, policy: CompiledPolicy, target: Target, patch: Patch | None,
        changes: list[str], namespace: str) -> None:
    """A tenant's GPU Pod at CREATE: routed, given its deadline and its default CPU and
    memory (``patch`` None: checked only). Templates are left to their pods. Raises
    MalformedObject."""
    tenant = target.tenant
    if tenant is None or not target.template.is_pod:
        return
    if tenant.routing is not None:
        _route(check, tenant, target, patch, changes)
    if tenant.runtime is not None:
        _pod_deadline(check, tenant, target, patch, changes, namespace)
    if patch is not None and tenant.ratios is not None:
        _fill(policy, tenant, target, patch, changes)


def recheck(check: Checker, policy: CompiledPolicy, target: Target, namespace: str) -> None:
    """The validating webhook's look at a final GPU Pod: what the mutating webhook would
    have set (deadline, routing, capability affinity), reported to enforce only."""
    pod(check, policy, target, None, [], namespace)
    capability(check, policy, target, None, [])


def _route(check: Checker, tenant: TenantRules, target: Target, patch: Patch | None,
           changes: list[str]) -> None:
    r = tenant.routing
    assert r is not None
    t = target.template
    spec, sptr = t.spec, t.spec_pointer
    meta = t.metadata or {}
    labels = child_map(meta, "labels", t.pointer + "/metadata") or {}
    annotations = child_map(meta, "annotations", t.pointer + "/metadata") or {}
    wrong: list[str] = []
    if r.scheduler_name and spec.get("schedulerName") != r.scheduler_name:
        wrong.append(f"spec.schedulerName {r.scheduler_name}")
        if patch is not None:
            patch.set(spec, "schedulerName", sptr, r.scheduler_name)
    for key, value in r.labels:
        if labels.get(key) != value:
            wrong.append(f"label {key}={value}")
            if patch is not None:
                patch.put(t.holder, t.pointer, ("metadata", "labels", key), value)
    for key, value in r.annotations:
        if annotations.get(key) != value:
            wrong.append(f"annotation {key}={value}")
            if patch is not None:
                patch.put(t.holder, t.pointer, ("metadata", "annotations", key), value)
    if not wrong:
        return
    if patch is None:
        check.report(Rule.QUEUE_ROUTING, messages.queue_unrouted(", ".join(wrong)))
    else:
        changes.append("queue-routing")


def _cap_of(tenant: TenantRules, template_meta: Mapping[str, Any] | None,
            spec: Mapping[str, Any], namespace: str) -> tuple[int, str | None] | None:
    assert tenant.runtime is not None
    raw = (template_meta or {}).get("labels")
    labels = raw if isinstance(raw, dict) else {}
    return tenant.runtime.cap(labels, spec.get("priorityClassName"), namespace)


def _pod_deadline(check: Checker, tenant: TenantRules, target: Target,
                  patch: Patch | None, changes: list[str], namespace: str) -> None:
    t = target.template
    cap = _cap_of(tenant, t.metadata, t.spec, namespace)
    if cap is None:
        return
    final = _deadline(check, tenant, t.spec, t.spec_pointer, cap, patch, changes,
                      "spec.activeDeadlineSeconds")
    if final is not None and patch is not None:
        value = messages.runtime_cap(final, cap[1])
        ann = child_map(t.metadata or {}, "annotations", "/metadata") or {}
        if ann.get(RUNTIME_ANNOTATION) != value:
            patch.put(t.holder, t.pointer, ("metadata", "annotations", RUNTIME_ANNOTATION),
                      value)


def _deadline(check: Checker, tenant: TenantRules, spec: dict[str, Any], sptr: str,
              cap: tuple[int, str | None], patch: Patch | None, changes: list[str],
              field: str) -> int | None:
    """Hold ``spec.activeDeadlineSeconds`` to the cap: set when missing, shortened or
    refused when longer. The deadline the object ends with (None: refused, or a value
    core validation refuses anyway)."""
    assert tenant.runtime is not None
    seconds, kind = cap
    asked = spec.get(DEADLINE)
    if asked is None:
        if patch is None:
            check.report(Rule.MAX_RUNTIME, messages.runtime_missing(field, seconds, kind,
                                                                    tenant.name))
            return None
        patch.set(spec, DEADLINE, sptr, seconds)
        changes.append("max-runtime")
        return seconds
    if isinstance(asked, bool) or not isinstance(asked, int):
        return None  # core validation says so
    if asked <= seconds:
        return asked
    if tenant.runtime.deny_longer or patch is None:
        check.report(Rule.MAX_RUNTIME, messages.runtime_longer(
            field, asked, seconds, kind, tenant.name, False))
        return None
    patch.set(spec, DEADLINE, sptr, seconds)
    check.report(Rule.MAX_RUNTIME, messages.runtime_longer(
        field, asked, seconds, kind, tenant.name, True), at_most=Mode.WARN)
    changes.append("max-runtime")
    return seconds


# --------------------------------------------------------------------------- workloads

_JOB_SPECS = {"Job": ("spec",), "CronJob": ("spec", "jobTemplate", "spec")}


def workload(check: Checker, targets: Targets, req: AdmissionRequest, patch: Patch | None,
             changes: list[str]) -> None:
    """A GPU workload at apply (not a Pod): a Job's own deadline, and the queue labels
    on the workload itself, where Kueue and KAI-Scheduler read them (``patch`` None:
    the Job's deadline checked only; its pods are checked for their queue). Raises
    MalformedObject."""
    tenant = targets.tenant
    obj = req.object
    if tenant is None or obj is None or targets.is_pod or not targets.has_gpu:
        return
    if patch is not None and tenant.routing is not None and tenant.routing.labels:
        meta = child_map(obj, "metadata", "") or {}
        labels = child_map(meta, "labels", "/metadata") or {}
        n = len(patch.ops)
        for key, value in tenant.routing.labels:
            if labels.get(key) != value:
                patch.put(obj, "", ("metadata", "labels", key), value)
        if len(patch.ops) > n:
            changes.append("queue-routing")
    path = _JOB_SPECS.get(req.kind) if req.group == "batch" else None
    if tenant.runtime is None or path is None or len(targets.roles) != 1:
        return
    spec: dict[str, Any] | None = obj
    ptr = ""
    for key in path:
        spec = child_map(spec, key, ptr) if spec is not None else None
        ptr += "/" + key
    if spec is None:
        return
    t = targets.roles[0].target.template
    cap = _cap_of(tenant, t.metadata, t.spec, req.namespace)
    if cap is not None:
        _deadline(check, tenant, spec, ptr, cap, patch, changes,
                  "/".join(path).replace("/", ".") + "." + DEADLINE)


# --------------------------------------------------------------------------- CPU, memory


def _fill(policy: CompiledPolicy, tenant: TenantRules, target: Target, patch: Patch,
          changes: list[str]) -> None:
    """A GPU pod asking no CPU (or memory) in any container: each GPU container is
    given the default per GPU it asks."""
    r = tenant.ratios
    assert r is not None
    n = len(patch.ops)
    t = target.template
    # A pod that asks at pod level has asked: container requests beside a pod-level
    # limit could also exceed it, which core validation refuses.
    pod_requests, pod_limits = pod_level(t.spec, t.spec_pointer)
    for resource, per in (("cpu", r.fill_cpu), ("memory", r.fill_memory)):
        if per is None or resource in pod_requests or resource in pod_limits or any(
                resource in (c.requests or {}) or resource in (c.limits or {})
                for c in target.containers):
            continue
        for c in target.containers:
            if not c.names or c.kind == "init":
                continue
            gpus = _gpus(policy, c.requests, c.limits, c.names)
            if gpus > 0:
                patch.put(c.container, c.pointer, ("resources", "requests", resource),
                          _quantity(per * gpus, resource))
    if len(patch.ops) > n:
        changes.append("resources-per-gpu-default")


def _gpus(policy: CompiledPolicy, requests: Mapping[str, Any] | None,
          limits: Mapping[str, Any] | None, names: list[str]) -> float:
    total = 0.0
    for name in names:
        value = (limits or {}).get(name, (requests or {}).get(name))
        try:
            total += gpu_count(value) * policy.weight(name)
        except QuantityError:
            continue  # reported by the requests rule
    return total


def _quantity(amount: float, resource: str) -> str:
    """An amount as a quantity people read: ``16``, ``500m``, ``128Gi``."""
    if resource == "cpu":
        milli = round(amount * 1000)
        return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
    whole = math.ceil(amount)
    for unit, size in (("Gi", GI), ("Mi", MI)):
        if whole % size == 0:
            return f"{whole // size}{unit}"
    return str(whole)


def _shown(amount: float, resource: str) -> str:
    if resource == "cpu":
        return messages.num(round(amount, 3))
    if amount >= GI:
        return f"{messages.num(round(amount / GI, 2))}Gi"
    return f"{messages.num(round(amount / MI, 1))}Mi"


def ratios(check: Checker, target: Target, cost: Cost, resized: bool = False) -> None:
    """The pod's CPU and memory per GPU-equivalent against its tenant's caps (of its
    product, when the caps name it): rule resources-per-gpu. ``resized``: the pod's
    resources as an in-place resize would make them (its GPUs cannot change)."""
    tenant = target.tenant
    r = tenant.ratios if tenant is not None else None
    gpus = cost.spot or cost.gpus  # before the tenant's spot weight: the GPUs it holds
    if r is None or tenant is None or gpus <= 0:
        return
    caps = r.caps(cost.product)
    wanted = [(res, cap) for res, cap in (("cpu", caps.cpu), ("memory", caps.memory))
              if cap is not None]
    if not wanted:
        return
    names = [res for res, _ in wanted]
    per: list[tuple[ContainerKind, dict[str, float]]] = [
        (c.kind, _amounts({**(c.limits or {}), **(c.requests or {})}, names))
        for c in target.containers]
    t = target.template
    pod_requests, pod_limits = pod_level(t.spec, t.spec_pointer)
    asked = with_pod_level(effective_request(per), _amounts(pod_requests, names),
                           _amounts(pod_limits, names))
    product = cost.product if cost.product in r.products else None
    for res, cap in wanted:
        have = asked.get(res, 0.0)
        if have > cap * gpus * (1 + 1e-9):
            said = messages.per_gpu_resized if resized else messages.per_gpu
            check.report(Rule.RESOURCES_PER_GPU, said(
                gpus, res, _shown(have, res), r.shown.get(cap) or _shown(cap, res),
                _shown(cap * gpus, res), tenant.name, product))


def _amounts(values: Mapping[str, Any], names: list[str]) -> dict[str, float]:
    """The readable quantities of ``names`` among ``values`` (an unreadable one is core
    validation's to refuse)."""
    out: dict[str, float] = {}
    for res in names:
        value = values.get(res)
        if value is None:
            continue
        try:
            out[res] = float(parse(value))
        except QuantityError:
            continue
    return out


# --------------------------------------------------------------------------- capability

_VERSION = re.compile(r"^([0-9]{1,3})(?:\.([0-9]{1,3}))?$")


def _asked(meta: Mapping[str, Any] | None, label: str | None, annotation: str | None
           ) -> tuple[str, object] | None:
    """(how it was asked, value) of a capability request: the label wins."""
    for field, key in (("labels", label), ("annotations", annotation)):
        raw = (meta or {}).get(field)
        if key and isinstance(raw, dict) and raw.get(key) not in (None, ""):
            return f"{field[:-1]} {key}", raw[key]
    return None


def _asks(check: Checker | None, c: CapabilityRules, meta: Mapping[str, Any] | None
          ) -> tuple[int | None, tuple[int, int] | None]:
    """(least memory in MiB, least compute capability) a pod or claim asks, each None
    when not asked or unreadable (reported to ``check`` when given)."""
    mib: int | None = None
    version: tuple[int, int] | None = None
    mem = _asked(meta, c.memory_label, c.memory_annotation)
    if mem is not None:
        try:
            q = parse(mem[1])
            if q <= 0:
                raise QuantityError("not more than 0")
            mib = math.ceil(q / MI)
        except QuantityError:
            if check is not None:
                check.report(Rule.GPU_CAPABILITY, messages.capability_unreadable(
                    mem[0], mem[1], '"80Gi" (GiB), "80G" (GB) or "81920Mi"'))
    cc = _asked(meta, c.compute_label, c.compute_annotation)
    if cc is not None:
        m = _VERSION.match(str(cc[1]))
        if m is None or int(m.group(1)) < 1:
            if check is not None:
                check.report(Rule.GPU_CAPABILITY, messages.capability_unreadable(
                    cc[0], cc[1], '"9.0" or "8.6"'))
        else:
            version = (int(m.group(1)), int(m.group(2) or 0))
    return mib, version


def alternatives(c: CapabilityRules, mib: int | None, version: tuple[int, int] | None
                 ) -> list[list[dict[str, Any]]]:
    """The node-affinity requirements that say the ask, as alternatives (ORed terms):
    memory ``Gt`` MiB - 1, and a compute capability of M.m as ``major Gt M-1`` (m = 0)
    or as ``major Gt M`` OR ``major In [M], minor Gt m-1``."""
    alts: list[list[dict[str, Any]]] = [[]]
    if mib is not None:
        alts = [[{"key": c.node_memory, "operator": "Gt", "values": [str(mib - 1)]}]]
    if version is not None:
        major, minor = version
        if minor == 0:
            options = [[{"key": c.node_major, "operator": "Gt", "values": [str(major - 1)]}]]
        else:
            options = [[{"key": c.node_major, "operator": "Gt", "values": [str(major)]}],
                       [{"key": c.node_major, "operator": "In", "values": [str(major)]},
                        {"key": c.node_minor, "operator": "Gt", "values": [str(minor - 1)]}]]
        alts = [a + o for a in alts for o in options]
    return alts


def _what(mib: int | None, version: tuple[int, int] | None) -> str:
    parts = []
    if mib is not None:
        parts.append(f"at least {mib} MiB of memory")
    if version is not None:
        parts.append(f"compute capability {version[0]}.{version[1]} or more")
    return " and ".join(parts)


def capability(check: Checker, policy: CompiledPolicy, target: Target, patch: Patch | None,
               changes: list[str]) -> None:
    """A GPU pod (or template) asking for GPUs by what they can do: the requirements
    ANDed into every required node-affinity term (``patch`` None: checked only). Raises
    MalformedObject."""
    c = policy.capabilities
    if c is None or not target.gpu_containers:
        return
    t = target.template
    mib, version = _asks(check if patch is not None else None, c, t.metadata)
    if mib is None and version is None:
        return
    alts = alternatives(c, mib, version)
    spec, sptr = t.spec, t.spec_pointer
    terms = _terms(spec, sptr)
    if terms and all(any(all(e in (term.get("matchExpressions") or []) for e in alt)
                         for alt in alts) for term in terms):
        return
    if patch is None:
        check.report(Rule.GPU_CAPABILITY, messages.capability_unpinned(_what(mib, version)))
        return
    new = []
    for term in terms or [{}]:
        for alt in alts:
            nt = dict(term)
            nt["matchExpressions"] = [*(term.get("matchExpressions") or []), *alt]
            new.append(nt)
    patch.put(spec, sptr, ("affinity", "nodeAffinity", REQUIRED, "nodeSelectorTerms"), new)
    changes.append("gpu-capability")


def _terms(spec: dict[str, Any], sptr: str) -> list[dict[str, Any]]:
    affinity = child_map(spec, "affinity", sptr)
    na = child_map(affinity, "nodeAffinity", sptr + "/affinity") if affinity else None
    req = child_map(na, REQUIRED, sptr + "/affinity/nodeAffinity") if na else None
    raw = req.get("nodeSelectorTerms") if req else None
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
        raise MalformedObject(f"{sptr}/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms",
                              "a list of node selector terms")
    return raw


def claim_selectors(policy: CompiledPolicy, obj: dict[str, Any],
                    requests: list[DeviceRequest], patch: Patch) -> bool:
    """A GPU claim (or template) asking for GPUs by what they can do: a CEL selector on
    the DRA driver's attributes ANDed into each GPU request. Idempotent. True when
    something was added."""
    c = policy.capabilities
    if c is None:
        return False
    meta = obj.get("metadata")
    mib, version = _asks(None, c, meta if isinstance(meta, dict) else None)
    wanted = []
    if mib is not None:
        wanted.append(f"{c.dra_memory}.compareTo(quantity('{mib}Mi')) >= 0")
    if version is not None:
        wanted.append(f"{c.dra_compute}.compareTo(semver('{version[0]}.{version[1]}.0')) >= 0")
    changed = False
    for r in requests:
        for a in r.alternatives:
            if a.device_class not in policy.device_classes:
                continue
            node = _at(obj, a.pointer)
            for expression in wanted:
                if expression not in a.selectors:
                    patch.append(node, "selectors", a.pointer, {"cel": {"expression": expression}})
                    changed = True
    return changed


def _at(obj: dict[str, Any], pointer: str) -> dict[str, Any]:
    node: Any = obj
    for token in parse_pointer(pointer):
        node = node[int(token)] if isinstance(node, list) else node[token]
    assert isinstance(node, dict)
    return node


# --------------------------------------------------------------------------- status


def describe(tenant: TenantRules) -> str | None:
    """One line for ``gpu-webhook status``: how the tenant's GPUs are held (None when no
    rule of this module applies to it)."""
    parts = []
    rt = tenant.runtime
    if rt is not None:
        caps = [f"{k.name} {messages.duration(k.seconds)}" for k in rt.kinds]
        if rt.seconds is not None:
            caps.append(f"other GPU pods {messages.duration(rt.seconds)}")
        longer = "refused" if rt.deny_longer else "shortened"
        parts.append(f"max runtime {', '.join(caps)} (longer {longer})")
    r = tenant.ratios
    if r is not None:
        shown = [f"{r.shown.get(v) or _shown(v, res)} {res}" for res, v in (
            ("cpu", r.default.cpu), ("memory", r.default.memory)) if v is not None]
        if shown:
            parts.append(f"at most {' and '.join(shown)} per GPU")
        for p, own in r.products.items():
            each = [f"{r.shown.get(v) or _shown(v, res)} {res}" for res, v in (
                ("cpu", own.cpu), ("memory", own.memory)) if v is not None]
            parts.append(f"{p}: {' and '.join(each)} per GPU")
    q = tenant.routing
    if q is not None:
        to = ([f"scheduler {q.scheduler_name}"] if q.scheduler_name else []) + [
            f"{k}={v}" for k, v in (*q.labels, *q.annotations)]
        parts.append(f"sent to {', '.join(to)}")
    return f"{tenant.name}: {'; '.join(parts)}" if parts else None
