"""``gpu-webhook status``: each tenant's GPU quota as the webhook counts it, read from
the cluster once: per tenant, namespace and cap (GPUs, a resource, a product, pods),
used / reserved / limit / free, and the biggest consumers.

The numbers are the webhook's own, computed by :mod:`webhook.quota.status` as for the
GPUQuota objects the webhook keeps current: pods are charged by :func:`charge_of_pod` (what
admission and the watch cache charge), reservations are the live entries of the
ledger ConfigMaps for pods not created yet, as :class:`LedgerStore` counts them. The
report is pure (:func:`report`, over plain objects); :func:`read_cluster` is the one
read, through the kubeconfig, and what it may not read (a developer's account sees its
own namespace, not the ledger) is said in the report, not guessed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from webhook.admission.native import policies as native
from webhook.engine import holding, messages
from webhook.engine.charge import charge_of_pod
from webhook.k8s.identity import ObjectId
from webhook.k8s.objects import label_of
from webhook.libs import kube
from webhook.policy.apiserver import drift
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import GPUPolicy
from webhook.policy.tenantrules import TenantRules
from webhook.quota import status as quota_status
from webhook.quota.budget import spending
from webhook.quota.entries import (
    BORROWED_LABELS,
    BORROWED_PREFIX,
    LEDGER_PREFIX,
    decode,
    decode_borrowed,
)
from webhook.quota.entries import LABELS as LEDGER_LABELS
from webhook.quota.status import Report, Row
from webhook.quota.usage import Usage
from webhook.quota.usagebook import DayBook
from webhook.tools import usage

T = TypeVar("T")

__all__ = ["Cluster", "Report", "Row", "configuration_lines", "forbidden", "leader_line",
           "read_cluster", "read_leader", "report", "table"]


@dataclass(slots=True)
class Cluster:
    """What status reads: pods, namespace labels, ledger ConfigMaps' data by tenant, and
    what could not be read (said in the report)."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    ledgers: dict[str, dict[str, str]] = field(default_factory=dict)
    unread: list[str] = field(default_factory=list)
    borrowed: dict[str, dict[str, str]] = field(default_factory=dict)  # cohort -> data
    # The namespace's GPUQuota objects, read when the account could not read the rest:
    # the webhook's own numbers, counted from what the account may not see.
    quotas: list[dict[str, Any]] = field(default_factory=list)
    # Node name -> its product label value (None: it has none): a bound pod is charged
    # to its node's product, as the webhook's cache charges it.
    nodes: dict[str, str | None] = field(default_factory=dict)
    days: list[DayBook] = field(default_factory=list)  # GPU time kept (GPUUsage)


def report(policy: CompiledPolicy, cluster: Cluster, *, namespace: str | None = None,
           tenant: str | None = None, now: float | None = None) -> Report:
    """The quota of the tenants asked for (all; the one owning ``namespace``; ``tenant``),
    from the cluster's pods and ledger reservations."""
    now = time.time() if now is None else now
    if namespace is not None and cluster.quotas:
        kept = _from_object(policy, cluster, namespace, tenant)
        if kept is not None:
            return _with_holding(kept, [policy.by_name[t] for t in kept.pods])
    if namespace is not None and tenant is not None and namespace not in cluster.namespaces:
        # Told the tenant of a namespace whose labels could not be read (a developer's
        # account): take the namespace to carry the labels that select that tenant.
        labels = policy.labels_selecting(tenant)
        if labels is not None:
            cluster.namespaces[namespace] = labels
    seen, held = Usage(), Usage()
    uids = set()
    for pod in cluster.pods:
        ident = ObjectId.of(pod)
        charge = charge_of_pod(pod, policy, cluster.namespaces.get(ident.namespace),
                               node_product=cluster.nodes.get)
        uid = ident.uid
        uids.add(uid)
        seen.put(uid, charge)
    for name, data in cluster.ledgers.items():
        for key, entry in decode(name, data).items():
            if entry.expires > now and key not in uids:
                held.put(key, entry.charge)
    for data in cluster.borrowed.values():
        for key, entry in decode_borrowed(data, now).items():
            if entry.expires > now and key not in uids:
                held.put(key, entry.charge)
    tenants = _chosen(policy, cluster, namespace, tenant)
    out = _with_holding(quota_status.of(tenants, seen, held, namespace, cluster.unread,
                                        policy, now), tenants)
    chosen = {t.name for t in tenants}
    out.waiting = {t: w for t, w in quota_status.waiting_of(
        cluster.pods, policy, cluster.namespaces.get).items() if t in chosen}
    if any(t.budget is not None for t in tenants):
        # As written by the leader: up to its watermark, an interval behind at most.
        spent = spending(policy, cluster.days, {}, now)
        out.budgets = {t: u for t, u in spent.tenants.items() if t in chosen}
    return out


