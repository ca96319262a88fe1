"""The CEL the native admission policies (:mod:`webhook.admission.native.policies`) are
made of: a Pod's containers and their GPU resources, a toleration that covers a policy
toleration, ``NVIDIA_VISIBLE_DEVICES`` entries, privilege, ``/dev`` mounts, and the
words of the webhook's messages for them (:mod:`webhook.engine.messages`), so that a
developer refused by the API server reads what the webhook would have said.

What the API server's CEL (v1.37) allows shapes this file: no ``cel.bind`` (:func:`bind`
maps a one-item list instead), no ``quantity(...).sign()`` (``compareTo``),
``jsonpatch.escapeKey`` and the ``JSONPatch``/``Object`` types only in a mutation's own
expression (not in its variables), no line break in a ``messageExpression`` (the
``message`` is shown instead), and a JSON Patch value cannot be a list of the object's
own typed items (entries are written one by one).

Each function returns CEL text over the names it is given (a container ``c``, an env
entry ``e``, ...). The Python it mirrors is named in each docstring: a change there is a
change here, and ``tests/e2e/test_e2e_native_equivalence.py`` fails until both agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from webhook.engine.routes.containers import HARMLESS, VISIBLE_DEVICES, VOID
from webhook.policy.apiserver.cel import resource_test, string_list

INITS = "(has(object.spec.initContainers) ? object.spec.initContainers : [])"
APPS = "(has(object.spec.containers) ? object.spec.containers : [])"
# (key, CEL list) of the containers, in the order the webhook walks them.
CONTAINER_LISTS = (("initContainers", INITS), ("containers", APPS))


def quote(s: str) -> str:
    """A CEL string literal of ``s`` (policy words: names, keys, messages)."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def bind(name: str, value: str, expr: str) -> str:
    """``expr`` with ``name`` bound to ``value``, evaluated once (the API server's CEL has
    no ``cel.bind``: a one-item list's ``map`` binds instead)."""
    return f"[{value}].map({name}, {expr})[0]"


def _map(c: str, key: str) -> str:
    return f"(has({c}.resources) && has({c}.resources.{key}) ? {c}.resources.{key} : {{}})"


def nonzero(q: str) -> str:
    """CEL: the quantity string ``q`` is not zero (``webhook.k8s.quantity.is_zero``)."""
    return f"quantity({q}).compareTo(quantity('0')) != 0"


def gpu_names(c: str, names: list[str], patterns: list[str]) -> str:
    """The GPU resources container ``c`` asks for, a nonzero value in its limits, then
    those only in its requests (``webhook.k8s.resources.gpu_containers``: the API server
    writes a ResourceList with its keys sorted, so the webhook reads them so). Each map is
    read from the object once: a field of ``object`` costs the API server a conversion at
    every access (profiled: most of a policy's CPU)."""
    test = resource_test("r", names, patterns)
    return bind("lim", _map(c, "limits"), bind(
        "req", _map(c, "requests"),
        f"lim.filter(r, ({test}) && {nonzero('lim[r]')}).sort() + "
        f"req.filter(r, !(r in lim && {nonzero('lim[r]')}) && ({test}) && "
        f"{nonzero('req[r]')}).sort()"))


def completion_ops(c: str, ptr: str, gpu: str) -> str:
    """JSON Patch operations writing the missing half of each GPU request/limit pair,
    the value copied as written (``webhook.engine.gpu._complete``). ``ptr``: CEL for
    the container's JSON Pointer; ``gpu``: for its GPU resources (:func:`gpu_names`)."""
    def half(have: str, missing: str, key: str) -> str:
        # A count of 1e16 or more is refused, not completed (the webhook reports it and
        # goes on to the next resource).
        keys = (f"{gpu}.filter(r, r in {have} && !(r in {missing}) && "
                f"quantity({have}[r]).compareTo(quantity('1e16')) < 0)")
        start = (f"(has({c}.resources) && has({c}.resources.{key}) ? [] : "
                 f"[JSONPatch{{op: 'add', path: {ptr} + '/resources/{key}', value: {{}}}}])")
        return bind("keys", keys, f"keys.size() == 0 ? [] : {start} + keys.map(r, "
                    f"JSONPatch{{op: 'add', path: {ptr} + '/resources/{key}/' + "
                    f"jsonpatch.escapeKey(r), value: {have}[r]}})")
    # A container with no GPU resource has nothing written (and its maps are not read).
    body = f"{half('req', 'lim', 'limits')} + {half('lim', 'req', 'requests')}"
    return (f"(size({gpu}) == 0 ? [] : " + bind("lim", _map(c, "limits"), bind(
        "req", _map(c, "requests"), body)) + ")")


