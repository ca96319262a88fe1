"""The audit of what already runs: what the current (or a candidate) policy would refuse
or change among the GPU pods and workloads of a cluster, and the PolicyReports that say
so. Shared by ``gpu-webhook audit`` (one shot, through the kubeconfig) and the server's
periodic audit (the leader replica, every few minutes).

Each object goes through the admission pipeline itself (:func:`through_both`: mutating,
the patch applied, validating with quota), so it is decided exactly as the webhook
would decide its creation today. Pods are admitted oldest first into one usage store:
after a cap is lowered, the pods beyond it (the newest) are the ones listed as over it.
Workloads (Deployments, StatefulSets, Jobs) are checked on their own, so only what can
never fit, or breaks a rule, is reported for them; their pods are counted as pods.
Audit asks as a plain developer: exemptions by user or group are not known afterwards.

The reports are ``wgpolicyk8s.io/v1alpha2`` PolicyReports, the group Kyverno writes by
default (``openreports.io/v1alpha1`` only with its ``--openreportsEnabled`` flag), so
what reads Kyverno's reports (Policy Reporter, dashboards) reads these: one report per
namespace, named ``gpu-webhook``, with a result per finding naming the object it
concerns. Enforce- and audit-mode findings are ``fail`` (as Kyverno reports an Audit
policy's violations), warn-mode ones ``warn``; the mode is in the result's properties.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.admission.offline import Outcome, through_both
from webhook.engine.charge import TERMINAL_PHASES
from webhook.engine.routes.held import held
from webhook.engine.routes.sights import NodeLookup, no_nodes
from webhook.engine.target import NamespaceLabels
from webhook.engine.users import recorded_on
from webhook.k8s.identity import ObjectId
from webhook.k8s.objects import MalformedObject
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.users import CONTROLLER_MANAGER
from webhook.quota.store import MemoryStore

REPORT_GROUP = "wgpolicyk8s.io"
REPORT_VERSION = "v1alpha2"
REPORT_PLURAL = "policyreports"
REPORT_NAME = "gpu-webhook"
SOURCE = "gpu-webhook"
REPORT_LABELS = {"app.kubernetes.io/managed-by": "gpu-webhook"}


@dataclass(frozen=True, slots=True)
class RuleFinding:
    rule: str
    mode: str  # enforce, warn, audit
    message: str


@dataclass(frozen=True, slots=True)
class Finding:
    subject: str  # "pod team-a/trainer-0", "deployment team-a/web"
    # "refused", "holds" (a route to a GPU that skips the GPU request, held on its node:
    # engine.routes.held) or "changed" (admitted, with a patch, warnings or audit notes)
    verdict: str
    detail: str  # the denial, or the changes and warnings
    ref: dict[str, str]  # apiVersion, kind, namespace, name, uid of the object
    rules: tuple[RuleFinding, ...] = ()  # each rule's finding, in its mode


def audit(policy: CompiledPolicy, pods: Iterable[dict[str, Any]],
          workloads: Iterable[dict[str, Any]], labels: NamespaceLabels,
          node_gpus: NodeLookup = no_nodes) -> list[Finding]:
    """Every object the policy would refuse (or admit changed), in the order decided,
    and the pods that hold a route to a GPU on their node (``node_gpus``: which nodes
    carry GPUs; unknown nodes are taken to)."""
    out: list[Finding] = []
    store = MemoryStore(ttl=1e9)  # reservations stand for the pods: they never expire here
    live = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL_PHASES]
    idents = {id(p): ObjectId.of(p) for p in live}
    live.sort(key=lambda p: (idents[id(p)].created, idents[id(p)].namespace,
                             idents[id(p)].name))
    for pod in live:
        out += _decided(pod, policy, labels, store, node_gpus)
    for obj in workloads:
        out += _decided(obj, policy, labels, MemoryStore())
    return out


def _decided(obj: dict[str, Any], policy: CompiledPolicy, labels: NamespaceLabels,
             store: MemoryStore, node_gpus: NodeLookup = no_nodes
             ) -> list[Finding]:
    meta, ident = obj["metadata"], ObjectId.of(obj)
    subject = f"{str(obj['kind']).lower()} {ident.namespace}/{ident.name}"
    ref = {"apiVersion": str(obj["apiVersion"]), "kind": str(obj["kind"]),
           "namespace": ident.namespace, "name": ident.name, "uid": ident.uid}
    spec = obj.get("spec")
    if obj["kind"] == "Pod" and isinstance(spec, dict):
        # Where the scheduler bound it, and the containers kubectl debug added: not part
        # of the pod's creation (its routes are what held() reads).
        spec = {k: v for k, v in spec.items() if k not in ("nodeName", "ephemeralContainers")}
    stripped = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "spec": spec,
                "metadata": {k: meta[k] for k in ("name", "namespace", "labels",
                                                   "annotations", "ownerReferences")
                             if k in meta}}
    req = parse_review(orjson.dumps(request_review(stripped, uid=ident.uid or subject,
                                                   username=_creator(ident))))
    o: Outcome = through_both(req, policy, labels, store)
    rules = tuple(RuleFinding(f.rule.value, f.mode.value, f.message)
                  for d in o.decisions for f in d.findings)
    holds = _held(obj, policy, labels, node_gpus, subject)
    if holds:
        rules += holds
        detail = "; ".join(r.message for r in holds)
        verdict = "holds"
        if not o.allowed:
            detail, verdict = f"{o.message}; {detail}", "refused"
        return [Finding(subject, verdict, detail, ref, rules)]
    if not o.allowed:
        return [Finding(subject, "refused", o.message, ref, rules)]
    changes = o.mutating.mutations
    audited = [f"audit: {r.message}" for r in rules if r.mode == "audit"]
    if changes or o.warnings or audited:
        detail = "; ".join(([f"would change: {', '.join(changes)}"] if changes else [])
                           + o.warnings + audited)
        return [Finding(subject, "changed", detail, ref, rules)]
    return []


def _creator(ident: ObjectId) -> str:
    """Who the object is decided as created by: the user recorded on it (userQuota
    charges it to them, as the cache does); for a controller's pod that records no one,
    the controller manager (charged to no user, as the cache charges it)."""
    user = recorded_on(ident)
    if user is not None:
        return user
    if ident.controller is not None:
        return CONTROLLER_MANAGER
    return "developer"  # request_review's default: a bare pod's unknown creator


def _held(obj: dict[str, Any], policy: CompiledPolicy, labels: NamespaceLabels,
          node_gpus: NodeLookup, subject: str) -> tuple[RuleFinding, ...]:
    if obj["kind"] != "Pod":
        return ()
    try:
        found = held(policy, obj, labels, node_gpus)
    except MalformedObject:
        return ()  # the pipeline has said so
    ns = ObjectId.of(obj).namespace
    tenant = policy.tenant_for(ns, labels(ns))
    return tuple(RuleFinding(rule.value, policy.mode_for(rule, tenant).value,
                             f"{subject}: {text} [rule {rule.value}, tenant "
                             f"{tenant.name if tenant else '-'}]")
                 for rule, text in found)


# --- PolicyReports ----------------------------------------------------------------------

_RESULT = {"enforce": "fail", "audit": "fail", "warn": "warn"}


def results(f: Finding, policy: str, now: float) -> list[dict[str, Any]]:
    """The PolicyReport results of one finding: one per rule finding (mutations alone
    are not violations and make none)."""
    seconds = int(now)
    return [{"source": SOURCE, "policy": policy, "rule": r.rule,
             "result": _RESULT.get(r.mode, "warn"), "scored": True,
             "message": r.message, "properties": {"mode": r.mode},
             "resources": [f.ref],
             "timestamp": {"seconds": seconds, "nanos": 0}}
            for r in f.rules]


def policy_reports(findings: Iterable[Finding], policy: str, now: float
                   ) -> dict[str, dict[str, Any]]:
    """namespace -> its PolicyReport, for the namespaces with findings."""
    by_ns: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        rs = results(f, policy, now)
        if rs and f.ref["namespace"]:
            by_ns.setdefault(f.ref["namespace"], []).extend(rs)
    return {ns: policy_report(ns, rs) for ns, rs in sorted(by_ns.items())}


def policy_report(namespace: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    summary = {k: sum(r["result"] == k for r in results)
               for k in ("pass", "fail", "warn", "error", "skip")}
    return {"apiVersion": f"{REPORT_GROUP}/{REPORT_VERSION}", "kind": "PolicyReport",
            "metadata": {"name": REPORT_NAME, "namespace": namespace,
                         "labels": dict(REPORT_LABELS)},
            "results": results, "summary": summary}


def same_results(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Whether two reports' results say the same, whenever each was found."""
    def strip(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "timestamp"} for r in rs]
    return strip(a) == strip(b)