def _with_holding(r: Report, tenants: list[TenantRules]) -> Report:
    """The report with a line per tenant on how its GPUs are held (maximum runtime, CPU
    and memory per GPU, where its pods are sent)."""
    r.holding = [line for t in tenants if (line := holding.describe(t)) is not None]
    return r


def _from_object(policy: CompiledPolicy, cluster: Cluster, namespace: str,
                 tenant: str | None) -> Report | None:
    """The report from the namespace's GPUQuota object (of ``tenant``, or the one there
    is), when the account could not read what the webhook counts from."""
    objs = [o for o in cluster.quotas if tenant in (None, o["metadata"]["name"])]
    if len(objs) != 1:
        return None
    meta, st = objs[0]["metadata"], objs[0].get("status") or {}
    name = str(st.get("tenant") or meta["name"])
    if name not in policy.by_name:
        return None  # written under another policy: count from the pods instead
    rows = [Row(name, str(c["scope"]), str(c["cap"]), float(c["used"]),
                float(c["reserved"]), float(c["limit"])) for c in st.get("caps") or ()]
    top = [(str(c["owner"]), float(c["gpus"])) for c in st.get("topConsumers") or ()]
    windows = {name: str(st["window"])} if isinstance(st.get("window"), str) else {}
    note = (f"numbers from the webhook's GPUQuota {namespace}/{meta['name']} (updated "
            f"{st.get('updated', '?')}): it counts the pods, namespaces and reservations "
            "this account may not read")
    waiting = ({name: (int(st["waitingPods"]), float(st.get("waitingGpus") or 0))}
               if st.get("waitingPods") else {})
    products = [(str(c["product"]), float(c["gpus"])) for c in st.get("byProduct") or ()]
    return Report(rows, {name: int(st.get("pods") or 0)}, {name: top}, [note],
                  waiting=waiting, windows=windows, products={name: products})


def _chosen(policy: CompiledPolicy, cluster: Cluster, namespace: str | None,
            tenant: str | None) -> list[TenantRules]:
    if tenant is not None:
        found = policy.by_name.get(tenant)
        if found is None:
            raise ValueError(f'no tenant "{tenant}" in policy {policy.name}; its tenants: '
                             f"{messages.one_of(t.name for t in policy.tenants)}")
        return [found]
    if namespace is not None:
        owner = policy.tenant_for(namespace, cluster.namespaces.get(namespace))
        if owner is None:
            unread = namespace not in cluster.namespaces and any(
                u.startswith("namespace labels") for u in cluster.unread)
            raise ValueError(
                f'namespace "{namespace}" belongs to no GPU tenant of policy {policy.name}'
                + (" that it names; its labels (which may select a tenant) could not be "
                   "read: pass --tenant" if unread else ""))
        return [owner]
    return list(policy.tenants)


