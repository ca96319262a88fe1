"""What users expect of a command line: ``-o yaml|json`` on ``review`` and ``test``, the
exit codes in every command's ``--help``, ``gpu-webhook policy`` alone listing its
subcommands, and shell completion that completes real subcommands and choices."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import yaml
from clikit import TRAINER

from webhook.cli import EXIT_CODES

Run = Callable[..., subprocess.CompletedProcess[str]]  # the gpu_webhook fixture

ROOT = Path(__file__).resolve().parents[2]


def test_review_prints_the_same_results_as_yaml_and_json(gpu_webhook: Run) -> None:
    as_json = gpu_webhook("review", "-f", "-", "-o", "json", stdin=TRAINER)
    as_yaml = gpu_webhook("review", "-f", "-", "-o", "yaml", stdin=TRAINER)
    assert as_json.returncode == as_yaml.returncode == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout) == orjson.loads(as_json.stdout)
    assert yaml.safe_load(as_yaml.stdout)[0]["decision"] == "allowed"


def test_test_prints_the_same_results_as_yaml_and_json(gpu_webhook: Run) -> None:
    suite = str(ROOT / "policies" / "tests" / "multi-tenant.yaml")
    as_json = gpu_webhook("test", suite, "-o", "json")
    as_yaml = gpu_webhook("test", suite, "-o", "yaml")
    assert as_json.returncode == as_yaml.returncode == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout) == orjson.loads(as_json.stdout)


@pytest.mark.parametrize("command", sorted(EXIT_CODES))
def test_every_commands_help_lists_its_exit_codes(gpu_webhook: Run, command: str) -> None:
    args = [] if command == "gpu-webhook" else command.split()
    done = gpu_webhook(*args, "--help")
    assert done.returncode == 0
    assert "exit status: " in done.stdout
    assert " ".join(done.stdout.split("exit status: ", 1)[1].split()) == \
        f"{EXIT_CODES[command]}."


def test_every_command_is_given_its_exit_codes() -> None:
    from webhook.cli import _parser

    def paths(parser: object, path: str = "") -> list[str]:
        import argparse

        assert isinstance(parser, argparse.ArgumentParser)
        out = [path or "gpu-webhook"]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    out += paths(child, f"{path} {name}".strip())
        return out

    assert sorted(paths(_parser())) == sorted(EXIT_CODES)


def test_policy_alone_lists_its_subcommands(gpu_webhook: Run) -> None:
    done = gpu_webhook("policy")
    assert done.returncode == 2
    assert "{check,schema,crd}" in done.stderr
    assert "validate policy files" in done.stderr


def _complete(script: Path, *words: str) -> list[str]:
    """What bash completes after ``words`` (the last one being typed), by shtab's function."""
    line = " ".join(words)
    words_array = " ".join(f"'{w}'" for w in words)
    program = (f"source '{script}'; COMP_WORDS=({words_array}); COMP_CWORD={len(words) - 1}; "
               f"COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; "
               f"_shtab_gpu_webhook gpu-webhook '{words[-1]}' '{words[-2]}'; "
               'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completion_completes_subcommands_and_choices(gpu_webhook: Run,
                                                           tmp_path: Path) -> None:
    done = gpu_webhook("completion", "bash")
    assert done.returncode == 0, done.stderr
    script = tmp_path / "gpu-webhook.bash"
    script.write_text(done.stdout)
    assert _complete(script, "gpu-webhook", "pol") == ["policy"]
    assert _complete(script, "gpu-webhook", "policy", "") == ["check", "schema", "crd"]
    assert _complete(script, "gpu-webhook", "review", "-o", "") == ["text", "json", "yaml"]


def test_zsh_completion_is_a_zsh_completion_function(gpu_webhook: Run, tmp_path: Path
                                                     ) -> None:
    done = gpu_webhook("completion", "zsh")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#compdef gpu-webhook")
    if shutil.which("zsh"):
        script = tmp_path / "_gpu-webhook"
        script.write_text(done.stdout)
        checked = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True,
                                 timeout=30)
        assert checked.returncode == 0, checked.stderr


def test_an_unknown_shell_is_a_usage_error(gpu_webhook: Run) -> None:
    done = gpu_webhook("completion", "fish")
    assert done.returncode == 2
    assert "invalid choice: 'fish'" in done.stderr
