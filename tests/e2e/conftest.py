"""Fixtures for the end-to-end suite: one real control plane, the webhook deployed on it
as a cluster would run it, and a fresh tenant namespace per test.

One etcd + kube-apiserver serves the whole session (starting it takes seconds; the
binaries are built once by ``tests/e2e/controlplane/build.sh`` and cached). Each test
module gets its own webhook deployment and installs its webhook configurations for its
own tests only, removing them when it ends, so modules never see each other's webhook.
Namespaces are never deleted (without a controller-manager, deletion never finishes),
so every test gets a new one, labelled to join the tenant it needs.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controlplane.cluster import ControlPlane, build_binaries
from e2ekit import (
    LEDGER_NAMESPACE,
    ROOT,
    Deployment,
    NamespaceFactory,
    create_namespace,
    delete_crds,
    deployed,
    short_id,
)

# The simulated GPU cluster (scheduler, controllers, kwok nodes): started only by the
# tests that ask for it (tests/e2e/test_e2e_sim_*.py).
from gpucluster.fixtures import (  # noqa: F401
    api,
    core,
    exempt,
    sim,
    sim_namespace,
    tenant_ns,
)
from kit import helm

_VERSIONS: dict[str, str] = {}
POLICY_CRD = "gpupolicies.gpu-webhook.dev"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e is marked ``e2e``, even one whose module forgot
    ``pytestmark``, so `pytest -m "not e2e"` never starts a control plane."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _VERSIONS:
        terminalreporter.write_sep("-", "e2e control plane")
        for name, version in _VERSIONS.items():
            terminalreporter.write_line(f"{name}: {version}")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory,
                  pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver for the whole session, with admin credentials."""
    t0 = time.monotonic()
    cp = ControlPlane(build_binaries(), tmp_path_factory.mktemp("controlplane"))
    cp.start()
    try:
        client = cp.kubectl("version", "--client", "-o", "yaml").stdout
        kubectl = next((line.split(":", 1)[1].strip() for line in client.splitlines()
                        if line.strip().startswith("gitVersion:")), "?")
        _VERSIONS["kube-apiserver"] = cp.version
        _VERSIONS["kubectl"] = kubectl
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"\ne2e control plane: kube-apiserver {cp.version}, "
                                f"kubectl {kubectl}, ready in {time.monotonic() - t0:.1f}s")
        cp.kubectl("create", "namespace", LEDGER_NAMESPACE)
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def webhook(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
            request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """The webhook deployed and its configurations installed for this module.

    A module sets ``E2E_REPLICAS = 2`` for two replicas behind a round-robin proxy, or
    ``E2E_PROXY = True`` for the proxy in front of one replica.
    """
    replicas = getattr(request.module, "E2E_REPLICAS", 1)
    proxy = getattr(request.module, "E2E_PROXY", False)
    workdir = tmp_path_factory.mktemp(f"webhook-{request.module.__name__}")
    with deployed(control_plane, workdir, replicas=replicas, proxy=proxy) as d, d.installed():
        yield d


@pytest.fixture(scope="module")
def helm_run(control_plane: ControlPlane) -> Any:
    """``helm`` as a user runs it (from the repository), with its own home on this
    control plane."""
    binary = helm()
    env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig),
           "HELM_CACHE_HOME": str(control_plane.work_dir / "helm-cache"),
           "HELM_CONFIG_HOME": str(control_plane.work_dir / "helm-config"),
           "HELM_DATA_HOME": str(control_plane.work_dir / "helm-data")}

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        assert args[0] == "helm"
        return subprocess.run([binary, *args[1:]], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300, check=False)

    return run


@pytest.fixture
def no_crd(control_plane: ControlPlane) -> Iterator[None]:
    """The chart owns the GPUPolicy CRD: one applied by another module's kubectl would
    be refused as not the release's. Remove it (and wait) before, and after."""
    delete_crds(control_plane, POLICY_CRD)
    yield
    delete_crds(control_plane, POLICY_CRD)


@pytest.fixture
def namespace(control_plane: ControlPlane) -> NamespaceFactory:
    """``namespace(tenant)``: a new namespace labelled to join ``tenant``."""

    def make(tenant: str) -> str:
        name = f"e2e-{tenant}-{short_id()}"
        create_namespace(control_plane, name, tenant)
        return name

    return make
