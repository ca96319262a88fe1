"""The ``gpu-webhook`` command line. Thin: parse flags, call the modules that do the work.

Commands: ``serve``, ``certs``, ``manifests``, ``policy check|schema|crd``, ``review``
(also ``review --replay``), ``test``, ``status``, ``audit``, ``admission-review``,
``completion``.
Exit codes: 0 success/allowed, 1 denied, invalid policy or a failed policy test, 2 usage
or input error; each command's ``--help`` lists its own (``EXIT_CODES``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import orjson
import yaml

from webhook import __version__


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: the command, what is wrong, where the help
    is. (argparse prints the whole usage first; for ``serve`` that is 30 lines that push
    the actual error out of a pod's last log lines.)"""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        # A bad setting found after parsing (a range, a combination of flags): one line
        # on stderr, a usage error's status.
        print(f"{parser.prog}: {exc.code}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`gpu-webhook review ... | head`): that is not an error of
        # ours. Point stdout at /dev/null so the interpreter's final flush stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it


def _parser() -> argparse.ArgumentParser:
    from webhook.server.settings import Settings

    p = _Parser(prog="gpu-webhook",
                                description="Admission webhook that governs GPU workloads.")
    p.add_argument("--version", action="version", version=f"gpu-webhook {__version__}")
    sub = p.add_subparsers(title="commands")

    s = sub.add_parser("serve", help="run the HTTPS admission webhook")
    Settings.add_arguments(s)
    s.set_defaults(func=_serve)

    c = sub.add_parser("certs", help="create a CA and a serving certificate")
    c.add_argument("--service", default="gpu-webhook", help="Service name [gpu-webhook]")
    c.add_argument("--namespace", default="gpu-webhook", help="Service namespace [gpu-webhook]")
    c.add_argument("--dns", action="append", default=[], help="extra DNS name (repeatable)")
    c.add_argument("--ip", action="append", default=[], help="extra IP address (repeatable)")
    c.add_argument("--days", type=int, default=365, help="serving certificate validity [365]")
    c.add_argument("--out", default="certs", help="output directory [certs]")
    c.add_argument("--ca", help="existing CA certificate to sign with (with --ca-key)")
    c.add_argument("--ca-key", help="existing CA private key")
    c.add_argument("--force", action="store_true", help="overwrite existing files")
    c.set_defaults(func=_certs)

    m = sub.add_parser(
        "manifests", help="print the webhook configurations for a policy (YAML)",
        description="Print a MutatingWebhookConfiguration and a ValidatingWebhookConfiguration "
                    "whose matchConditions send only GPU pods and workloads, derived from the "
                    "policy. failurePolicy Fail: while the webhook is down, matching GPU "
                    "requests are rejected; Ignore: they are admitted unchecked (no quota, no "
                    "pinning). Pods without GPUs are never sent either way.")
    m.add_argument("--policy", help="policy file (default: the embedded example policy)")
    m.add_argument("--name", default="gpu-webhook", help="configuration name [gpu-webhook]")
    m.add_argument("--namespace", default="gpu-webhook",
                   help="the webhook's namespace, never sent to it [gpu-webhook]")
    m.add_argument("--service", default="gpu-webhook", help="Service name [gpu-webhook]")
    m.add_argument("--port", type=int, default=443, help="Service port [443]")
    m.add_argument("--url", help="call https://HOST:PORT instead of the Service (a webhook "
                                 "outside the cluster, e.g. for tests)")
    m.add_argument("--ca-file", help="PEM CA of the serving certificate, put in caBundle "
                                     "(leave out when cert-manager injects it)")
    m.add_argument("--timeout-seconds", type=int, default=5, help="per call, 1-30 [5]")
    m.add_argument("--mutating-failure-policy", choices=["Fail", "Ignore"], default="Fail",
                   help="when the webhook is down: Fail rejects GPU requests, Ignore admits "
                        "them unmutated [Fail]")
    m.add_argument("--validating-failure-policy", choices=["Fail", "Ignore"], default="Fail",
                   help="when the webhook is down: Fail rejects GPU requests, Ignore admits "
                        "them unchecked (quota not enforced) [Fail]")
    m.set_defaults(func=_manifests)

    pol = sub.add_parser("policy", help="policy tools")
    psub = pol.add_subparsers(title="policy commands")
    chk = psub.add_parser("check", help="validate policy files")
    chk.add_argument("files", nargs="+", metavar="FILE")
    chk.set_defaults(func=_policy_check)
    _add_policy_schema_commands(psub)
    # `gpu-webhook policy` alone lists its subcommands rather than the top-level help.
    pol.set_defaults(func=lambda _args: _usage(pol))

    r = sub.add_parser(
        "review", help="show what the webhook would do with a manifest",
        description="Run a manifest through the webhook offline (-f), or replay recorded "
                    "AdmissionReviews against a candidate policy and report which decisions "
                    "would change (--replay FILE --policy NEW [--baseline-policy CURRENT]).")
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
    r.add_argument("--user", default="developer", help="requesting user [developer]")
    r.add_argument("--group", action="append", default=[], help="user's group (repeatable)")
    r.add_argument("--at", metavar="TIME", default=None,
                   help="decide as at this time, ISO 8601 with its offset "
                        "(2026-03-02T09:00:00+01:00): chooses the quota windows of "
                        "quotaSchedule [now]")
    r.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text")
    r.set_defaults(func=_review)

    au = sub.add_parser(
        "audit", help="what the policy would refuse or change among running GPU pods and "
                      "workloads",
        description="Read the cluster's pods, Deployments, StatefulSets and Jobs once "
                    "through the kubeconfig and decide each as the webhook would decide "
                    "its creation now (pods oldest first, so the newest are those over a "
                    "lowered cap). Exit 1 when something would be refused, 0 otherwise, 2 "
                    "when the cluster or the policy cannot be read.")
    au.add_argument("--policy", help="the policy to audit against, e.g. a candidate "
                                     "(default: the webhook's ConfigMap gpu-webhook-policy)")
    au.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    au.add_argument("--webhook-namespace", default="gpu-webhook",
                    help="where the webhook's policy ConfigMap is [gpu-webhook]")
    au.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, "
                                         "or in-cluster)")
    au.set_defaults(func=_audit)

    st = sub.add_parser(
        "status", help="GPU quota per tenant, namespace and product, read from the cluster",
        description="Each tenant's GPU quota as the webhook counts it: per cap (GPUs, a "
                    "resource, a product, pods) the GPUs used by running pods, reserved "
                    "for pods being created, the limit and what is free, and the biggest "
                    "consumers. Reads pods and the webhook's ledger ConfigMaps through the "
                    "kubeconfig; what the account may not read is noted.")
    st.add_argument("-n", "--namespace", help="only the tenant owning this namespace "
                                              "(and this namespace's own caps)")
    st.add_argument("--tenant", help="only this tenant")
    st.add_argument("--policy", help="policy file (default: the webhook's ConfigMap "
                                     "gpu-webhook-policy in --webhook-namespace)")
    st.add_argument("--webhook-namespace", default="gpu-webhook",
                    help="where the webhook keeps its ledger and policy [gpu-webhook]")
    st.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, "
                                         "or in-cluster)")
    st.add_argument("-o", "--output", choices=["text", "json"], default="text")
    st.set_defaults(func=_status)

    t = sub.add_parser(
        "test", help="run policy test suites (kind GPUPolicyTest)",
        description="Run every policy test suite (YAML, kind GPUPolicyTest) under DIR, or "
                    "one suite file: each case goes through mutate -> patch -> validate, "
                    "with quota against the suite's usage snapshot; admitted pods reserve "
                    "quota for the cases after them. Exit 1 when a case fails, 2 when a "
                    "suite cannot run. Format: policies/tests/README.md.")
    t.add_argument("path", metavar="DIR", help="directory of suites, or one suite file")
    t.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text")
    t.set_defaults(func=_test)
    _add_admission_review_command(sub)
    _add_completion_command(sub, p)
    _add_exit_codes(p)
    return p


