"""The commands on a policy: ``manifests`` (the webhook configurations it needs),
``policy check|schema|crd``, and ``test`` (policy test suites)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from webhook.commands.output import dump
from webhook.commands.parser import command
from webhook.policy.apiserver.webhooks import ADMISSION_MODES


def add_manifests(sub: Any) -> None:
    m = command(sub, "manifests", _manifests)
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
    m.add_argument("--exempt-namespace", action="append", default=[], metavar="NS",
                   help="never send this namespace's objects, besides kube-system, "
                        "--namespace and the policy's exemptions (repeatable)")
    m.add_argument("--timeout-seconds", type=int, default=5, help="per call, 1-30 [5]")
    m.add_argument("--mutating-failure-policy", choices=["Fail", "Ignore"], default="Fail",
                   help="when the webhook is down: Fail rejects GPU requests, Ignore admits "
                        "them unmutated [Fail]")
    m.add_argument("--validating-failure-policy", choices=["Fail", "Ignore"], default="Fail",
                   help="when the webhook is down: Fail rejects GPU requests, Ignore admits "
                        "them unchecked (quota not enforced) [Fail]")
    m.add_argument("--admission-mode", choices=list(ADMISSION_MODES), default="webhook",
                   help="where the rules that need no state run: webhook (only in the "
                        "webhook), fallback (also in the API server's admission policies, "
                        "printed too; the webhooks for pods without GPUs fail open), native "
                        "(only in the API server; the webhook is sent only what needs its "
                        "state) [webhook]")
    m.add_argument("--static-dir", metavar="DIR",
                   help="write the objects into DIR as files the API server loads at start "
                        "(manifest-based admission control, Kubernetes 1.37, feature gate "
                        "ManifestBasedAdmissionControlConfig), with the "
                        "admission-configuration.yaml to pass to "
                        "--admission-control-config-file; not printed")
    m.add_argument("--static-path", metavar="PATH",
                   help="where DIR will be on the control plane's host, for the paths in "
                        "admission-configuration.yaml [DIR, absolute]")


def add_policy(sub: Any) -> None:
    pol = sub.add_parser("policy", help="policy tools")
    psub = pol.add_subparsers(title="policy commands")
    chk = command(psub, "check", _policy_check)
    chk.add_argument("files", nargs="+", metavar="FILE")
    chk.add_argument("--admission-mode", choices=list(ADMISSION_MODES), default="webhook",
                     help="also say which of each policy's rules stay in the webhook when "
                          "the stateless ones run in the API server (fallback, native): "
                          "what still needs a replica up [webhook: nothing said]")
    _add_policy_schema_commands(psub)
    # `gpu-webhook policy` alone lists its subcommands rather than the top-level help.
    pol.set_defaults(func=lambda _args: _usage(pol))


def add_test(sub: Any) -> None:
    t = command(sub, "test", _test)
    t.add_argument("path", metavar="DIR", help="directory of suites, or one suite file")
    t.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _manifests(args: argparse.Namespace) -> int:
    """print the webhook configurations for a policy (YAML)

    Print a MutatingWebhookConfiguration and a ValidatingWebhookConfiguration whose
    matchConditions send only GPU pods and workloads, derived from the policy.
    failurePolicy Fail: while the webhook is down, matching GPU requests are rejected;
    Ignore: they are admitted unchecked (no quota, no pinning). Pods without GPUs of the
    tenants' namespaces go to the routes webhooks. With --admission-mode fallback or
    native, the rules that need no state are also printed as the API server's own
    MutatingAdmissionPolicies and ValidatingAdmissionPolicies, with their bindings.
    """
    from webhook.admission.native import policies as native
    from webhook.policy.apiserver import webhooks as manifests
    from webhook.policy.load import PolicyError, default_policy_text, load_file, load_text

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
        options = manifests.Options(
            name=args.name, namespace=args.namespace, service=args.service, port=args.port,
            url=args.url, ca_bundle=ca, timeout_seconds=args.timeout_seconds,
            mutating_failure_policy=args.mutating_failure_policy,
            validating_failure_policy=args.validating_failure_policy,
            exempt_namespaces=tuple(args.exempt_namespace),
            admission_mode=args.admission_mode)
        objects = manifests.render(policy, options)
        if options.admission_mode != "webhook":
            objects += native.render(policy, options)
            # What still needs a replica up: said, not printed into the manifests.
            for line in native.kept(policy):
                print(f"gpu-webhook manifests: stays in the webhook: {line}", file=sys.stderr)
    except (OSError, ValueError) as exc:
        print(f"gpu-webhook manifests: {exc}", file=sys.stderr)
        return 2
    source = args.policy or "the embedded example policy"
    if args.static_dir:
        return _write_static(args, objects)
    print(manifests.to_yaml(objects, header=(
        f"# Rendered by `gpu-webhook manifests` from {source} (policy "
        f"{policy.metadata.name}).\n# Render again when the policy's gpuResources, "
        "tolerations, nonGpuPodsToleratingGpuTaints, exemptions, workloadKinds or "
        "tenants' namespaces change\n# (the leader does it in the cluster with "
        "--webhook-configurations-sync fix).\n")), end="")
    return 0


def _add_policy_schema_commands(psub: Any) -> None:
    command(psub, "schema", _policy_schema)
    command(psub, "crd", _policy_crd)


def _policy_schema(args: argparse.Namespace) -> int:
    """print the JSON Schema of a policy file

    Print the JSON Schema (draft 2020-12) of a policy file, generated from the policy
    model; editors use it through a `# yaml-language-server: $schema=...` line. Published
    as policies/schema/gpupolicy.schema.json.
    """
    import json

    from webhook.policy.schema import json_schema

    # json, not orjson: its indent=2 output with a final newline is the committed file.
    print(json.dumps(json_schema(), indent=2, ensure_ascii=False))
    return 0


def _policy_crd(args: argparse.Namespace) -> int:
    """print the GPUPolicy CustomResourceDefinition (YAML)

    Print the GPUPolicy CustomResourceDefinition (gpu-webhook.dev/v1alpha1,
    cluster-scoped) whose OpenAPI schema is generated from the policy model. Shipped as
    deploy/base/crd-gpupolicy.yaml.
    """
    from webhook.policy.apiserver.webhooks import to_yaml
    from webhook.policy.schema import crd

    print(to_yaml([crd()], header=(
        "# Rendered by `gpu-webhook policy crd` from the policy model "
        "(webhook/policy/model/).\n")), end="")
    return 0


def _write_static(args: argparse.Namespace, objects: list[dict[str, Any]]) -> int:
    from webhook.admission.native import static

    out = Path(args.static_dir)
    try:
        written = static.files(objects, args.static_path or str(out.resolve()))
        for rel, text in written.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(text)
    except (OSError, ValueError) as exc:
        print(f"gpu-webhook manifests: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} files into {out}: pass "
          f"--admission-control-config-file={out.resolve() / static.CONFIGURATION} and "
          "--feature-gates=ManifestBasedAdmissionControlConfig=true to kube-apiserver",
          file=sys.stderr)
    return 0


def _policy_check(args: argparse.Namespace) -> int:
    """validate policy files

    Load each policy file as the webhook does; an invalid one is reported with the file,
    line and field of each problem. A valid one may still get warnings: what it would do
    that is rarely meant (a per-user cap that training operators' pods would all share).
    With --admission-mode fallback or native, each rule that stays in the webhook (it
    needs state or is not compiled into the API server's admission policies) is listed,
    with the tenants it applies to and why.
    """
    from webhook.admission.native import policies as native
    from webhook.policy.advice import advice
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
        if args.admission_mode != "webhook":
            for line in native.kept(policy):
                print(f"{f}: stays in the webhook: {line}")
        for said in advice(policy):
            print(f"{f}: warning: {said}", file=sys.stderr)
    if failed:
        print(f"{failed} of {len(args.files)} policy files invalid", file=sys.stderr)
    return 1 if failed else 0


def _test(args: argparse.Namespace) -> int:
    """run policy test suites (kind GPUPolicyTest)

    Run every policy test suite (YAML, kind GPUPolicyTest) under DIR, or one suite file:
    each case goes through mutate -> patch -> validate, with quota against the suite's
    usage snapshot; admitted pods reserve quota for the cases after them. Exit 1 when a
    case fails, 2 when a suite cannot run. Format: policies/tests/README.md.
    """
    from webhook.tools import policyresults, policysuite, policytest

    target = Path(args.path)
    if not target.exists():
        print(f"gpu-webhook test: {target} does not exist", file=sys.stderr)
        return 2
    paths = policysuite.discover(target)
    if not paths:
        print(f"gpu-webhook test: no policy test suites (kind {policysuite.KIND}) under "
              f"{target}", file=sys.stderr)
        return 2
    results = [policytest.run_path(p) for p in paths]
    if args.output != "text":
        print(dump(policyresults.as_json(results), args.output))
    else:
        print(policyresults.render_text(results))
    if any(s.error is not None for s in results):
        return 2
    return 1 if any(s.failed for s in results) else 0
