"""``review``: a manifest through both webhooks offline (``-f``), or recorded
AdmissionReviews replayed against a candidate policy (``--replay``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import yaml

from webhook.commands.output import dump
from webhook.commands.parser import add_requester, command

if TYPE_CHECKING:
    from webhook.admission.offline import ClaimBook
    from webhook.policy.compiled import CompiledPolicy
    from webhook.quota.store import MemoryStore


def add_review(sub: Any) -> None:
    r = command(sub, "review", _review)
    r.add_argument("-f", "--filename",
                   help="Pod/Deployment/Job/... manifest (YAML or JSON; - for stdin)")
    r.add_argument("--policy", help="policy file (default: the embedded example policy); "
                                    "with --replay, the candidate policy")
    r.add_argument("--replay", metavar="FILE",
                   help="AdmissionReviews as JSON lines (one full review per line, e.g. "
                        "from an audit log): report decisions that change from the baseline "
                        "policy to --policy; exits 0 unless the input is unreadable")
    r.add_argument("--baseline-policy", metavar="FILE",
                   help="with --replay: the current policy (default: the embedded one)")
    r.add_argument("--namespace", help="namespace, when the manifest does not say")
    r.add_argument("--namespace-labels", default=None,
                   help="labels of the namespace, k=v,k2=v2 (for namespaceSelector tenants; "
                        "not given: unknown, as to a webhook without a cluster; \"\": none)")
    add_requester(r)
    r.add_argument("--at", metavar="TIME", default=None,
                   help="decide as at this time, ISO 8601 with its offset "
                        "(2026-03-02T09:00:00+01:00): chooses the quota windows of "
                        "quotaSchedule [now]")
    r.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text")


def _replay(args: argparse.Namespace) -> int:
    from webhook.policy.compiled import compile_policy
    from webhook.policy.load import PolicyError, default_policy_text, load_file, load_text
    from webhook.tools import replay

    if args.filename:
        print("gpu-webhook review: give -f or --replay, not both", file=sys.stderr)
        return 2
    if not args.policy:
        print("gpu-webhook review: --replay needs --policy CANDIDATE", file=sys.stderr)
        return 2
    try:
        candidate = compile_policy(load_file(args.policy))
        baseline = compile_policy(load_file(args.baseline_policy) if args.baseline_policy
                                  else load_text(default_policy_text(), "<embedded default>"))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        with open(args.replay, "rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        print(f"gpu-webhook review: cannot read {args.replay}: {exc.strerror}",
              file=sys.stderr)
        return 2
    report = replay.replay(lines, baseline, candidate)
    if report.reviewed == 0:
        print(f"gpu-webhook review: {args.replay} holds no AdmissionReview (one JSON "
              "object per line)", file=sys.stderr)
        return 2
    if args.output != "text":
        print(dump(replay.as_json(report), args.output))
    else:
        base = args.baseline_policy or "the embedded policy"
        print(replay.render_text(report, f"{base} ({baseline.name})",
                                 f"{args.policy} ({candidate.name})"))
    return 0


def _review(args: argparse.Namespace) -> int:
    """show what the webhook would do with a manifest

    Run a manifest through the webhook offline (-f), or replay recorded AdmissionReviews
    against a candidate policy and report which decisions would change (--replay FILE
    --policy NEW [--baseline-policy CURRENT]).
    """
    if args.replay:
        return _replay(args)
    if not args.filename:
        print("gpu-webhook review: give -f MANIFEST (or --replay FILE --policy CANDIDATE)",
              file=sys.stderr)
        return 2
    from webhook.admission.offline import ClaimBook
    from webhook.quota.store import MemoryStore

    inputs = _inputs(args)
    if inputs is None:
        return 2
    policy, docs, ns_labels, at = inputs
    results: list[dict[str, Any]] = []
    denied = False
    store = MemoryStore()
    claims = ClaimBook()
    for n, doc in enumerate(docs):
        # The documents of one file share an empty usage store: quota caps apply to each
        # object, and pods earlier in the file count against the ones after them.
        result = _review_one(args, n, doc, policy, ns_labels, store, claims, at)
        if result is None:
            return 2
        denied |= result["decision"] == "denied"
        results.append(result)
    # Which policy decided: the embedded example is not the cluster's.
    source = (args.policy or "the embedded example policy: give --policy FILE for the one "
              "your cluster serves")
    print(f"gpu-webhook review: policy {policy.name} ({source})", file=sys.stderr)
    if policy.model is not None:
        from webhook.policy.advice import advice

        for said in advice(policy.model):
            print(f"gpu-webhook review: warning: {said}", file=sys.stderr)
    if args.output != "text":
        print(dump(results, args.output))
    else:
        for r in results:
            _print_result(r)
    return 1 if denied else 0


def _inputs(args: argparse.Namespace) -> tuple[CompiledPolicy, list[Any], dict[str, str],
                                                float | None] | None:
    """The policy, the manifest's documents, ``--namespace-labels`` and ``--at``; None
    (the reason printed) when one cannot be read."""
    from webhook.policy.compiled import compile_policy
    from webhook.policy.load import PolicyError, default_policy_text, load_file, load_text

    try:
        policy = compile_policy(load_file(args.policy) if args.policy else
                                load_text(default_policy_text(), "<embedded default>"))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return None
    try:
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        print(f"gpu-webhook review: cannot read {args.filename}: {exc}", file=sys.stderr)
        return None
    try:
        ns_labels = dict(kv.split("=", 1) for kv in (args.namespace_labels or "").split(",")
                         if kv)
    except ValueError:
        print("gpu-webhook review: --namespace-labels takes k=v,k2=v2", file=sys.stderr)
        return None
    at = None
    if args.at is not None:
        from datetime import datetime
        try:
            moment = datetime.fromisoformat(args.at)
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            print(f"gpu-webhook review: --at {args.at!r} is not a time with its offset, e.g. "
                  "2026-03-02T09:00:00+01:00 or 2026-03-02T08:00:00Z", file=sys.stderr)
            return None
        at = moment.timestamp()
    return policy, docs, ns_labels, at


def _review_one(args: argparse.Namespace, n: int, doc: Any, policy: CompiledPolicy,
                ns_labels: dict[str, str], store: MemoryStore, claims: ClaimBook,
                at: float | None) -> dict[str, Any] | None:
    """Document ``n`` of the manifest through both webhooks, as ``review`` reports it;
    None (the reason printed) when it is no object or its review cannot be read."""
    from webhook.admission.offline import through_both
    from webhook.k8s.review import BadReview, parse_review, request_review

    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        print(f"gpu-webhook review: {args.filename}: each document must be a Kubernetes "
              "object with apiVersion and kind", file=sys.stderr)
        return None
    review = request_review(doc, uid=f"review-{n:05d}", namespace=args.namespace,
                            username=args.user, groups=args.group or None)
    body = orjson.dumps(review)
    try:
        req = parse_review(body)
    except BadReview as exc:
        print(f"gpu-webhook review: {exc}", file=sys.stderr)
        return None

    def labels(_ns: str) -> dict[str, str] | None:
        # Not given: unknown, as to a webhook without a cluster (not "no labels").
        return ns_labels if args.namespace_labels is not None else None

    out = through_both(req, policy, labels, store, claims, at)
    m = out.mutating
    skipped = next((d.skipped for d in out.decisions if d.skipped), None) \
        if all(d.skipped for d in out.decisions) else None
    decision = ("denied" if not out.allowed else "skipped" if skipped else "allowed")
    result: dict[str, Any] = {"kind": doc["kind"], "name": req.name or "(generated)",
                              "namespace": req.namespace, "decision": decision,
                              "phase": out.phase, "message": out.message or None,
                              "rules": out.rules(),
                              "tenant": next((d.tenant for d in out.decisions
                                              if d.tenant), None),
                              "warnings": out.warnings}
    if skipped:
        result["skipped"] = _SKIPPED.get(skipped, skipped)
    if out.validating is not None:
        result["audit"] = [f.message for d in out.decisions for f in d.findings
                           if f.mode.value == "audit"]
    if out.allowed and not skipped:
        # What the API server would store; a denied object is stored by no one, so
        # its would-be changes are not shown as if they were made.
        result.update(changes=m.mutations, patch=m.patch, object=out.patched)
    return result


# Why the webhooks leave an object alone (Decision.skipped), for `review`.
_SKIPPED = {
    "kind": "the webhooks do not review this kind of object",
    "exempt": "its namespace or user is exempt in the policy",
    "operation": "the webhooks do not review this operation",
    "subresource": "the webhooks do not review this subresource",
    "no-gpu": "it asks for no GPU",
}


def _print_result(r: dict[str, Any]) -> None:
    head = f"{r['kind']} {r['namespace']}/{r['name']}: {r['decision'].upper()}"
    if r.get("phase"):
        head += f" (by the {r['phase']} webhook)"
    if r.get("skipped"):
        head += f" ({r['skipped']})"
    print(head)
    if r.get("message"):
        for line in r["message"].splitlines():
            print(f"  denied: {line}")
    for w in r.get("warnings") or []:
        print(f"  warning: {w}")
    for a in r.get("audit") or []:
        print(f"  audit: {a}")
    if r.get("changes"):
        print(f"  changes: {', '.join(r['changes'])}")
    if r.get("object") is not None and r.get("patch"):
        print("  patched object:")
        dumped = yaml.safe_dump(r["object"], sort_keys=False)
        print("    " + dumped.replace("\n", "\n    ").rstrip())
    print()
