"""No GPU without a charge: the routes to a GPU that skip the GPU request, closed.

Quota counts the GPUs a pod asks for (device-plugin resources, DRA claims). On a node
with NVIDIA's container runtime a container can take GPUs without asking, and this
module closes each way for the pods of a tenant's namespaces (``gpuRoutes``, per
tenant; the facts and their sources: docs/security.md):

- ``NVIDIA_VISIBLE_DEVICES``: the runtime hands a container the GPUs the variable names
  (``all`` is the default of CUDA images). A container given no GPU gets ``void`` (an
  explicit ``env`` entry, which wins over ``envFrom`` in the kubelet and comes after the
  image's value, and the runtime reads the last); a container given GPUs by the device
  plugin loses its own entry, which would come after the device plugin's and replace it.
  ``deny`` refuses a container that sets the variable; ``allow`` leaves it alone.
- privilege (``privileged``, or ``SYS_ADMIN``, which the runtime reads as privileged) and
  hostPath volumes of ``/dev``: refused in a pod that can reach GPU nodes.
- ``spec.nodeName`` at creation: the scheduler is skipped and the kubelet checks only
  NoExecute taints, so the GPU nodes' NoSchedule taint no longer keeps the pod off.
  Refused unless the webhook's node watch knows the node to carry no GPU.
- ephemeral containers (``kubectl debug``): checked as containers are, when added.
- PriorityClasses: the classes a tenant may name and a ceiling on their value, so that
  no tenant's pod outranks (and preempts) another tenant's in-quota pod.
- DRA device taints: a GPU claim's request may not tolerate them (the driver taints
  GPUs it finds unhealthy).

Every change is made only when missing, so mutating the output again adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from webhook.engine import messages
from webhook.engine.claims import is_claim
from webhook.engine.decision import Checker, Decision, Finding, malformed, subject_of
from webhook.engine.devices import ClaimLookup
from webhook.engine.target import NamespaceLabels, Target, Targets, prepare, template_target
from webhook.engine.tolerations import covers
from webhook.k8s import claims
from webhook.k8s.objects import MalformedObject, child_list, child_map, shown_name
from webhook.k8s.patch import Patch
from webhook.k8s.review import AdmissionRequest
from webhook.k8s.workloads import pod_template
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode, Rule
from webhook.policy.tenantrules import RouteRules, TenantRules

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOID = "void"  # no devices and no driver libraries: as runc (NVIDIA container toolkit)
NEUTRAL_ENTRY = {"name": VISIBLE_DEVICES, "value": VOID}
# Values that show no GPU: ``void`` and empty (none at all), ``none`` (driver libraries
# only). A list that holds ``void`` anywhere is void to the toolkit, but that is not
# something a user should rely on: only these are left as they are.
HARMLESS = frozenset({VOID, "", "none"})
SUBRESOURCE = "ephemeralcontainers"
NODE_USER_PREFIX = "system:node:"  # the kubelet's own identity (mirror pods)

# The rules this module reports; the mutating webhook owns them.
RULES = frozenset({Rule.VISIBLE_DEVICES, Rule.PRIVILEGED, Rule.DEVICE_HOST_PATHS,
                   Rule.NODE_NAME, Rule.PRIORITY_CLASS, Rule.DEVICE_TAINT_TOLERATIONS})

NodeLookup = Callable[[str], "bool | None"]  # True: has GPUs; False: known, none; None: unknown
PriorityLookup = Callable[[str], "tuple[int, str] | None"]  # class -> (value, preemption)


def no_nodes(name: str) -> bool | None:
    return None


def no_priorities(name: str) -> tuple[int, str] | None:
    return None


@dataclass(frozen=True, slots=True)
class Sights:
    """What the webhook's watches know that these rules read: which nodes carry GPUs,
    and the PriorityClasses. Offline (``review``), nothing: a node is not known to be
    without GPUs, and a class's value is the one the pod states, if any."""

    node_gpus: NodeLookup = no_nodes
    priority_class: PriorityLookup = no_priorities


no_sights = Sights()


def applies(target: Target) -> RouteRules | None:
    """The route rules of a pod's (or pod template's) tenant; None outside tenants'
    namespaces."""
    if target.tenant is None:
        return None
    return target.tenant.routes


# --------------------------------------------------------------------------- pods


