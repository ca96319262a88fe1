"""The ``gpu-webhook`` command line. Thin: parse flags, call the modules that do the work.

The parser is put together here from the command families of :mod:`webhook.commands`,
each of which adds its commands and runs them.

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
from typing import NoReturn

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
    from webhook.commands import cluster, completion, policy, review, serving, wire

    p = _Parser(prog="gpu-webhook",
                                description="Admission webhook that governs GPU workloads.")
    p.add_argument("--version", action="version", version=f"gpu-webhook {__version__}")
    sub = p.add_subparsers(title="commands")
    # The order the commands are listed in (--help, completion).
    serving.add_serve(sub)
    serving.add_certs(sub)
    policy.add_manifests(sub)
    policy.add_policy(sub)
    review.add_review(sub)
    cluster.add_audit(sub)
    cluster.add_status(sub)
    cluster.add_usage(sub)
    cluster.add_failure_policy(sub)
    policy.add_test(sub)
    wire.add_admission_review(sub)
    completion.add_completion(sub, p)
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
    "usage": "0 printed; 2 the period, the cluster or the policy cannot be read",
    "failure-policy": "0 set (or already so); 2 the configurations cannot be read or "
                      "patched",
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


if __name__ == "__main__":
    sys.exit(main())
