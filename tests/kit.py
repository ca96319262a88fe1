"""Helpers every test folder shares: the installed console script, a free port, the
helm binary, and the admission pipeline's validating step for synchronous tests.

``tests/`` is on ``sys.path`` while the suite runs (pytest puts the directory of the
root ``conftest.py`` there), so any test module can ``from kit import ...``.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from webhook.admission import webhooks
from webhook.admission.webhooks import Cluster
from webhook.engine.decision import Decision
from webhook.engine.devices import ClaimLookup, no_claims
from webhook.engine.target import NamespaceLabels, no_labels
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.store import UsageStore


def console_script() -> str:
    """The ``gpu-webhook`` script installed next to the interpreter running the tests:
    the tests run the command exactly as a user does."""
    beside = Path(sys.executable).with_name("gpu-webhook")
    if beside.exists():
        return str(beside)
    found = shutil.which("gpu-webhook")
    if found is None:
        pytest.fail("the gpu-webhook console script is not installed (pip install -e .)")
    return found


HELM_BUILD = Path(__file__).resolve().parent / "deploy" / "helm" / "build.sh"


def helm() -> str:
    """The helm binary (Helm v3), built from the Go module proxy by
    ``tests/deploy/helm/build.sh`` and cached (``make test`` builds it first). A helm that
    cannot be built fails the test: a skip would pass CI with the chart untested."""
    out = subprocess.run(["bash", str(HELM_BUILD)], capture_output=True, text=True,
                         check=False, timeout=1800)
    assert out.returncode == 0, f"tests/deploy/helm/build.sh could not build helm:\n{out.stderr}"
    path = out.stdout.strip().splitlines()[-1]
    assert Path(path).is_file(), path
    return path


def kube_version() -> str:
    """The Kubernetes release the e2e control plane runs (tests/e2e/controlplane/
    versions.env), for ``helm template --kube-version``: a helm built from source without
    the release's link flags takes its cluster to be v1.20.0, below the chart's
    ``kubeVersion``, where an official build assumes the release it was built against."""
    env = HELM_BUILD.parents[2] / "e2e" / "controlplane" / "versions.env"
    [line] = [ln for ln in env.read_text().splitlines() if ln.startswith("K8S_VERSION=")]
    return line.split("=", 1)[1].strip()


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def validating(req: AdmissionRequest, policy: CompiledPolicy,
               labels: NamespaceLabels = no_labels, store: UsageStore | None = None,
               claims: ClaimLookup = no_claims, budget: float = 1.0) -> Decision:
    """The validating webhook exactly as the server runs it (``webhook.admission.webhooks``), from
    synchronous test code; with ``store``, quota is checked and committed in it, within
    ``budget`` seconds (the server's default)."""
    return asyncio.run(webhooks.validating(req, policy, Cluster(labels, store,
                                                                 claims=claims), budget))