def pod(check: Checker, policy: CompiledPolicy, target: Target, patch: Patch | None,
        changes: list[str], sights: Sights, username: str) -> None:
    """A tenant's Pod at CREATE: every route checked, the variable neutralized, the
    default PriorityClass given (``patch`` None: checked only, nothing changed). A
    workload's pod template is checked only, for an answer at ``kubectl apply``: its pods
    are changed when they are created. Raises MalformedObject."""
    rules = applies(target)
    if rules is None:
        return
    assert target.tenant is not None
    if not target.template.is_pod:
        patch = None
    spec, sptr = target.template.spec, target.template.spec_pointer
    charged = _charged(target)
    if rules.visible_devices != "allow" and patch is not None:
        n = len(patch.ops)
        for key in ("initContainers", "containers"):
            for i, c in enumerate(child_list(spec, key, sptr) or []):
                if isinstance(c, dict):
                    visible_devices(check, rules, c, f"{sptr}/{key}/{i}",
                                    _describe(key, c, i), f"{key}/{i}" in charged, patch)
        if len(patch.ops) > n:
            changes.append("gpu-visible-devices")
    node = spec.get("nodeName")
    if (rules.node_name and isinstance(node, str) and node
            and not username.startswith(NODE_USER_PREFIX)):
        has = sights.node_gpus(node)
        if has is not False:
            check.report(Rule.NODE_NAME, messages.node_name(node, has is True))
    reach = reaches_gpu_nodes(policy, target, sights)
    if reach is not None:
        containers = [(key, i, c) for key in ("initContainers", "containers")
                      for i, c in enumerate(child_list(spec, key, sptr) or [])
                      if isinstance(c, dict)]
        _privileged(check, rules, containers, reach)
        if rules.device_host_paths:
            for name, path in device_host_paths(spec, sptr):
                check.report(Rule.DEVICE_HOST_PATHS, messages.device_host_path(
                    name, path, reach))
    if priority(check, target.tenant, spec, sptr, patch, sights):
        changes.append("priority-class-default")


def _describe(key: str, c: dict[str, Any], i: int) -> str:
    name = c.get("name") if isinstance(c.get("name"), str) else f"#{i}"
    label = {"initContainers": "init container", "containers": "container",
             "ephemeralContainers": "ephemeral container"}[key]
    return f'{label} "{name}"'


def _charged(target: Target) -> frozenset[str]:
    """The containers (``containers/0``, ``initContainers/1``) given GPUs: by device-plugin
    resources, or by naming a pod claim that asks a GPU class."""
    out = set()
    gpu_claims = {c.entry.name for c in target.claims if c.gpu}
    prefix = target.template.spec_pointer + "/"
    for c in target.containers:
        named = _claim_names(c.container)
        if c.names or named & gpu_claims:
            out.add(c.pointer.removeprefix(prefix))
    if target.kai is not None:
        # KAI gives its fraction to the container its annotation names, else the first.
        app = [c for c in target.containers if c.kind == "container"]
        given = next((c for c in app if c.name == target.kai.container), None) \
            if target.kai.container is not None else (app[0] if app else None)
        if given is not None:
            out.add(given.pointer.removeprefix(prefix))
    return frozenset(out)


def _claim_names(c: dict[str, Any]) -> set[str]:
    res = c.get("resources")
    listed = res.get("claims") if isinstance(res, dict) else None
    return {str(e.get("name")) for e in listed or () if isinstance(e, dict)} \
        if isinstance(listed, list) else set()


def visible_devices(check: Checker, rules: RouteRules, c: dict[str, Any], cptr: str,
                    where: str, charged: bool, patch: Patch) -> None:
    """One container: ``void`` for a container given no GPU, its own entries of the
    variable removed from one given GPUs (``neutralize``), or refused (``deny``)."""
    env = child_list(c, "env", cptr) or []
    hits = [i for i, e in enumerate(env)
            if isinstance(e, dict) and e.get("name") == VISIBLE_DEVICES]
    if charged:
        if not hits:
            return
        if rules.visible_devices == "deny":
            risky = [i for i in hits if env[i] != NEUTRAL_ENTRY]
            if risky:
                check.report(Rule.VISIBLE_DEVICES, messages.visible_devices_charged(
                    _what(env[risky[-1]])), where)
            return
        patch.remove_indices(c, "env", cptr, hits)
        return
    risky = [i for i in hits if not _harmless(env[i])]
    if rules.visible_devices == "deny" and risky:
        check.report(Rule.VISIBLE_DEVICES, messages.visible_devices_uncharged(
            _what(env[risky[-1]])), where)
        return
    if not hits:
        patch.append(c, "env", cptr, dict(NEUTRAL_ENTRY))
        return
    for i in hits:
        if env[i] != NEUTRAL_ENTRY:
            _replace(patch, env, f"{cptr}/env", i, dict(NEUTRAL_ENTRY))