def covers(h: str, want: Mapping[str, object]) -> str:
    """Pod toleration ``h`` tolerates everything the policy toleration ``want`` does
    (``webhook.engine.tolerations.covers``)."""
    w_effect = want.get("effect") or ""
    effect = f"(!has({h}.effect) || {h}.effect == '' || {h}.effect == {quote(str(w_effect))})"
    exists = f"(has({h}.operator) && {h}.operator == 'Exists')"
    no_key = f"(!has({h}.key) || {h}.key == '')"
    w_key = want.get("key")
    if (want.get("operator") or "Equal") == "Equal":
        equal = (f"((!has({h}.operator) || {h}.operator == '' || {h}.operator == 'Equal') && "
                 f"(has({h}.value) ? {h}.value : '') == {quote(str(want.get('value') or ''))})")
        keyed = f"({exists} || {equal})"
    else:
        keyed = exists
    same_key = f"{h}.key == {quote(str(w_key))}" if w_key else "false"
    return f"({effect} && ({no_key} ? {exists} : ({same_key} && {keyed})))"


def toleration_value(t: Mapping[str, object]) -> str:
    """A policy toleration as a typed CEL object for a JSON Patch value."""
    fields = []
    for k in ("key", "operator", "value", "effect"):
        v = t.get(k)
        if v:
            fields.append(f"{k}: {quote(str(v))}")
    if t.get("tolerationSeconds") is not None:
        fields.append(f"tolerationSeconds: {int(str(t['tolerationSeconds']))}")
    return f"Object.spec.tolerations{{{', '.join(fields)}}}"


def is_visible(e: str) -> str:
    return f"({e}.name == {quote(VISIBLE_DEVICES)})"


def is_neutral(e: str) -> str:
    """The env entry is exactly ``{name: NVIDIA_VISIBLE_DEVICES, value: void}``."""
    return (f"({is_visible(e)} && has({e}.value) && {e}.value == {quote(VOID)} && "
            f"!has({e}.valueFrom))")


def is_harmless(e: str) -> str:
    """(``webhook.engine.routes.containers.harmless``)"""
    return (f"(!has({e}.valueFrom) && (!has({e}.value) || "
            f"{e}.value.trim().lowerAscii() in {string_list(sorted(HARMLESS))}))")


def shown_entry(e: str) -> str:
    """(``webhook.engine.routes.containers.shown_entry``)"""
    return (f"(has({e}.valueFrom) ? 'from valueFrom' : "
            f"'\"' + (has({e}.value) ? {e}.value : '') + '\"')")


def env(c: str) -> str:
    return f"(has({c}.env) ? {c}.env : [])"


NEUTRAL_VALUE = (f"Object.spec.containers.env{{name: {quote(VISIBLE_DEVICES)}, "
                 f"value: {quote(VOID)}}}")


def privileged_how(c: str) -> str:
    """How the container is privileged, or '' (``...routes.containers.privileged``)."""
    sc = f"{c}.securityContext"
    caps = (f"(has({sc}) && has({sc}.capabilities) && has({sc}.capabilities.add) ? "
            f"{sc}.capabilities.add.filter(x, x.upperAscii() in "
            f"['SYS_ADMIN', 'ALL', 'CAP_SYS_ADMIN', 'CAP_ALL']) : [])")
    return (f"(has({sc}) && has({sc}.privileged) && {sc}.privileged ? "
            f"'securityContext.privileged: true' : " + bind(
                "caps", caps, "caps.size() > 0 ? 'securityContext.capabilities.add: ' + "
                "caps[0] : ''") + ")")