def table(r: Report) -> str:
    """The report as the table `gpu-webhook status` prints."""
    head = ("TENANT", "SCOPE", "CAP", "USED", "RESERVED", "LIMIT", "FREE")
    body = [(x.tenant, x.scope, x.cap, messages.num(x.used), messages.num(x.reserved),
             messages.num(x.limit), messages.num(x.free)) for x in r.rows]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in [head, *body]]
    if not body:
        lines.append("(no quota caps for these tenants)")
    lines.append("")
    for t, n in r.pods.items():
        top = messages.owners(r.top.get(t, [])) or "none"
        lines.append(f"{t}: {n} GPU {'pod' if n == 1 else 'pods'} running; "
                     f"top consumers: {top}")
    for t, on in r.products.items():
        if on and not any(x.tenant == t and x.cap.startswith("product:") for x in r.rows):
            # No product caps to show it: what runs on each product, in a line.
            lines.append(f"{t}: GPUs in use by product: "
                         + ", ".join(f"{p} {messages.num(g)}" for p, g in on))
    for t, (n, g) in r.waiting.items():
        lines.append(f"{t}: {n} {'pod waits' if n == 1 else 'pods wait'} for GPU quota "
                     f"({messages.num(g)} GPUs asked), released in order as quota frees")
    lines.extend(r.cohorts)
    for t, w in r.windows.items():
        lines.append(f"{t}: quota window {w} applies now" if w else
                     f"{t}: outside its quota windows: its own caps apply")
    lines.extend(quota_status.budget_line(t, b) for t, b in r.budgets.items())
    lines.extend(r.holding)
    for what in r.unread:
        lines.append(f"note: {what}")
    return "\n".join(lines) + "\n"