def _harmless(entry: dict[str, Any]) -> bool:
    value = entry.get("value")
    return "valueFrom" not in entry and (value is None or (
        isinstance(value, str) and value.strip().lower() in HARMLESS))


def _what(entry: dict[str, Any]) -> str:
    if entry.get("valueFrom") is not None:
        return "from valueFrom"
    return f'"{entry.get("value", "")}"'


def _replace(patch: Patch, lst: list[Any], ptr: str, i: int, value: Any) -> None:
    lst[i] = value
    patch.ops.append({"op": "replace", "path": f"{ptr}/{i}", "value": dict(value)})


def reaches_gpu_nodes(policy: CompiledPolicy, target: Target, sights: Sights) -> str | None:
    """Why the pod can run on a GPU node (for messages), or None when it cannot: it asks
    for GPUs or DRA devices, is bound to a node not known to be without GPUs, or tolerates
    the GPU nodes' taints (a key-less ``Exists`` tolerates them all)."""
    if target.has_gpu:
        return "it asks for GPUs"
    if target.claims:
        return "it names DRA claims"
    spec, sptr = target.template.spec, target.template.spec_pointer
    node = spec.get("nodeName")
    if isinstance(node, str) and node:
        has = sights.node_gpus(node)
        if has is False:
            return None
        return (f'its node "{node}" carries GPUs' if has else
                f'its node "{node}" is not known to be without GPUs')
    if not policy.tolerations:
        return "the policy names no GPU node taint, so any node may be a GPU node"
    for t in child_list(spec, "tolerations", sptr) or []:
        if not isinstance(t, dict):
            continue
        for w in policy.tolerations:
            if covers(t, w):
                return (f"it tolerates the GPU taint {w.get('key')}" if t.get("key")
                        else "it tolerates every taint")
    return None


def _privileged(check: Checker, rules: RouteRules,
                containers: Iterable[tuple[str, int, dict[str, Any]]], reach: str) -> None:
    if not rules.privileged:
        return
    for key, i, c in containers:
        how = privileged(c)
        if how is not None:
            check.report(Rule.PRIVILEGED, messages.privileged(how, reach),
                         _describe(key, c, i))


def privileged(c: dict[str, Any]) -> str | None:
    """How a container is privileged as the NVIDIA runtime and containerd read it:
    ``privileged: true`` (every host device), or ``SYS_ADMIN`` added (the runtime then
    honours the variable even where unprivileged containers' is ignored)."""
    sc = c.get("securityContext")
    if not isinstance(sc, dict):
        return None
    if sc.get("privileged") is True:
        return "securityContext.privileged: true"
    caps = sc.get("capabilities")
    added = caps.get("add") if isinstance(caps, dict) else None
    for cap in added if isinstance(added, list) else ():
        if isinstance(cap, str) and cap.upper().removeprefix("CAP_") in ("SYS_ADMIN", "ALL"):
            return f"securityContext.capabilities.add: {cap}"
    return None


def device_host_paths(spec: dict[str, Any], sptr: str) -> list[tuple[str, str]]:
    """hostPath volumes of ``/``, ``/dev`` or a path under ``/dev``: (volume, path)."""
    out = []
    for i, v in enumerate(child_list(spec, "volumes", sptr) or []):
        hp = v.get("hostPath") if isinstance(v, dict) else None
        path = hp.get("path") if isinstance(hp, dict) else None
        if not isinstance(path, str):
            continue
        norm = "/" + "/".join(p for p in path.split("/") if p and p != ".")
        if norm == "/" or norm == "/dev" or norm.startswith("/dev/"):
            name = v.get("name") if isinstance(v.get("name"), str) else f"#{i}"
            out.append((name, path))
    return out


