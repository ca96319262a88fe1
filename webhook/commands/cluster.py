"""The commands that read the cluster once: ``audit`` (what the policy would refuse among
running objects), ``status`` (GPU quota per tenant) and ``usage`` (GPU-hours per
tenant, user, namespace and product)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from webhook.commands.parser import add_kubeconfig, command


def add_audit(sub: Any) -> None:
    au = command(sub, "audit", _audit)
    au.add_argument("--policy", help="the policy to audit against, e.g. a candidate "
                                     "(default: the webhook's ConfigMap gpu-webhook-policy)")
    au.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    au.add_argument("--webhook-namespace", default="gpu-webhook",
                    help="where the webhook's policy ConfigMap is [gpu-webhook]")
    add_kubeconfig(au)


def add_status(sub: Any) -> None:
    st = command(sub, "status", _status)
    st.add_argument("-n", "--namespace", help="only the tenant owning this namespace "
                                              "(and this namespace's own caps)")
    st.add_argument("--tenant", help="only this tenant")
    st.add_argument("--policy", help="policy file (default: the webhook's ConfigMap "
                                     "gpu-webhook-policy in --webhook-namespace)")
    st.add_argument("--webhook-namespace", default="gpu-webhook",
                    help="where the webhook keeps its ledger and policy [gpu-webhook]")
    st.add_argument("--webhook-configurations", default="gpu-webhook",
                    help="name of the webhook configurations compared with the policy "
                         "[gpu-webhook]")
    add_kubeconfig(st)
    st.add_argument("-o", "--output", choices=["text", "json"], default="text")


def add_usage(sub: Any) -> None:
    us = command(sub, "usage", _usage)
    us.add_argument("--period", help="a UTC month (2026-12) or day (2026-12-07) "
                                     "[this month]")
    us.add_argument("--since", help="first UTC day (2026-12-01)")
    us.add_argument("--until", help="UTC day after the last (2027-01-01) [today, included]")
    us.add_argument("--tenant", help="only this tenant")
    us.add_argument("--policy", help="policy file, for the rate card (default: the "
                                     "webhook's ConfigMap gpu-webhook-policy)")
    us.add_argument("--webhook-namespace", default="gpu-webhook",
                    help="where the webhook's policy ConfigMap is [gpu-webhook]")
    add_kubeconfig(us)
    us.add_argument("-o", "--output", choices=["text", "json", "csv"], default="text")


def add_failure_policy(sub: Any) -> None:
    fp = command(sub, "failure-policy", _failure_policy)
    fp.add_argument("policy", choices=["Ignore", "Fail"], metavar="Ignore|Fail")
    fp.add_argument("--name", default="gpu-webhook",
                    help="name of the two webhook configurations [gpu-webhook]")
    add_kubeconfig(fp)


def _failure_policy(args: argparse.Namespace) -> int:
    """break glass: what the API server does with pods while no replica answers

    Set failurePolicy on every webhook of the two configurations that fails closed
    (GPU pods, DRA claims, the routes, the quota gate, GPUPolicy objects; never the
    scale and release webhooks, which always ignore failures), for any install (Helm,
    kustomize, manifests). Ignore lets pods in unchecked while no replica answers; Fail
    puts the webhook back in their path. A replica that leads again writes back the
    failure policy the install recorded (--webhook-configurations-sync fix), ending a
    break-glass by itself: see docs/operating.md.
    """
    from webhook.libs import kube
    from webhook.policy.apiserver.drift import KINDS, failure_policy_ops

    try:
        configurations = kube.WebhookConfigurations(_connect(args), timeout=10.0)
        for kind in ("mutating", "validating"):
            live = configurations.read(kind, args.name)
            if live is None:
                print(f"{KINDS[kind]} {args.name}: not found", file=sys.stderr)
                continue
            ops, changed = failure_policy_ops(live, args.policy)
            if ops:
                configurations.patch(kind, args.name, ops, "set the failurePolicy")
            print(f"{KINDS[kind]} {args.name}: "
                  + (f"{', '.join(changed)} -> {args.policy}" if changed
                     else f"every webhook already {args.policy}"))
    except (kube.KubeError, ValueError, OSError) as exc:
        print(f"gpu-webhook failure-policy: {exc}", file=sys.stderr)
        return 2
    if args.policy == "Ignore":
        print("While no replica answers, the API server now lets in unchecked: GPU pods "
              "(no quota charged, no toleration or affinity: they stay Pending on tainted "
              "GPU nodes), pods without GPUs in the tenants' namespaces (their images' "
              "NVIDIA_VISIBLE_DEVICES kept), DRA claims, GPUPolicy edits, and the removal "
              "of the quota gate by anyone who may update pods. A replica that leads "
              "again writes back the failure policy the install recorded; "
              "`gpu-webhook failure-policy Fail` ends it sooner.")
    return 0


def _connect(args: argparse.Namespace) -> Any:
    """The API client: --kubeconfig, else $KUBECONFIG, ~/.kube/config, or in-cluster."""
    from webhook.libs import kube

    home = Path.home() / ".kube" / "config"
    return kube.connect(args.kubeconfig or os.environ.get("KUBECONFIG")
                        or (str(home) if home.exists() else None))


def _cluster_policy(args: argparse.Namespace) -> tuple[Any, Any]:
    """The API client and the policy (--policy, else the webhook's ConfigMap)."""
    from webhook.policy.load import load_file, load_text
    from webhook.tools import status

    api = _connect(args)
    model = (load_file(args.policy) if args.policy else load_text(
        status.policy_from_cluster(api, args.webhook_namespace, "gpu-webhook-policy"),
        f"configmap {args.webhook_namespace}/gpu-webhook-policy"))
    return api, model


def _audit(args: argparse.Namespace) -> int:
    """what the policy would refuse or change among running GPU pods and workloads

    Read the cluster's pods, Deployments, StatefulSets and Jobs once through the
    kubeconfig and decide each as the webhook would decide its creation now (pods oldest
    first, so the newest are those over a lowered cap). Exit 1 when something would be
    refused, 0 otherwise, 2 when the cluster or the policy cannot be read.
    """
    from webhook.libs import kube
    from webhook.policy.compiled import compile_policy
    from webhook.policy.load import PolicyError
    from webhook.tools import audit

    try:
        api, model = _cluster_policy(args)
        pods, workloads, labels, nodes = audit.read_all(api, args.namespace)
    except (PolicyError, kube.KubeError, ValueError, OSError) as exc:
        print(f"gpu-webhook audit: {exc}", file=sys.stderr)
        return 2
    compiled = compile_policy(model)
    found = audit.audit(compiled, pods, workloads, labels.get,
                        audit.node_lookup(compiled, nodes))
    for f in found:
        print(f"{f.verdict.upper()} {f.subject}: {f.detail}")
    refused = sum(f.verdict == "refused" for f in found)
    holds = sum(f.verdict == "holds" for f in found)
    print(f"{len(pods)} pods, {len(workloads)} workloads: {refused} would be refused, "
          f"{holds} hold a route to a GPU that skips the GPU request, "
          f"{len(found) - refused - holds} admitted with changes or warnings "
          f"(policy {model.metadata.name})", file=sys.stderr)
    return 1 if refused or holds else 0


def _usage(args: argparse.Namespace) -> int:
    """GPU-hours by tenant, namespace, user and product over a period, priced

    GPU time as the webhook's leader accounts it (GPU-equivalents x hours, from each
    pod's binding to its end), read from the days it keeps (GPUUsage objects) and
    priced with the policy's spec.showback rates. Exit 2 when the cluster or the
    policy cannot be read.
    """
    from datetime import UTC, datetime

    from webhook.libs import kube
    from webhook.policy.compiled import compile_policy
    from webhook.policy.load import PolicyError
    from webhook.tools import usage

    try:
        since, until = usage.period(args.period, args.since, args.until,
                                    datetime.now(UTC).date())
        api, model = _cluster_policy(args)
        days, bad = usage.read(api)
    except (PolicyError, kube.KubeError, ValueError, OSError, usage.NotKept) as exc:
        print(f"gpu-webhook usage: {exc}", file=sys.stderr)
        return 2
    u = usage.usage(compile_policy(model), days, since, until, bad)
    if args.tenant:
        u = usage.Usage(u.since, u.until, u.accounted_until,
                        [r for r in u.rows if r.tenant == args.tenant], u.currency,
                        u.unreadable)
    if args.output == "json":
        print(orjson.dumps(usage.as_json(u), option=orjson.OPT_INDENT_2).decode())
    elif args.output == "csv":
        print(usage.as_csv(u), end="")
    else:
        print(usage.table(u), end="")
    return 0


def _status(args: argparse.Namespace) -> int:
    """GPU quota per tenant, namespace and product, read from the cluster

    Each tenant's GPU quota as the webhook counts it: per cap (GPUs, a resource, a
    product, pods) the GPUs used by running pods, reserved for pods being created, the
    limit and what is free, and the biggest consumers. Reads pods and the webhook's ledger
    ConfigMaps through the kubeconfig; what the account may not read is noted.
    """
    from webhook.libs import kube
    from webhook.policy.compiled import compile_policy
    from webhook.policy.load import PolicyError
    from webhook.tools import status

    try:
        api, model = _cluster_policy(args)
        policy = compile_policy(model)
        cluster = status.read_cluster(api, args.webhook_namespace, args.namespace,
                                      policy.product_label)
        rep = status.report(policy, cluster, namespace=args.namespace, tenant=args.tenant)
    except (PolicyError, kube.KubeError, ValueError, OSError) as exc:
        print(f"gpu-webhook status: {exc}", file=sys.stderr)
        return 2
    # What a developer's account may not read is left out: the quota is theirs to see.
    waiting = sum(n for n, _ in rep.waiting.values())
    try:
        leader = status.leader_line(status.read_leader(api, args.webhook_namespace),
                                    time.time(), waiting)
    except kube.KubeError as exc:
        # A developer's account may not read the webhook's Lease: their quota is theirs
        # to see, the webhook's state the platform team's.
        leader = "" if status.forbidden(exc) else f"leader: not read ({exc})"
    configurations = status.configuration_lines(
        api, model, {"mutating": args.webhook_configurations,
                     "validating": args.webhook_configurations})
    if args.output == "json":
        print(orjson.dumps({
            "caps": [{"tenant": r.tenant, "scope": r.scope, "cap": r.cap, "used": r.used,
                      "reserved": r.reserved, "limit": r.limit, "free": r.free}
                     for r in rep.rows],
            "pods": rep.pods, "top": {t: [{"owner": o, "gpus": g} for o, g in top]
                                      for t, top in rep.top.items()},
            "byProduct": {t: [{"product": p, "gpus": g} for p, g in on]
                          for t, on in rep.products.items() if on},
            "notes": rep.unread, "holding": rep.holding,
            "leader": leader.removeprefix("leader: ") or None,
            "webhookConfigurations": [c.removeprefix("webhook configurations: ")
                                      for c in configurations]},
            option=orjson.OPT_INDENT_2).decode())
    else:
        print(status.table(rep), end="")
        print("".join(f"{line}\n" for line in [leader, *configurations] if line), end="")
    return 0
