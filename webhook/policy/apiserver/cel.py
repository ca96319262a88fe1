"""The CEL the webhook configurations' matchConditions are made of
(:mod:`webhook.policy.apiserver.webhooks`): a GPU pod (its resources, DRA claims, KAI-Scheduler
annotations, GPU tolerations) tested on each kind's pod specs, found at the places the
kinds' descriptions give; a claim of a GPU device class; a scale-up; a removed quota
gate; the requests the policy exempts.

The pod tests are built from a placeholder: ``{S}`` stands for the pod spec, and is
replaced by the path to it for each kind (see :func:`for_pod_spec`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from webhook.k8s.objects import parse_pointer
from webhook.k8s.workloads import CRD_KINDS, BuiltIn
from webhook.policy.model import WorkloadKind

# CEL over a Scale object (autoscaling/v1): more replicas than before. An absent
# spec.replicas is 0 (the field is omitted when empty).
SCALE_UP = ("(has(object.spec) && has(object.spec.replicas) ? object.spec.replicas : 0) > "
            "(has(oldObject.spec) && has(oldObject.spec.replicas) ? "
            "oldObject.spec.replicas : 0)")

# A pod's UPDATE that removes the quota gate (webhook.engine.waiting): only the webhook's
# own identity may, once it has charged the pod.
_HAS_GATE = ("(has({o}.spec.schedulingGates) && "
             "{o}.spec.schedulingGates.exists(g, g.name == 'gpu-webhook.dev/quota'))")
GATE_REMOVED = f"{_HAS_GATE.format(o='oldObject')} && !{_HAS_GATE.format(o='object')}"

# A pod without GPUs whose route rules need what only the webhook knows (in admission
# mode native, the routes webhooks get only these): an ephemeral container (its pod's
# GPUs), spec.nodeName (the node's GPUs), a PriorityClass (its value), DRA claims (their
# classes). The native policies decide every other pod.
NEEDS_STATE = ("(has(request.subResource) && request.subResource == 'ephemeralcontainers') || "
               "(has(object.spec.nodeName) && object.spec.nodeName != '') || "
               "(has(object.spec.priorityClassName) && object.spec.priorityClassName != '') || "
               "(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)")

# The pod spec placeholder of the pod tests.
_SPEC = "{S}"


def _quote(s: str) -> str:
    # Policy names and patterns are restricted to [-A-Za-z0-9_./*] by the schema; the
    # check keeps a future schema change from producing an expression that means
    # something else.
    if any(c in s for c in "'\\\n"):
        raise ValueError(f"{s!r} cannot be put in a CEL string")
    return f"'{s}'"


def string_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_quote(v) for v in values) + "]"


def resource_test(var: str, names: Iterable[str], patterns: Iterable[str]) -> str:
    """CEL that is true when the resource name ``var`` is a GPU resource."""
    terms = []
    names = list(names)
    if names:
        terms.append(f"{var} in {string_list(names)}")
    for p in patterns:
        parts = p.split("*")
        if len(parts) == 1:
            terms.append(f"{var} == {_quote(p)}")
        elif p == "*":
            return "true"
        elif len(parts) == 2 and parts[1] == "":
            terms.append(f"{var}.startsWith({_quote(parts[0])})")
        elif len(parts) == 2 and parts[0] == "":
            terms.append(f"{var}.endsWith({_quote(parts[1])})")
        else:  # RE2 through matches(); "." is the only regex character a name can hold
            regex = "^" + ".*".join(part.replace(".", "[.]") for part in parts) + "$"
            terms.append(f"{var}.matches({_quote(regex)})")
    return " || ".join(terms) if terms else "false"


def gpu_pod_expression(names: Iterable[str], patterns: Iterable[str]) -> str:
    """CEL over the pod spec placeholder: any container or init container asks for a GPU."""
    gpu = resource_test("r", names, patterns)
    container = (f"has(c.resources) && ("
                 f"(has(c.resources.limits) && c.resources.limits.exists(r, {gpu})) || "
                 f"(has(c.resources.requests) && c.resources.requests.exists(r, {gpu})))")
    return (f"(has({_SPEC}.containers) && {_SPEC}.containers.exists(c, {container})) || "
            f"(has({_SPEC}.initContainers) && {_SPEC}.initContainers.exists(c, {container}))")


def kai_expression() -> str:
    """CEL: the pod (or a built-in kind's pod template) carries a KAI-Scheduler GPU
    fraction annotation (``gpu-fraction``, ``gpu-memory``)."""
    def annotated(meta: str) -> str:
        a = f"{meta}.annotations"
        return f"({_has(a)} && ('gpu-fraction' in {a} || 'gpu-memory' in {a}))"
    return (f"(request.kind.kind == 'Pod' ? {annotated('object.metadata')} : "
            f"request.kind.kind == 'CronJob' ? "
            f"{annotated('object.spec.jobTemplate.spec.template.metadata')} : "
            f"{annotated('object.spec.template.metadata')})")


def claims_expression() -> str:
    """CEL over the pod spec placeholder: it names DRA claims or claim templates."""
    return f"(has({_SPEC}.resourceClaims) && size({_SPEC}.resourceClaims) > 0)"


def claim_expression(classes: list[str]) -> str:
    """CEL over a ResourceClaim or ResourceClaimTemplate: a device request (or one of its
    firstAvailable alternatives) asks one of ``classes``."""
    listed = string_list(classes)
    request = (f"(has(r.exactly) && r.exactly.deviceClassName in {listed}) || "
               f"(has(r.firstAvailable) && r.firstAvailable.exists(f, "
               f"f.deviceClassName in {listed}))")
    specs = ("(request.kind.kind == 'ResourceClaimTemplate' ? "
             "(has(object.spec.spec) ? [object.spec.spec] : []) : [object.spec])")
    return (f"{specs}.exists(s, has(s.devices) && has(s.devices.requests) && "
            f"s.devices.requests.exists(r, {request}))")


def tolerates_expression(keys: list[str]) -> str:
    """CEL over the pod spec placeholder: a toleration names a GPU taint key."""
    return (f"(has({_SPEC}.tolerations) && {_SPEC}.tolerations.exists(t, "
            f"has(t.key) && t.key in {string_list(keys)}))")


def with_spec(expr: str, spec: str) -> str:
    return expr.replace(_SPEC, spec)


def for_pod_spec(test: Callable[[str], str], configured: Iterable[WorkloadKind] = ()) -> str:
    """Apply ``test`` to the pod spec(s) of whichever kind the request is about.

    For a built-in kind the spec is picked once into a one-element list so the test is
    written once and binds it as ``s``; a training kind's templates are gathered into a
    list the same way (a list's items, a map's values). A template missing on the way gives
    false, never an evaluation error, which failurePolicy Fail would turn into a
    rejection.
    """
    template = ("has(object.spec.template) && has(object.spec.template.spec) ? "
                "[object.spec.template.spec] : []")
    cron = ("has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec) && "
            "has(object.spec.jobTemplate.spec.template) && "
            "has(object.spec.jobTemplate.spec.template.spec) ? "
            "[object.spec.jobTemplate.spec.template.spec] : []")
    specs = (f"(request.kind.kind == 'CronJob' ? ({cron}) : ({template}))")
    for group, kind, listed in reversed([*((b.group, b.kind, _crd_specs(b))
                                            for b in CRD_KINDS),
                                          *((w.group, w.kind, _configured_specs(w))
                                            for w in configured)]):
        specs = (f"(request.kind.group == {_quote(group)} && request.kind.kind == "
                 f"{_quote(kind)}) ? ({listed}) : {specs}")
    # A pod first: nearly every request sent is a pod's, and the API server evaluates
    # this for each of them before calling the webhook (a pod then costs two string
    # comparisons here, not one per kind).
    specs = (f"((request.kind.group == '' && request.kind.kind == 'Pod') ? [object.spec] : "
             f"{specs})")
    return f"{specs}.exists(s, {test('s')})"


def _has(expr: str) -> str:
    """``has()`` of every field on the way to ``expr`` (after its root variable)."""
    head, *keys = expr.split(".")
    out, cur = [], head
    for k in keys:
        cur = f"{cur}.{k}"
        out.append(f"has({cur})")
    return " && ".join(out)


def _specs(*path: str, shape: str = "list") -> str:
    """CEL for the list of pod specs at ``path`` (from ``object``), where one ``*``
    stands for every item of a list (``shape`` list), the values of a map (map), or
    either (any: told apart when evaluated). Empty when a level is missing."""
    if "*" not in path:
        at = ".".join(("object", *path))
        return f"({_has(at + '.spec')} ? [{at}.spec] : [])"
    i = path.index("*")
    items = ".".join(("object", *path[:i]))
    rest = ".".join(("v", *path[i + 1:]))
    values = {"list": items, "map": f"{items}.map(k, {items}[k])",
              "any": f"(type({items}) == map ? {items}.map(k, {items}[k]) : {items})"}[shape]
    keep = _has(rest + ".spec")
    return (f"({_has(items)} ? {values}.filter(v, {keep}).map(v, {rest}.spec) : [])")


def _configured_specs(w: WorkloadKind) -> str:
    return " + ".join(_specs(*parse_pointer(r.template), shape="any") for r in w.roles)


def _crd_specs(b: BuiltIn) -> str:
    """CEL for the pod specs of a built-in training kind, from the places its reader finds
    them (``BuiltIn.templates``); a TrainJob's and an Argo step's are made up of their
    containers."""
    t = b.templates
    if t.made_of == "resources":
        res = ".".join(("object", *t.paths[0]))
        return f"({_has(res)} ? [{{'containers': [{{'resources': {res}}}]}}] : [])"
    if t.made_of == "steps":
        at = ".".join(("object", *t.paths[0]))
        containers = ("(has(t.container) ? [t.container] : []) + "
                      "(has(t.script) ? [t.script] : []) + "
                      "(has(t.containerSet) && has(t.containerSet.containers) ? "
                      "t.containerSet.containers : [])")
        return f"({_has(at)} ? {at}.map(t, {{'containers': {containers}}}) : [])"
    return " + ".join(_specs(*path, shape=t.shape) for path in t.paths)


def exemption_expression(users: list[str], groups: list[str], accounts: list[str]) -> str:
    """CEL that is false for a request the policy exempts by user, group or account."""
    terms = []
    if users or accounts:
        terms.append(f"(has(request.userInfo.username) && request.userInfo.username in "
                     f"{string_list([*users, *accounts])})")
    if groups:
        terms.append(f"(has(request.userInfo.groups) && "
                     f"request.userInfo.groups.exists(g, g in {string_list(groups)}))")
    return f"!({' || '.join(terms)})" if terms else ""