def priority(check: Checker, tenant: TenantRules, spec: dict[str, Any], sptr: str,
             patch: Patch | None, sights: Sights) -> bool:
    """The pod's PriorityClass: one the tenant may name, at most its ceiling; a pod that
    names none gets the tenant's default. Whether the default was given.

    The API server's Priority plugin has resolved the class before the mutating webhooks
    run, so ``spec.priority`` is the class's value; offline the watch's value is used.
    A default class is written by name with the resolved fields removed, so the plugin,
    run again after a webhook changed the pod, resolves it."""
    rules = tenant.priority
    name = spec.get("priorityClassName")
    if not isinstance(name, str) or not name:
        if rules.default is None or patch is None:
            _ceiling(check, tenant, None, spec, sights)
            return False
        patch.set(spec, "priorityClassName", sptr, rules.default)
        for key in ("priority", "preemptionPolicy"):
            if key in spec:
                del spec[key]
                patch.ops.append({"op": "remove", "path": f"{sptr}/{key}"})
        return True
    if rules.allowed is not None and name not in rules.allowed:
        check.report(Rule.PRIORITY_CLASS, messages.priority_class_not_allowed(
            name, tenant.name, sorted(rules.allowed)))
        return False
    _ceiling(check, tenant, name, spec, sights)
    return False


def _ceiling(check: Checker, tenant: TenantRules, name: str | None, spec: dict[str, Any],
             sights: Sights) -> None:
    value = spec.get("priority")
    if isinstance(value, bool) or not isinstance(value, int):
        known = sights.priority_class(name) if name else None
        if known is None:
            return
        value = known[0]
    if value > tenant.priority.ceiling:
        allowed = sorted(tenant.priority.allowed) if tenant.priority.allowed else None
        check.report(Rule.PRIORITY_CLASS, messages.priority_above_ceiling(
            name, value, tenant.priority.ceiling, tenant.name, allowed))


def recheck(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels,
            claims: ClaimLookup, sights: Sights, controller_users: frozenset[str],
            prepared: Targets | Decision | None = None) -> list[Finding]:
    """The validating webhook's look at the final object, to enforce only (as it does
    for every rule of the mutating phase): what would be refused, or should have been
    changed, had the mutating webhook run. A container given no GPU that sets the
    variable, one given GPUs that sets it at all, and the refusals. Nothing is changed
    and no warning is repeated. ``prepared``: the request's targets, when the caller
    has read them already (:func:`~webhook.engine.target.prepare`)."""
    if is_claim(req):
        return [f for f in claim_tolerations(req, policy, labels, controller_users).findings
                if f.mode is Mode.ENFORCE]
    if not (req.kind == "Pod" and req.group == "" and req.operation == "CREATE"):
        return []
    targets = prepared if prepared is not None else prepare(req, policy, labels, claims)
    if isinstance(targets, Decision):
        return []
    out: list[Finding] = []
    for rt in targets.roles:
        target = rt.target
        rules = applies(target)
        if rules is None or target.tenant is None:
            continue
        check = Checker(policy, target.tenant, target.subject, frozenset())
        spec, sptr = target.template.spec, target.template.spec_pointer
        try:
            charged = _charged(target)
            if rules.visible_devices != "allow":
                for key in ("initContainers", "containers"):
                    for i, c in enumerate(child_list(spec, key, sptr) or []):
                        if isinstance(c, dict):
                            _visible_devices_set(check, c, f"{sptr}/{key}/{i}",
                                                 _describe(key, c, i),
                                                 f"{key}/{i}" in charged)
            pod(check, policy, target, None, [], sights, req.username)
        except MalformedObject:
            continue  # the validating webhook's own rules say so
        out.extend(check.findings)
    return out


def _visible_devices_set(check: Checker, c: dict[str, Any], cptr: str, where: str,
                         charged: bool) -> None:
    env = child_list(c, "env", cptr) or []
    hits = [e for e in env if isinstance(e, dict) and e.get("name") == VISIBLE_DEVICES]
    own = [e for e in hits if e != NEUTRAL_ENTRY]  # as the mutating webhook's deny reads it
    if charged and own:
        check.report(Rule.VISIBLE_DEVICES, messages.visible_devices_charged(
            _what(own[-1])), where)
    elif not charged and hits and not _harmless(hits[-1]):
        check.report(Rule.VISIBLE_DEVICES, messages.visible_devices_uncharged(
            _what(hits[-1])), where)


# --------------------------------------------------------------------------- ephemeral


