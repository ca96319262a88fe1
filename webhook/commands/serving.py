"""``serve`` (the HTTPS admission webhook) and ``certs`` (a CA and a serving
certificate)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from webhook.commands.parser import command


def add_serve(sub: Any) -> None:
    from webhook.server.settings import Settings

    Settings.add_arguments(command(sub, "serve", _serve))


def add_certs(sub: Any) -> None:
    c = command(sub, "certs", _certs)
    c.add_argument("--service", default="gpu-webhook", help="Service name [gpu-webhook]")
    c.add_argument("--namespace", default="gpu-webhook", help="Service namespace [gpu-webhook]")
    c.add_argument("--dns", action="append", default=[], help="extra DNS name (repeatable)")
    c.add_argument("--ip", action="append", default=[], help="extra IP address (repeatable)")
    c.add_argument("--days", type=int, default=365, help="serving certificate validity [365]")
    c.add_argument("--out", default="certs", help="output directory [certs]")
    c.add_argument("--ca", help="existing CA certificate to sign with (with --ca-key)")
    c.add_argument("--ca-key", help="existing CA private key")
    c.add_argument("--force", action="store_true", help="overwrite existing files")


def _serve(args: argparse.Namespace) -> int:
    """run the HTTPS admission webhook"""
    from webhook.server.run import run
    from webhook.server.settings import Settings

    return run(Settings.from_args(args))


def _certs(args: argparse.Namespace) -> int:
    """create a CA and a serving certificate"""
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