def _ledgers(api: Any, namespace: str, labels: dict[str, str], prefix: str
             ) -> dict[str, dict[str, str]]:
    """The data of the ledger ConfigMaps of one kind, by the name after ``prefix``."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return {str(cm["metadata"]["name"]).removeprefix(prefix): dict(cm.get("data") or {})
            for cm in kube.list_objects(api, "configmaps", namespace, selector)
            if str(cm["metadata"]["name"]).startswith(prefix)}


def _listed(out: Cluster, read: Callable[[], T], unread: str) -> T | None:
    """What ``read`` lists, or None with the note ``unread`` (``{}``: the API server's
    answer) when the account may not list it: the rest is still reported."""
    try:
        return read()
    except kube.KubeError as exc:
        out.unread.append(unread.format(exc))
        return None


def read_cluster(api: Any, ledger_namespace: str, namespace: str | None,
                 product_label: str) -> Cluster:
    """Pods (of ``namespace``, or all), namespace labels and the ledger ConfigMaps. A
    list the account may not make is noted, and the rest is still reported: a developer
    who may read only their namespace sees its pods, without reservations."""
    out = Cluster()
    try:
        out.pods = kube.list_objects(api, "pods")
    except kube.KubeError as exc:
        if namespace is None:
            raise  # without pods there is no report
        # A developer's account: its own namespace only. The tenant's other namespaces
        # then count as empty: say so rather than show a tenant less used than it is.
        out.pods = kube.list_objects(api, "pods", namespace)
        out.unread.append(f"pods of other namespaces not read ({exc}): tenant-wide USED "
                          f"counts only namespace {namespace}'s pods")
    out.namespaces = _listed(out, lambda: {
        i.name: dict(i.labels) for i in map(ObjectId.of, kube.list_objects(api, "namespaces"))},
        "namespace labels not read ({}): tenants chosen by label selector are not found") or {}
    ledgers = _listed(out, lambda: _ledgers(api, ledger_namespace, LEDGER_LABELS, LEDGER_PREFIX),
                      "quota reservations not read ({}): RESERVED shows 0; pods admitted in "
                      "the last minute may not be counted yet")
    out.ledgers = ledgers or {}
    if ledgers is not None:
        out.borrowed = _listed(out, lambda: _ledgers(api, ledger_namespace, BORROWED_LABELS,
                                                     BORROWED_PREFIX),
                               "borrowed reservations not read ({}): RESERVED of borrowed "
                               "gpus shows 0") or {}
    out.nodes = _listed(out, lambda: {ObjectId.of(n).name: label_of(n, product_label)
                                      for n in kube.list_objects(api, "nodes")},
                        "nodes not read ({}): a running pod allowed several GPU products "
                        "counts on the one admission charged it to, which may not be the "
                        "one it runs on") or {}
    out.days = _listed(out, lambda: usage_days(api),
                       "GPU time not read ({}): budgets are not shown") or []
    if namespace is not None and out.unread:
        # What the webhook keeps for such an account (readable under the namespace's
        # `view`): none there (an older install, no quota) leaves the notes as they are.
        with contextlib.suppress(kube.KubeError):
            out.quotas = kube.CustomObjects(
                api, quota_status.GROUP, quota_status.VERSION, quota_status.PLURAL,
                timeout=15.0).list(namespace=namespace)
    return out


def usage_days(api: Any) -> list[DayBook]:
    """The GPU time kept (none where the CRD is not installed; a day that cannot be
    read left out, as the budgets leave it)."""
    try:
        return usage.read(api)[0]
    except usage.NotKept:
        return []


LEADER_LEASE = "gpu-webhook-leader"  # webhook.server.leading.leader.LEASE


def leader_line(lease: kube.StoredLease | None, now: float, waiting: int) -> str:
    """Who leads, from the leader Lease: the leader releases waiting pods, writes the
    GPUQuota objects and keeps the webhook configurations, so a cluster with none is
    said plainly (and what it leaves undone)."""
    undone = (f"{waiting} waiting {'pod is' if waiting == 1 else 'pods are'} not released, "
              if waiting else "waiting pods would not be released, ")
    undone += ("GPUQuota objects and webhook configurations are not kept (check the "
               "replicas: kubectl -n NAMESPACE get pods,lease)")
    if lease is None:
        return f"leader: none has led yet (no Lease {LEADER_LEASE}): {undone}"
    if not lease.holder:
        return f"leader: none (the last leader released Lease {LEADER_LEASE}): {undone}"
    if lease.renewed is not None:
        age = now - lease.renewed.timestamp()
        # Twice the duration: the holder's clock and this one's are not the same clock.
        if age > 2 * max(lease.duration, 1.0):
            return (f"leader: none (Lease {LEADER_LEASE} last renewed by {lease.holder} "
                    f"{age:.0f} s ago, expires after {lease.duration:.0f} s): {undone}")
    return f"leader: {lease.holder}"


def forbidden(exc: kube.KubeError) -> bool:
    """Whether the account may not make the read (HTTP 403)."""
    return exc.detail.startswith("HTTP 403")


def read_leader(api: Any, namespace: str) -> kube.StoredLease | None:
    return kube.Leases(api, namespace, timeout=10.0).read(LEADER_LEASE)


def configuration_lines(api: Any, model: GPUPolicy, names: dict[str, str]) -> list[str]:
    """How the webhook configurations the API server holds differ from what the policy
    needs (webhook.policy.apiserver.drift), one line each; a line saying they could not
    be read when the account may not."""
    lines = []
    configurations = kube.WebhookConfigurations(api, timeout=10.0)
    held: dict[str, Any] = {}
    for kind, name in names.items():
        try:
            live = held[kind] = configurations.read(kind, name)
        except kube.KubeError as exc:
            if not forbidden(exc):  # a developer's account: not theirs to see
                lines.append(f"webhook configurations: not read ({exc})")
            return lines
        found = drift.compare(model, kind, name, live)
        lines.append(f"webhook configurations: {found.describe()}" if found else
                     f"webhook configurations: {found.configuration} as the policy needs")
    want = native.wanted(model, held.get("mutating"))
    if want:  # admission mode fallback or native
        name = names["mutating"]
        try:
            live_policies = native.ours(kube.AdmissionPolicies(api, timeout=10.0).list(
                native.SELECTOR), name)
        except kube.KubeError as exc:
            if not forbidden(exc):
                lines.append(f"native admission policies: not read ({exc})")
            return lines
        found = drift.compare_native(name, want, live_policies)
        lines.append(f"native admission policies: {found.describe()}" if found else
                     f"native admission policies: {found.configuration} as the policy needs")
    return lines


def policy_from_cluster(api: Any, namespace: str, name: str) -> str:
    """The text of the policy the webhook serves, from its ConfigMap."""
    stored = kube.ConfigMaps(api, namespace, timeout=10.0).read(name)
    texts = [v for k, v in sorted(stored.data.items()) if k.endswith((".yaml", ".yml"))]
    if not texts:
        raise ValueError(f"configmap {namespace}/{name} holds no policy (*.yaml key): "
                         "pass --policy FILE")
    return texts[0]

