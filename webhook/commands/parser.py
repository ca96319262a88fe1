"""How a command is declared: its name, the function that runs it, and the flags more
than one command shares, so that a flag reads the same in every ``--help``."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import Any

Run = Callable[[argparse.Namespace], int]


def command(sub: Any, name: str, run: Run) -> argparse.ArgumentParser:
    """The command ``name`` under ``sub`` (argparse's subparsers), run by ``run``.

    ``run``'s docstring is what users read: its first paragraph the one line in the list of
    commands, the rest the description that ``--help`` opens with (as click does), so the
    words stay beside the code that does what they say. argparse fills both again to the
    terminal's width, so the docstring's own line breaks do not show."""
    summary, _, rest = (inspect.getdoc(run) or "").partition("\n\n")
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=" ".join(summary.split()), description=" ".join(rest.split()) or None)
    parser.set_defaults(func=run)
    return parser


def add_kubeconfig(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig``, for the commands that read the cluster."""
    parser.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, "
                                             "~/.kube/config, or in-cluster)")


def add_requester(parser: argparse.ArgumentParser) -> None:
    """``--user`` and ``--group``: who asks, for the commands that build a review."""
    parser.add_argument("--user", default="developer", help="requesting user [developer]")
    parser.add_argument("--group", action="append", default=[],
                        help="user's group (repeatable)")
