"""``completion``: a shell completion script generated from the parser."""

from __future__ import annotations

import argparse
from typing import Any


def add_completion(sub: Any, root: argparse.ArgumentParser) -> None:
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


def _completion(root: argparse.ArgumentParser, shell: str) -> int:
    import shtab

    print(shtab.complete(root, shell=shell), end="")
    return 0