# What each command's exit status means, shown at the end of its --help. Keyed by the
# command's path; a command not listed gets the general meaning.
EXIT_CODES: dict[str, str] = {
    "gpu-webhook": "0 success; 1 denied, invalid policy or failed policy test; 2 usage or "
                   "input error",
    "serve": "0 stopped by a signal; 2 unusable settings, certificates or policy",
    "certs": "0 written; 2 bad flags, unreadable CA or files already there (--force)",
    "manifests": "0 printed; 2 invalid policy, unreadable CA file or bad flags",
    "policy": "2 no subcommand given (this list is printed)",
    "policy check": "0 every file is a valid policy; 1 a file is not; 2 usage error",
    "policy schema": "0 printed",
    "policy crd": "0 printed",
    "review": "0 every object allowed (with --replay: the replay ran); 1 an object denied; "
              "2 unreadable manifest or policy, bad flags",
    "test": "0 every case passed; 1 a case failed; 2 a suite cannot run or none found",
    "completion": "0 printed; 2 unknown shell",
    "admission-review": "0 printed (with --reply: allowed); 1 with --reply: denied; 2 "
                        "unreadable manifest or reply, bad flags",
    "status": "0 printed; 2 the cluster or the policy cannot be read",
    "audit": "0 nothing would be refused and no pod holds a route to a GPU; 1 something "
             "would be, or does; 2 the cluster or the policy "
             "cannot be read",
}


