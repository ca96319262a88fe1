"""``admission-review``: the AdmissionReview the API server would send for a manifest,
or a webhook's reply decoded."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from webhook.commands.output import dump
from webhook.commands.parser import add_requester, command


def add_admission_review(sub: Any) -> None:
    ar = command(sub, "admission-review", _admission_review)
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
    add_requester(ar)
    ar.add_argument("-o", "--output", choices=["text", "json"], default="text",
                    help="with --reply [text]")


def _admission_review(args: argparse.Namespace) -> int:
    """the AdmissionReview the API server would send for a manifest, or a reply decoded

    -f MANIFEST: print the AdmissionReview (admission.k8s.io/v1, JSON) the API server
    sends for the object's creation, to POST to the webhook's /mutate or /validate (curl
    -d @FILE). --reply FILE: read the webhook's answer and print it decoded: allowed or
    the denial's message, the warnings, and the JSONPatch one operation a line.
    """
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
    print(dump(wire.as_data(reply), "json") if args.output == "json" else wire.text(reply))
    return 0 if reply.allowed else 1
