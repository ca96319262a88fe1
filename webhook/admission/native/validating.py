"""A scope's ValidatingAdmissionPolicies, one per mode of its rules: each finding in the
webhook's words, the mutating phase's rules first and the validating phase's (the
maximums) only when no enforced finding of the first refused the pod, as the webhook
runs them (``webhook.engine.mutate``, ``webhook.engine.validate``)."""

from __future__ import annotations

from typing import Any

from webhook.admission.native.cel import (
    CONTAINER_LISTS,
    bind,
    covers,
    device_path,
    devices,
    env,
    gpu_label,
    is_harmless,
    is_neutral,
    is_visible,
    label,
    privileged_how,
    quote,
    shown_entry,
    within,
)
from webhook.admission.native.scoped import API_VERSION, POD_RULES, Scoped, var, words
from webhook.engine import messages
from webhook.policy.apiserver.cel import string_list
from webhook.policy.model import Mode, Rule, TolerationPolicy

MUTATE_RULES = (Rule.TENANT_REQUIRED, Rule.GPU_QUANTITY, Rule.VISIBLE_DEVICES,
                 Rule.ALLOWED_RESOURCES, Rule.PRIVILEGED, Rule.DEVICE_HOST_PATHS,
                 Rule.NON_GPU_TOLERATIONS)
# The validating phase's rules: the webhook checks them on the mutated pod.
VALIDATE_RULES = (Rule.MAX_PER_CONTAINER, Rule.MAX_PER_POD)
ACTIONS = {Mode.ENFORCE: "Deny", Mode.WARN: "Warn", Mode.AUDIT: "Audit"}