def _add_exit_codes(root: argparse.ArgumentParser) -> None:
    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        codes = EXIT_CODES.get(path or "gpu-webhook")
        if codes and not parser.epilog:
            parser.epilog = f"exit status: {codes}."
        for action in parser._actions:  # argparse keeps subcommands on this private list
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}".strip())

    walk(root, "")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _add_completion_command(sub: Any, root: argparse.ArgumentParser) -> None:
    shells = ["bash", "zsh", "tcsh"]
    comp = sub.add_parser(
        "completion", help="print a shell completion script",
        description="Print the completion script for SHELL, generated from this command's "
                    "own flags (shtab). bash: `source <(gpu-webhook completion bash)`, or "
                    "save it under ~/.local/share/bash-completion/completions/gpu-webhook; "
                    "zsh: save it as _gpu-webhook in a directory of $fpath.")
    comp.add_argument("shell", choices=shells, metavar="SHELL",
                      help=f"one of {', '.join(shells)}")
    comp.set_defaults(func=lambda args: _completion(root, args.shell))


def _add_admission_review_command(sub: Any) -> None:
    ar = sub.add_parser(
        "admission-review", help="the AdmissionReview the API server would send for a "
                                 "manifest, or a reply decoded",
        description="-f MANIFEST: print the AdmissionReview (admission.k8s.io/v1, JSON) "
                    "the API server sends for the object's creation, to POST to the "
                    "webhook's /mutate or /validate (curl -d @FILE). --reply FILE: read "
                    "the webhook's answer and print it decoded: allowed or the denial's "
                    "message, the warnings, and the JSONPatch one operation a line.")
    what = ar.add_mutually_exclusive_group(required=True)
    what.add_argument("-f", "--filename", help="one object (YAML or JSON; - for stdin)")
    what.add_argument("--reply", metavar="FILE",
                      help="an AdmissionReview reply (JSON; - for stdin)")
    ar.add_argument("--namespace", help="namespace, when the manifest does not say "
                                        "[default]")
    ar.add_argument("--operation", choices=["CREATE", "UPDATE"], default="CREATE",
                    help="[CREATE]")
    ar.add_argument("--dry-run", action="store_true",
                    help="a server-side dry run (kubectl --dry-run=server)")
    ar.add_argument("--user", default="developer", help="requesting user [developer]")
    ar.add_argument("--group", action="append", default=[], help="user's group (repeatable)")
    ar.add_argument("-o", "--output", choices=["text", "json"], default="text",
                    help="with --reply [text]")
    ar.set_defaults(func=_admission_review)


def _admission_review(args: argparse.Namespace) -> int:
    from webhook.tools import wire

    source = args.reply or args.filename
    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
        if args.reply:
            reply = wire.read_reply(raw)
        else:
            docs = [d for d in yaml.safe_load_all(raw) if d is not None]
            body = wire.build(docs, namespace=args.namespace, operation=args.operation,
                              dry_run=args.dry_run, user=args.user, groups=args.group)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, wire.WireError) as exc:
        print(f"gpu-webhook admission-review: {source}: {exc}", file=sys.stderr)
        return 2
    if not args.reply:
        sys.stdout.buffer.write(body + b"\n")
        return 0
    print(_dump(wire.as_data(reply), "json") if args.output == "json" else wire.text(reply))
    return 0 if reply.allowed else 1


def _completion(root: argparse.ArgumentParser, shell: str) -> int:
    import shtab

    print(shtab.complete(root, shell=shell), end="")
    return 0


def _dump(data: Any, output: str) -> str:
    """``data`` as ``-o json`` or ``-o yaml`` prints it."""
    if output == "yaml":
        return yaml.safe_dump(data, sort_keys=False, width=100).rstrip("\n")
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


def _cluster_policy(args: argparse.Namespace) -> tuple[Any, Any]:
    """The API client and the policy (--policy, else the webhook's ConfigMap)."""
    from webhook.libs import kube
    from webhook.policy.load import load_file, load_text
    from webhook.tools import status

    home = Path.home() / ".kube" / "config"
    api = kube.connect(args.kubeconfig or os.environ.get("KUBECONFIG")
                       or (str(home) if home.exists() else None))
    model = (load_file(args.policy) if args.policy else load_text(
        status.policy_from_cluster(api, args.webhook_namespace, "gpu-webhook-policy"),
        f"configmap {args.webhook_namespace}/gpu-webhook-policy"))
    return api, model


