"""Every ``bench.scale`` command bench/README.md shows in a code block is one its command
line takes: a flag renamed or dropped would leave the measurements' commands (the
figures' provenance) unreproducible. The run itself is a benchmark of 20-40 minutes and
is not made here."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "bench" / "README.md"

# Run as the benchmark runs (python -m, from the repository): the bench package is not
# installed with the webhook, and tests/bench would shadow it here.
SCRIPT = """
import json, sys
from bench.scale import parser
bad = []
for argv in json.load(sys.stdin):
    try:
        parser().parse_args(argv)
    except SystemExit:
        bad.append(argv)
print(json.dumps(bad))
"""


def commands(text: str) -> list[list[str]]:
    """The arguments of each ``bench.scale`` command in the fenced code blocks of
    ``text`` (continuation lines joined; ``a|b`` alternatives each taken)."""
    out: list[list[str]] = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0]
            if "bench.scale" not in line:
                continue
            words = shlex.split(line)
            args = words[words.index("bench.scale") + 1:]
            choices = [i for i, w in enumerate(args) if "|" in w]
            variants = [args]
            for i in choices:
                variants = [[*v[:i], alt, *v[i + 1:]] for v in variants
                            for alt in args[i].split("|")]
            out.extend(variants)
    return out


def test_the_readme_commands_are_found() -> None:
    found = commands(README.read_text())
    assert ["--help"] in found
    assert any("--floor" in c and "--rounds" in c for c in found)
    assert any("--over-quota" in c and "wait" in c for c in found)


def test_every_bench_scale_command_of_the_readme_parses() -> None:
    found = [c for c in commands(README.read_text()) if c != ["--help"]]
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, input=json.dumps(found),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], proc.stderr


def test_a_flag_the_command_line_does_not_take_is_caught() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT,
                          input=json.dumps([["--rounds", "2", "--no-such-flag"]]),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [["--rounds", "2", "--no-such-flag"]]
