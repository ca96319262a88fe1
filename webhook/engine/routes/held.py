"""The routes to a GPU a running pod of a tenant holds on its node, for ``audit``: the
variable not ``void`` where no GPU was given, privilege, ``/dev`` mounts."""

from __future__ import annotations

from typing import Any

from webhook.engine import messages
from webhook.engine.routes.containers import (
    VISIBLE_DEVICES,
    charged_containers,
    claim_names,
    describe,
    device_host_paths,
    harmless,
    privileged,
    shown_entry,
)
from webhook.engine.routes.sights import NodeLookup, no_nodes
from webhook.engine.target import NamespaceLabels, template_target
from webhook.k8s.identity import ObjectId
from webhook.k8s.objects import child_list
from webhook.k8s.workloads import pod_template
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule


def held(policy: CompiledPolicy, pod_obj: dict[str, Any], labels: NamespaceLabels,
         node_gpus: NodeLookup = no_nodes) -> list[tuple[Rule, str]]:
    """The routes to a GPU a running pod of a tenant holds on its node (for ``audit``):
    containers, ephemeral ones included, that may see GPUs they were not given
    (the variable not ``void``, privilege) and ``/dev`` mounts. A pod on a node known to
    carry no GPU holds none; a pod's ``nodeName`` itself is not one (the scheduler sets
    it too). Raises MalformedObject."""
    namespace = ObjectId.of(pod_obj).namespace
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
    charged = charged_containers(target)
    on = f'on node "{node}"'
    out: list[tuple[Rule, str]] = []
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for i, c in enumerate(child_list(spec, key, "/spec") or []):
            if not isinstance(c, dict):
                continue
            where = describe(key, c, i)
            entries = [e for e in child_list(c, "env", f"/spec/{key}/{i}") or []
                       if isinstance(e, dict) and e.get("name") == VISIBLE_DEVICES]
            # The claims a running pod names are not looked up here: a container naming
            # one is taken to be given its devices (their CDI spec sets the variable).
            if rules.visible_devices != "allow":
                if f"{key}/{i}" in charged or claim_names(c):
                    if entries:
                        out.append((Rule.VISIBLE_DEVICES, messages.holds_visible_devices(
                            where, shown_entry(entries[-1]), on, True)))
                elif not entries or not harmless(entries[-1]):
                    what = shown_entry(entries[-1]) if entries else "its image's value"
                    out.append((Rule.VISIBLE_DEVICES, messages.holds_visible_devices(
                        where, what, on, False)))
            how = privileged(c)
            if rules.privileged and how is not None:
                out.append((Rule.PRIVILEGED, messages.holds_privileged(where, how, on)))
    if rules.device_host_paths:
        for name, path in device_host_paths(spec, "/spec"):
            out.append((Rule.DEVICE_HOST_PATHS, messages.holds_host_path(name, path, on)))
    return out