def _audit(args: argparse.Namespace) -> int:
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


def _status(args: argparse.Namespace) -> int:
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
    if args.output == "json":
        print(orjson.dumps({
            "caps": [{"tenant": r.tenant, "scope": r.scope, "cap": r.cap, "used": r.used,
                      "reserved": r.reserved, "limit": r.limit, "free": r.free}
                     for r in rep.rows],
            "pods": rep.pods, "top": {t: [{"owner": o, "gpus": g} for o, g in top]
                                      for t, top in rep.top.items()},
            "byProduct": {t: [{"product": p, "gpus": g} for p, g in on]
                          for t, on in rep.products.items() if on},
            "notes": rep.unread, "holding": rep.holding},
            option=orjson.OPT_INDENT_2).decode())
    else:
        print(status.table(rep), end="")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from webhook.server.run import run
    from webhook.server.settings import Settings

    return run(Settings.from_args(args))


def _certs(args: argparse.Namespace) -> int:
    from webhook.libs import certs

    names = certs.service_names(args.service, args.namespace) + list(args.dns)
    ca = ca_key = None
    if bool(args.ca) != bool(args.ca_key):
        print("gpu-webhook certs: --ca and --ca-key go together", file=sys.stderr)
        return 2
    try:
        if args.ca:
            ca, ca_key = Path(args.ca).read_bytes(), Path(args.ca_key).read_bytes()
        issued = certs.issue(names, list(args.ip), days=args.days, ca_pem=ca, ca_key_pem=ca_key)
        written = certs.write(issued, args.out, force=args.force)
    except (OSError, ValueError) as exc:
        print(f"gpu-webhook certs: {exc}", file=sys.stderr)
        return 2
    import base64

    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    print(f"serving certificate for {', '.join(names + list(args.ip))} expires "
          f"{issued.not_after:%Y-%m-%d} ({args.days} days): renew before then "
          "(run this command again with --force and the same --ca/--ca-key).", file=sys.stderr)
    print(base64.b64encode(issued.ca_pem).decode())  # the caBundle, for scripts
    return 0


def _manifests(args: argparse.Namespace) -> int:
    from webhook.policy.load import PolicyError, default_policy_text, load_file, load_text
    from webhook.tools import manifests

    try:
        policy = (load_file(args.policy) if args.policy else
                  load_text(default_policy_text(), "<embedded default>"))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        ca = Path(args.ca_file).read_bytes() if args.ca_file else None
        if ca is not None and b"-----BEGIN CERTIFICATE-----" not in ca:
            raise ValueError(f"{args.ca_file} holds no PEM certificate")
        objects = manifests.render(policy, manifests.Options(
            name=args.name, namespace=args.namespace, service=args.service, port=args.port,
            url=args.url, ca_bundle=ca, timeout_seconds=args.timeout_seconds,
            mutating_failure_policy=args.mutating_failure_policy,
            validating_failure_policy=args.validating_failure_policy))
    except (OSError, ValueError) as exc:
        print(f"gpu-webhook manifests: {exc}", file=sys.stderr)
        return 2
    source = args.policy or "the embedded example policy"
    print(manifests.to_yaml(objects, header=(
        f"# Rendered by `gpu-webhook manifests` from {source} (policy "
        f"{policy.metadata.name}).\n# Render again when the policy's gpuResources, "
        "tolerations, nonGpuPodsToleratingGpuTaints, exemptions, workloadKinds or "
        "tenants' namespaces change.\n")), end="")
    return 0


def _add_policy_schema_commands(psub: Any) -> None:
    sch = psub.add_parser(
        "schema", help="print the JSON Schema of a policy file",
        description="Print the JSON Schema (draft 2020-12) of a policy file, generated from "
                    "the policy model; editors use it through a `# yaml-language-server: "
                    "$schema=...` line. Published as policies/schema/gpupolicy.schema.json.")
    sch.set_defaults(func=_policy_schema)
    crd = psub.add_parser(
        "crd", help="print the GPUPolicy CustomResourceDefinition (YAML)",
        description="Print the GPUPolicy CustomResourceDefinition (gpu-webhook.dev/v1alpha1, "
                    "cluster-scoped) whose OpenAPI schema is generated from the policy model. "
                    "Shipped as deploy/base/crd-gpupolicy.yaml.")
    crd.set_defaults(func=_policy_crd)