def device_path(v: str) -> str:
    """The hostPath volume's path is ``/``, ``/dev`` or under it
    (``...routes.containers.device_host_paths``)."""
    norm = f"('/' + {v}.hostPath.path.split('/').filter(p, p != '' && p != '.').join('/'))"
    return (f"(has({v}.hostPath) && "
            + bind("n", norm, "n == '/' || n == '/dev' || n.startsWith('/dev/')") + ")")


def label(key: str, c: str) -> str:
    """``container "x"`` as the routes' checks name it (``...routes.containers.describe``)."""
    word = {"initContainers": "init container", "containers": "container"}[key]
    return f"'{word} \"' + {c}.name + '\"'"


def gpu_label(key: str, c: str) -> str:
    """``sidecar container "x"`` as the GPU request checks name it
    (``webhook.k8s.resources.ContainerGPUs.describe``)."""
    if key == "containers":
        return f"'container \"' + {c}.name + '\"'"
    return (f"((has({c}.restartPolicy) && {c}.restartPolicy == 'Always' ? 'sidecar container' "
            f": 'init container') + ' \"' + {c}.name + '\"')")


def num(x: str) -> str:
    """CEL: the double ``x`` as people write a count (``webhook.engine.messages.words.num``:
    2 not 2.0, three decimals at most, trailing zeros dropped). The API server's ``%f``
    groups thousands (1,024.125): the separators are taken out, as Python writes it."""
    fixed = bind("nums", "'%.3f'.format([numx]).replace(',', '')",
                 "nums.endsWith('000') ? nums.substring(0, size(nums) - 4) : "
                 "nums.endsWith('00') ? nums.substring(0, size(nums) - 2) : "
                 "nums.endsWith('0') ? nums.substring(0, size(nums) - 1) : nums")
    return bind("numx", x, f"numx == double(int(numx)) ? string(int(numx)) : {fixed}")


def devices(rs: str, ns: str, gpus: str, weight: Callable[[str], str]) -> str:
    """CEL for ``webhook.engine.messages.placement.devices``: what was asked, in the
    resources named (``rs``, counts ``ns``: parallel lists, zeros left out) and, when
    those are weighed, in GPUs: ``3 nvidia.com/mig-3g.40gb (3 x 0.5 = 1.5 GPUs)``."""
    named = f"lists.range(size({rs})).map(di, {num(f'{ns}[di]')} + ' ' + {rs}[di]).join(' + ')"
    sums = (f"lists.range(size({rs})).map(di, {num(f'{ns}[di]')} + ' x ' + "
            f"{num(weight(f'{rs}[di]'))}).join(' + ')")
    return (f"(size({rs}) == 0 || (size({rs}) == 1 && {weight(f'{rs}[0]')} == 1.0) ? "
            f"{num(gpus)} + ' GPUs' : {named} + ' (' + {sums} + ' = ' + {num(gpus)} + "
            f"({gpus} == 1.0 ? ' GPU' : ' GPUs') + ')')")


def within(rs: str, cap: float, weight: Callable[[str], str], shown: str, gpus: str) -> str:
    """CEL for ``webhook.engine.messages.placement.within``: the most a cap of ``cap``
    GPUs allows, in the resource asked when it is one weighed resource; ``shown`` and
    ``gpus``: the cap as a number and as "N GPUs" (constants)."""
    w = weight(f"{rs}[0]")
    return (f"(size({rs}) == 1 && {w} != 0.0 && {w} != 1.0 ? "
            f"string(int({cap!r} / {w} + 1e-9)) + ' ' + {rs}[0] + {quote(f' ({gpus})')} : "
            f"{quote(shown)})")