class Validating(Scoped):
    """The scope's ValidatingAdmissionPolicies."""

    # -------------------------------------------------------------- validating
    def validating(self, suffix: str, mode: Mode, rules: list[Rule]) -> dict[str, Any]:
        """The policy of ``mode``'s findings. As through the webhook: the mutating phase's
        rules first, and the validating phase's (the maximums) only when no finding of
        the first refused the pod (the webhook then never reaches its second phase)."""
        variables = [{"name": "here", "expression": self.scope.here},
                     *self._gpu_variables(),
                     {"name": "subject", "expression": self.subject}]
        if Rule.PRIVILEGED in rules or Rule.DEVICE_HOST_PATHS in rules:
            variables.append({"name": "reach", "expression": self._reach()})
        if any(r in VALIDATE_RULES for r in rules):
            variables += self._ask_variables()
        for rule in rules:
            expr = self.findings(rule)
            assert expr is not None
            variables.append({"name": var(rule.value), "expression": expr})

        def joined(phase: tuple[Rule, ...], of: Mode) -> str:
            found = [f"variables.{var(r.value)}" for r in rules
                     if r in phase and self.policy.mode_for(r, self.tenant) is of]
            return " + ".join(found) if found else "[]"

        refused = joined(MUTATE_RULES, Mode.ENFORCE)
        second = joined(VALIDATE_RULES, mode)
        findings = (f"{joined(MUTATE_RULES, mode)} + "
                    f"(size({refused}) > 0 ? [] : {second})") if second != "[]" else \
            joined(MUTATE_RULES, mode)
        variables.append({"name": "findings",
                          "expression": f"!variables.here ? [] : {findings}"})
        return {"apiVersion": API_VERSION, "kind": "ValidatingAdmissionPolicy",
                "metadata": self._meta(suffix),
                "spec": {"failurePolicy": self.validating_failure,
                         "matchConstraints": {"resourceRules": POD_RULES},
                         "matchConditions": self._conditions(),
                         "variables": variables,
                         "validations": [{
                             "expression": "size(variables.findings) == 0",
                             "messageExpression": "variables.findings.join(' ')",
                             "reason": "Forbidden"}]}}

    def findings(self, rule: Rule) -> str | None:
        """CEL for the list of ``rule``'s findings, or None where the rule has nothing to
        check in this scope."""
        t = self.tenant
        if rule is Rule.ALLOWED_RESOURCES:
            if t is None or t.allowed_resources is None:
                return None
            allowed = sorted(t.allowed_resources)
            # one_of() of the allowed names is a constant: written by the function.
            text = words(lambda r: messages.resource_not_allowed(r, t.name, allowed), "r")
            return self._per_container(lambda key, c: (
                # A count refused as too large is not checked further, as in the webhook.
                f"{self._gpu(c)}.filter(r, !(r in {string_list(allowed)}) && "
                f"{_huge_field(c)} == '')"
                f".map(r, {self._finding(rule, text, gpu_label(key, c))})"))
        if rule in VALIDATE_RULES:
            return self._maximum(rule)
        if rule is Rule.TENANT_REQUIRED:
            if t is not None or self.policy.unassigned_allowed:
                return None
            text = words(lambda ns: messages.no_tenant(ns, self.policy.name),
                         "request.namespace")
            return f"variables.gpu ? [{self._finding(rule, text)}] : []"
        if rule is Rule.GPU_QUANTITY:
            return self._per_container(lambda key, c: self._huge(rule, key, c))
        if rule is Rule.NON_GPU_TOLERATIONS:
            if self.policy.non_gpu_tolerations is not TolerationPolicy.DENY or not self.keys:
                return None
            keys = ("object.spec.tolerations.filter(t, {g}).map(t, t.key)"
                    .format(g=self._gpu_key("t")))
            found = bind("ks", keys, "lists.range(size(ks)).filter(i, ks.indexOf(ks[i]) == i)"
                         ".map(i, ks[i]).sort().join(', ')")
            text = words(lambda k: messages.tolerates_gpu_taint([k]), found)
            return (f"!variables.gpu && has(object.spec.tolerations) && "
                    f"object.spec.tolerations.exists(t, {self._gpu_key('t')}) ? "
                    f"[{self._finding(rule, text)}] : []")
        if t is None:
            return None
        routes = t.routes
        if rule is Rule.VISIBLE_DEVICES:
            if routes.visible_devices != "deny":
                return None
            return self._per_container(lambda key, c: bind(
                "risky", f"{env(c)}.filter(e, {is_visible('e')} && (size({self._gpu(c)}) > 0 "
                f"? !{is_neutral('e')} : !{is_harmless('e')}))",
                f"size(risky) == 0 ? [] : [size({self._gpu(c)}) > 0 ? "
                f"{self._finding(rule, words(messages.visible_devices_charged, shown_entry('risky[size(risky) - 1]')), label(key, c))} : "  # noqa: E501
                f"{self._finding(rule, words(messages.visible_devices_uncharged, shown_entry('risky[size(risky) - 1]')), label(key, c))}]"))  # noqa: E501
        if rule is Rule.PRIVILEGED:
            if not routes.privileged:
                return None
            text = words(messages.privileged, "how", "variables.reach")
            return "variables.reach == '' ? [] : " + self._per_container(
                lambda key, c: bind("how", privileged_how(c), "how == '' ? [] : ["
                                    + self._finding(rule, text, label(key, c)) + "]"))
        if rule is Rule.DEVICE_HOST_PATHS:
            if not routes.device_host_paths:
                return None
            text = words(messages.device_host_path, "v.name", "v.hostPath.path",
                         "variables.reach")
            return (f"variables.reach == '' || !has(object.spec.volumes) ? [] : "
                    f"object.spec.volumes.filter(v, {device_path('v')})"
                    f".map(v, {self._finding(rule, text)})")
        return None

    def _maximum(self, rule: Rule) -> str | None:
        """The per-container and per-pod caps (``webhook.engine.gpu.check_maximums``), in
        GPU-equivalents. Not compiled where HAMi shares GPUs (a vGPU's share is read from
        its memory and cores resources: the webhook decides)."""
        t = self.tenant
        if t is None or self.policy.hami is not None:
            return None
        cap = t.max_per_container if rule is Rule.MAX_PER_CONTAINER else t.max_per_pod
        if cap is None:
            return None
        shown, gpus = messages.num(cap), messages.gpus_of(cap)
        if rule is Rule.MAX_PER_CONTAINER:
            def one(key: str, c: str) -> str:
                ask = f"variables.{key}_asks[ci]"
                rs = f"g.filter(r, variables.{key}_counts[ci][g.indexOf(r)] != 0.0)"
                ns = f"variables.{key}_counts[ci].filter(n, n != 0.0)"
                what = devices(rs, ns, ask, self._weight)
                fewer = within(rs, cap, self._weight, shown, gpus)
                text = words(lambda w, f: messages.per_container_max(0, t.name, cap, w, f),
                             what, fewer)
                return (f"{ask} > {float(cap)!r} && !{self._skipped(rule)} ? "
                        f"[{self._finding(rule, text, gpu_label(key, c))}] : []")
            return self._per_container(one)
        rs, ns = "variables.pod_asked", "variables.pod_asked_counts"
        what = devices(rs, ns, "variables.pod_ask", self._weight)
        fewer = within(rs, cap, self._weight, shown, gpus)
        text = words(lambda w, f: messages.per_pod_max(0, t.name, cap, w, f), what, fewer)
        return (f"variables.pod_ask > {float(cap)!r} && !{self._skipped(rule)} ? "
                f"[{self._finding(rule, text)}] : []")

    def _huge(self, rule: Rule, key: str, c: str) -> str:
        """A count core validation lets through that no node has (``gpu_count``'s
        "far more devices"): its limit named first, as the webhook does."""
        def shown(v: str) -> str:  # _show(): the value as Python's repr() quotes it
            return (f"\"'\" + (size({v}) > 40 ? {v}.substring(0, 40) + '...' : {v}) "
                    f"+ \"'\"")

        lim = f"(has({c}.resources) && has({c}.resources.limits) ? {c}.resources.limits : {{}})"
        req = (f"(has({c}.resources) && has({c}.resources.requests) ? "
               f"{c}.resources.requests : {{}})")
        field = _huge_field(c)
        value = f"(f == 'limit' ? {lim}[r] : {req}[r])"
        reason = words(lambda v: f"{v} is far more devices than any node has", shown(value))
        text = words(messages.bad_quantity, "r", "f", reason)
        return (f"{self._gpu(c)}.map(r, " + bind("f", field, f"f == '' ? [] : "
                f"[{self._finding(rule, text, gpu_label(key, c))}]") + ").flatten()")

    def _reach(self) -> str:
        """Why the pod can run on a GPU node, or '' (``routes.pods.reaches_gpu_nodes``);
        '' too for a pod bound to a node, which only the webhook can judge."""
        tols = "(has(object.spec.tolerations) ? object.spec.tolerations : [])"
        if not self.policy.tolerations:
            tolerating = quote("the policy names no GPU node taint, so any node may be a "
                               "GPU node")
        else:
            ws = self.policy.tolerations
            which = "''"
            for w in reversed(ws):
                which = (f"{covers('t', w)} ? (has(t.key) && t.key != '' ? "
                         f"{quote('it tolerates the GPU taint ' + str(w.get('key')))} : "
                         f"'it tolerates every taint') : {which}")
            hit = f"{tols}.filter(t, {' || '.join(covers('t', w) for w in ws)})"
            tolerating = bind("hit", hit, "size(hit) == 0 ? '' : "
                              + bind("t", "hit[0]", which))
        return (f"variables.gpu ? 'it asks for GPUs' : "
                f"has(object.spec.nodeName) && object.spec.nodeName != '' ? '' : {tolerating}")

    def _ask_variables(self) -> list[dict[str, str]]:
        """Each container's GPU counts (parallel to its GPU resources: the limit, else the
        request) and GPU-equivalents, and the pod's: its effective request per resource,
        as Kubernetes computes it (``webhook.k8s.resources.effective_request``)."""
        out = []
        for key, lst in CONTAINER_LISTS:
            lim = "(has(c.resources) && has(c.resources.limits) ? c.resources.limits : {})"
            req = "(has(c.resources) && has(c.resources.requests) ? c.resources.requests : {})"
            # A count refused as too large (gpu-whole-number) counts for nothing here,
            # as the webhook leaves it out of the maximums.
            counts = (f"g.map(r, {_huge_field('c')} != '' ? 0.0 : quantity(r in {lim} ? "
                      f"{lim}[r] : {req}[r]).asApproximateFloat())")
            out.append({"name": f"{key}_counts", "expression":
                        f"lists.range(size({lst})).map(ci, {self._bound(key, lst, counts)})"})
            out.append({"name": f"{key}_asks", "expression": (
                f"lists.range(size({lst})).map(ci, ([0.0] + lists.range(size("
                f"variables.{key}_gpu[ci])).map(j, variables.{key}_counts[ci][j] * "
                f"{self._weight(f'variables.{key}_gpu[ci][j]')})).sum())")})
        sidecar = "(has({l}[k].restartPolicy) && {l}[k].restartPolicy == 'Always')"
        inits = CONTAINER_LISTS[0][1]
        side = sidecar.format(l=inits)

        def amount(key: str, k: str, r: str) -> str:
            return (f"(variables.{key}_gpu[{k}].exists(x, x == {r}) ? variables.{key}_counts"
                    f"[{k}][variables.{key}_gpu[{k}].indexOf({r})] : 0.0)")
        apps = CONTAINER_LISTS[1][1]
        steady = (f"([0.0] + lists.range(size({apps})).map(k, {amount('containers', 'k', 'r')})"
                  f").sum() + ([0.0] + lists.range(size({inits})).filter(k, {side})"
                  f".map(k, {amount('initContainers', 'k', 'r')})).sum()")
        peak = (f"([0.0] + lists.range(size({inits})).filter(k, !{side}).map(k, "
                f"{amount('initContainers', 'k', 'r')} + ([0.0] + lists.range(k).filter("
                f"q, {sidecar.format(l=inits).replace('[k]', '[q]')}).map(q, "
                f"{amount('initContainers', 'q', 'r')})).sum())).max()")
        # The resources in the order the webhook's effective request holds them: the app
        # containers', the sidecars', the plain init containers'.
        order = (f"lists.range(size({apps})).map(k, variables.containers_gpu[k]).flatten() + "
                 f"lists.range(size({inits})).filter(k, {side}).map(k, "
                 f"variables.initContainers_gpu[k]).flatten() + "
                 f"lists.range(size({inits})).filter(k, !{side}).map(k, "
                 f"variables.initContainers_gpu[k]).flatten()")
        out.append({"name": "pod_resources", "expression": bind(
            "all", order, "lists.range(size(all)).filter(i, all.indexOf(all[i]) == i)"
            ".map(i, all[i])")})
        larger = bind("st", steady, bind("pk", peak, "st > pk ? st : pk"))
        out.append({"name": "pod_counts",
                    "expression": f"variables.pod_resources.map(r, {larger})"})
        out.append({"name": "pod_asked", "expression": (
            "lists.range(size(variables.pod_resources)).filter(i, variables.pod_counts[i] "
            "!= 0.0).map(i, variables.pod_resources[i])")})
        out.append({"name": "pod_asked_counts", "expression": (
            "variables.pod_counts.filter(n, n != 0.0)")})
        out.append({"name": "pod_ask", "expression": (
            f"([0.0] + lists.range(size(variables.pod_asked)).map(i, "
            f"variables.pod_asked_counts[i] * {self._weight('variables.pod_asked[i]')})).sum()")})
        holders = ("(variables.initContainers_asks + variables.containers_asks)"
                   ".filter(a, a > 0.0)")
        t = self.tenant
        if t is not None and t.max_per_container is not None and t.max_per_pod is not None:
            top = max(t.max_per_container, t.max_per_pod)
            out.append({"name": "one_holder", "expression": bind(
                "hs", holders, f"size(hs) == 1 && hs[0] == variables.pod_ask && "
                f"variables.pod_ask > {float(top)!r}")})
        return out

    def _skipped(self, rule: Rule) -> str:
        """CEL: the finding of ``rule`` says nothing the other maximum's does not (one
        container holds the whole ask, over both caps: the tighter one is said;
        ``webhook.engine.gpu.check_maximums``)."""
        t = self.tenant
        if t is None or t.max_per_container is None or t.max_per_pod is None:
            return "false"
        tighter, looser = ((Rule.MAX_PER_POD, Rule.MAX_PER_CONTAINER)
                           if t.max_per_pod < t.max_per_container
                           else (Rule.MAX_PER_CONTAINER, Rule.MAX_PER_POD))
        severity = {Mode.AUDIT: 0, Mode.WARN: 1, Mode.ENFORCE: 2}
        if rule is looser and severity[self.policy.mode_for(looser, t)] <= \
                severity[self.policy.mode_for(tighter, t)]:
            return "variables.one_holder"
        return "false"


def _huge_field(c: str) -> str:
    """CEL over container ``c`` and resource ``r``: 'limit' or 'request', the half whose
    count is 1e16 or more (the limit first), or ''."""
    def huge(v: str) -> str:
        return f"quantity({v}).compareTo(quantity('1e16')) >= 0"
    lim = f"(has({c}.resources) && has({c}.resources.limits) ? {c}.resources.limits : {{}})"
    req = f"(has({c}.resources) && has({c}.resources.requests) ? {c}.resources.requests : {{}})"
    return (f"(r in {lim} && {huge(lim + '[r]')} ? 'limit' : "
            f"r in {req} && {huge(req + '[r]')} ? 'request' : '')")