def ephemeral(req: AdmissionRequest, policy: CompiledPolicy, labels: NamespaceLabels,
              sights: Sights) -> Decision:
    """``pods/ephemeralcontainers`` (``kubectl debug``): the containers added (the API
    server accepts no change to those already there) get ``void`` unless the tenant
    allows the variable, and are refused when privileged on a GPU node. An ephemeral
    container has no resources, so it is never given a GPU."""
    obj = req.object
    if req.operation != "UPDATE" or obj is None:
        return Decision.skip("operation")
    if policy.is_exempt(req.namespace, req.username, req.groups):
        return Decision.skip("exempt")
    tenant = policy.tenant_for(req.namespace, labels(req.namespace))
    if tenant is None:
        return Decision.skip("no-tenant")
    subject = subject_of("Pod", req.namespace, obj, req.name)
    rules = tenant.routes
    check = Checker(policy, tenant, subject, RULES)
    patch = Patch()
    try:
        spec = child_map(obj, "spec", "")
        if spec is None:
            return Decision.skip("operation")
        old_spec = (req.old_object or {}).get("spec")
        old = {e.get("name") for e in (old_spec.get("ephemeralContainers") or ())
               if isinstance(e, dict)} if isinstance(old_spec, dict) else set()
        node = spec.get("nodeName")
        has = sights.node_gpus(node) if isinstance(node, str) and node else None
        reach = None if has is False else (
            f'its node "{node}" carries GPUs' if has else
            f'its node "{node}" is not known to be without GPUs' if node else
            "it may be scheduled to a GPU node")
        added = [(i, c) for i, c in enumerate(child_list(spec, "ephemeralContainers", "/spec")
                                               or [])
                 if isinstance(c, dict) and c.get("name") not in old]
        for i, c in added:
            where = _describe("ephemeralContainers", c, i)
            if rules.visible_devices != "allow":
                visible_devices(check, rules, c, f"/spec/ephemeralContainers/{i}", where,
                                False, patch)
        if reach is not None:
            _privileged(check, rules, [("ephemeralContainers", i, c) for i, c in added],
                        reach)
    except MalformedObject as exc:
        return malformed(subject, exc)
    return check.decide(patch.ops, ["gpu-visible-devices"] if patch.ops else [])


def is_ephemeral(req: AdmissionRequest) -> bool:
    return req.kind == "Pod" and req.group == "" and req.sub_resource == SUBRESOURCE


# --------------------------------------------------------------------------- claims


def claim_tolerations(req: AdmissionRequest, policy: CompiledPolicy,
                      labels: NamespaceLabels, controller_users: frozenset[str]) -> Decision:
    """A ResourceClaim or template of a tenant: its GPU requests (``exactly`` and every
    ``firstAvailable`` subrequest) may not tolerate device taints unless the tenant
    allows it. A claim the resourceclaim controller makes from a template is not checked
    again: the template was."""
    obj = req.object
    if (req.operation != "CREATE" or obj is None or req.username in controller_users
            or policy.is_exempt(req.namespace, req.username, req.groups)):
        return Decision.skip("operation")
    tenant = policy.tenant_for(req.namespace, labels(req.namespace))
    if tenant is None or not tenant.routes.device_taint_tolerations:
        return Decision.skip("no-tenant")
    subject = f"{req.kind.lower()} {req.namespace}/{shown_name(obj, req.name) or '(unnamed)'}"
    check = Checker(policy, tenant, subject, RULES)
    try:
        found = claims.claim_spec(req.kind, obj)
        if found is None:
            return Decision.skip("operation")
        spec, ptr = found
        devices = child_map(spec, "devices", ptr)
        for i, r in enumerate(child_list(devices, "requests", ptr + "/devices") or []
                              if devices is not None else []):
            if not isinstance(r, dict):
                continue
            rname = r.get("name") if isinstance(r.get("name"), str) else str(i)
            parts: list[tuple[str, Any]] = []
            if isinstance(r.get("exactly"), dict):
                parts.append((f'device request "{rname}"', r["exactly"]))
            for j, sub in enumerate(r.get("firstAvailable") or ()):
                if isinstance(sub, dict):
                    sname = sub.get("name") if isinstance(sub.get("name"), str) else str(j)
                    parts.append((f'device request "{rname}/{sname}"', sub))
            for where, alt in parts:
                if alt.get("deviceClassName") not in policy.device_classes:
                    continue
                tols = [t for t in alt.get("tolerations") or () if isinstance(t, dict)]
                if tols:
                    check.report(Rule.DEVICE_TAINT_TOLERATIONS,
                                 messages.device_taint_tolerated(_toleration(tols[0])), where)
    except MalformedObject as exc:
        return malformed(subject, exc)
    return check.decide()