def _policy_schema(args: argparse.Namespace) -> int:
    import json

    from webhook.policy.schema import json_schema

    # json, not orjson: its indent=2 output with a final newline is the committed file.
    print(json.dumps(json_schema(), indent=2, ensure_ascii=False))
    return 0


def _policy_crd(args: argparse.Namespace) -> int:
    from webhook.policy.schema import crd
    from webhook.tools.manifests import to_yaml

    print(to_yaml([crd()], header=(
        "# Rendered by `gpu-webhook policy crd` from the policy model "
        "(webhook/policy/model.py).\n")), end="")
    return 0


def _policy_check(args: argparse.Namespace) -> int:
    from webhook.policy.load import PolicyError, load_file

    failed = 0
    for f in args.files:
        try:
            policy = load_file(f)
        except PolicyError as exc:
            failed += 1
            print(exc, file=sys.stderr)
            continue
        n = len(policy.spec.tenants)
        print(f"{f}: ok (policy {policy.metadata.name}, {n} tenant{'' if n == 1 else 's'})")
    if failed:
        print(f"{failed} of {len(args.files)} policy files invalid", file=sys.stderr)
    return 1 if failed else 0


def _test(args: argparse.Namespace) -> int:
    from webhook.tools import policytest

    target = Path(args.path)
    if not target.exists():
        print(f"gpu-webhook test: {target} does not exist", file=sys.stderr)
        return 2
    paths = policytest.discover(target)
    if not paths:
        print(f"gpu-webhook test: no policy test suites (kind {policytest.KIND}) under "
              f"{target}", file=sys.stderr)
        return 2
    results = [policytest.run_path(p) for p in paths]
    if args.output != "text":
        print(_dump(policytest.as_json(results), args.output))
    else:
        print(policytest.render_text(results))
    if any(s.error is not None for s in results):
        return 2
    return 1 if any(s.failed for s in results) else 0


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
        print(_dump(replay.as_json(report), args.output))
    else:
        base = args.baseline_policy or "the embedded policy"
        print(replay.render_text(report, f"{base} ({baseline.name})",
                                 f"{args.policy} ({candidate.name})"))
    return 0


def _review(args: argparse.Namespace) -> int:
    if args.replay:
        return _replay(args)
    if not args.filename:
        print("gpu-webhook review: give -f MANIFEST (or --replay FILE --policy CANDIDATE)",
              file=sys.stderr)
        return 2
    from webhook.admission.offline import ClaimBook, through_both
    from webhook.k8s.review import BadReview, parse_review, request_review
    from webhook.policy.compiled import compile_policy
    from webhook.policy.load import PolicyError, default_policy_text, load_file, load_text
    from webhook.quota.store import MemoryStore

    try:
        policy = compile_policy(load_file(args.policy) if args.policy else
                                load_text(default_policy_text(), "<embedded default>"))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        print(f"gpu-webhook review: cannot read {args.filename}: {exc}", file=sys.stderr)
        return 2
    try:
        ns_labels = dict(kv.split("=", 1) for kv in (args.namespace_labels or "").split(",")
                         if kv)
    except ValueError:
        print("gpu-webhook review: --namespace-labels takes k=v,k2=v2", file=sys.stderr)
        return 2
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
            return 2
        at = moment.timestamp()
    results: list[dict[str, Any]] = []
    denied = False
    store = MemoryStore()
    claims = ClaimBook()
    for n, doc in enumerate(docs):
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
            print(f"gpu-webhook review: {args.filename}: each document must be a Kubernetes "
                  "object with apiVersion and kind", file=sys.stderr)
            return 2
        review = request_review(doc, uid=f"review-{n:05d}", namespace=args.namespace,
                                username=args.user, groups=args.group or None)
        body = orjson.dumps(review)
        try:
            req = parse_review(body)
        except BadReview as exc:
            print(f"gpu-webhook review: {exc}", file=sys.stderr)
            return 2

        def labels(_ns: str) -> dict[str, str] | None:
            # Not given: unknown, as to a webhook without a cluster (not "no labels").
            return ns_labels if args.namespace_labels is not None else None

        # The documents of one file share an empty usage store: quota caps apply to each
        # object, and pods earlier in the file count against the ones after them.
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
        denied |= not out.allowed
        results.append(result)
    if args.output != "text":
        print(_dump(results, args.output))
    else:
        for r in results:
            _print_result(r)
    return 1 if denied else 0


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


if __name__ == "__main__":
    sys.exit(main())
