"""One container's routes to a GPU, and the pod's ``/dev`` mounts: which containers are
given GPUs, ``NVIDIA_VISIBLE_DEVICES`` (given ``void``, removed, or refused) and
privilege as the NVIDIA runtime reads them, and hostPath volumes of ``/dev``. Read by
the checks of a Pod at creation, of the containers ``kubectl debug`` adds, of the final
Pod (the validating webhook) and of running pods (audit)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from webhook.engine import messages
from webhook.engine.decision import Checker
from webhook.engine.target import Target
from webhook.k8s.objects import child_list
from webhook.k8s.patch import Patch
from webhook.policy.model import Rule
from webhook.policy.tenantrules import RouteRules

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOID = "void"  # no devices and no driver libraries: as runc (NVIDIA container toolkit)
NEUTRAL_ENTRY = {"name": VISIBLE_DEVICES, "value": VOID}
# Values that show no GPU: ``void`` and empty (none at all), ``none`` (driver libraries
# only). A list that holds ``void`` anywhere is void to the toolkit, but that is not
# something a user should rely on: only these are left as they are.
HARMLESS = frozenset({VOID, "", "none"})


def describe(key: str, c: dict[str, Any], i: int) -> str:
    name = c.get("name") if isinstance(c.get("name"), str) else f"#{i}"
    label = {"initContainers": "init container", "containers": "container",
             "ephemeralContainers": "ephemeral container"}[key]
    return f'{label} "{name}"'


def charged_containers(target: Target) -> frozenset[str]:
    """The containers (``containers/0``, ``initContainers/1``) given GPUs: by device-plugin
    resources, or by naming a pod claim that asks a GPU class."""
    out = set()
    gpu_claims = {c.entry.name for c in target.claims if c.gpu}
    prefix = target.template.spec_pointer + "/"
    for c in target.containers:
        named = claim_names(c.container)
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


def claim_names(c: dict[str, Any]) -> set[str]:
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
                    shown_entry(env[risky[-1]])), where)
            return
        own = [i for i in hits if env[i] != NEUTRAL_ENTRY]
        if own:
            check.notice(Rule.VISIBLE_DEVICES, messages.visible_devices_removed(
                shown_entry(env[own[-1]])), where)
        patch.remove_indices(c, "env", cptr, hits)
        return
    risky = [i for i in hits if not harmless(env[i])]
    if rules.visible_devices == "deny" and risky:
        check.report(Rule.VISIBLE_DEVICES, messages.visible_devices_uncharged(
            shown_entry(env[risky[-1]])), where)
        return
    if not hits:
        patch.append(c, "env", cptr, dict(NEUTRAL_ENTRY))
        return
    if risky:
        check.notice(Rule.VISIBLE_DEVICES, messages.visible_devices_voided(
            shown_entry(env[risky[-1]])), where)
    for i in hits:
        if env[i] != NEUTRAL_ENTRY:
            _replace(patch, env, f"{cptr}/env", i, dict(NEUTRAL_ENTRY))


def visible_devices_set(check: Checker, c: dict[str, Any], cptr: str, where: str,
                        charged: bool) -> None:
    """One container of the final Pod, checked only: one given no GPU that sets the
    variable to show GPUs, one given GPUs that sets it at all."""
    env = child_list(c, "env", cptr) or []
    hits = [e for e in env if isinstance(e, dict) and e.get("name") == VISIBLE_DEVICES]
    own = [e for e in hits if e != NEUTRAL_ENTRY]  # as the mutating webhook's deny reads it
    if charged and own:
        check.report(Rule.VISIBLE_DEVICES, messages.visible_devices_charged(
            shown_entry(own[-1])), where)
    elif not charged and hits and not harmless(hits[-1]):
        check.report(Rule.VISIBLE_DEVICES, messages.visible_devices_uncharged(
            shown_entry(hits[-1])), where)


def harmless(entry: dict[str, Any]) -> bool:
    value = entry.get("value")
    return "valueFrom" not in entry and (value is None or (
        isinstance(value, str) and value.strip().lower() in HARMLESS))


def shown_entry(entry: dict[str, Any]) -> str:
    if entry.get("valueFrom") is not None:
        return "from valueFrom"
    return f'"{entry.get("value", "")}"'


def _replace(patch: Patch, lst: list[Any], ptr: str, i: int, value: Any) -> None:
    lst[i] = value
    patch.ops.append({"op": "replace", "path": f"{ptr}/{i}", "value": dict(value)})


def report_privileged(check: Checker, rules: RouteRules,
                      containers: Iterable[tuple[str, int, dict[str, Any]]],
                      reach: str) -> None:
    if not rules.privileged:
        return
    for key, i, c in containers:
        how = privileged(c)
        if how is not None:
            check.report(Rule.PRIVILEGED, messages.privileged(how, reach),
                         describe(key, c, i))


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