def _toleration(t: dict[str, Any]) -> str:
    key = t.get("key") or ""
    op = t.get("operator") or "Equal"
    if not key:
        return "operator Exists with no key: every taint"
    effect = t.get("effect") or "every effect"
    return f"key {key}, operator {op}, {effect}"


def carries_gpus(policy: CompiledPolicy, node: dict[str, Any]) -> bool:
    """Whether a node carries GPUs: a GPU resource in its capacity or allocatable, the
    policy's product label, or one of its GPU taints (a node whose device plugin has not
    reported yet counts as one)."""
    status = node.get("status") or {}
    for field in ("capacity", "allocatable"):
        held_ = status.get(field) if isinstance(status, dict) else None
        if isinstance(held_, dict) and any(policy.is_gpu(str(r)) for r in held_):
            return True
    meta = node.get("metadata") or {}
    labels = meta.get("labels") if isinstance(meta, dict) else None
    if isinstance(labels, dict) and policy.product_label in labels:
        return True
    keys = {t.get("key") for t in policy.tolerations}
    spec = node.get("spec") or {}
    taints = spec.get("taints") if isinstance(spec, dict) else None
    return any(isinstance(t, dict) and t.get("key") in keys for t in taints or ())


def node_lookup(policy: CompiledPolicy, nodes: Iterable[dict[str, Any]]) -> NodeLookup:
    """A NodeLookup of listed nodes (``audit``, read once)."""
    known = {str((n.get("metadata") or {}).get("name")): carries_gpus(policy, n)
             for n in nodes}
    return known.get


# --------------------------------------------------------------------------- audit


def held(policy: CompiledPolicy, pod_obj: dict[str, Any], labels: NamespaceLabels,
         node_gpus: NodeLookup = no_nodes) -> list[tuple[Rule, str]]:
    """The routes to a GPU a running pod of a tenant holds on its node (for ``audit``):
    containers, ephemeral ones included, that may see GPUs they were not given
    (the variable not ``void``, privilege) and ``/dev`` mounts. A pod on a node known to
    carry no GPU holds none; a pod's ``nodeName`` itself is not one (the scheduler sets
    it too). Raises MalformedObject."""
    meta = pod_obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    if namespace in policy.exempt_namespaces:
        return []
    tenant = policy.tenant_for(namespace, labels(namespace))
    template = pod_template("", "Pod", pod_obj)
    if tenant is None or template is None:
        return []
    spec = template.spec
    node = spec.get("nodeName")
    if not isinstance(node, str) or not node or node_gpus(node) is False:
        return []
    rules = tenant.routes
    target = template_target(template, "", tenant, policy, namespace)
    charged = _charged(target)
    on = f'on node "{node}"'
    out: list[tuple[Rule, str]] = []
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for i, c in enumerate(child_list(spec, key, "/spec") or []):
            if not isinstance(c, dict):
                continue
            where = _describe(key, c, i)
            entries = [e for e in child_list(c, "env", f"/spec/{key}/{i}") or []
                       if isinstance(e, dict) and e.get("name") == VISIBLE_DEVICES]
            # The claims a running pod names are not looked up here: a container naming
            # one is taken to be given its devices (their CDI spec sets the variable).
            if rules.visible_devices != "allow":
                if f"{key}/{i}" in charged or _claim_names(c):
                    if entries:
                        out.append((Rule.VISIBLE_DEVICES, messages.holds_visible_devices(
                            where, _what(entries[-1]), on, True)))
                elif not entries or not _harmless(entries[-1]):
                    what = _what(entries[-1]) if entries else "its image's value"
                    out.append((Rule.VISIBLE_DEVICES, messages.holds_visible_devices(
                        where, what, on, False)))
            how = privileged(c)
            if rules.privileged and how is not None:
                out.append((Rule.PRIVILEGED, messages.holds_privileged(where, how, on)))
    if rules.device_host_paths:
        for name, path in device_host_paths(spec, "/spec"):
            out.append((Rule.DEVICE_HOST_PATHS, messages.holds_host_path(name, path, on)))
    return out
