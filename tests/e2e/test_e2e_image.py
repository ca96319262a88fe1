"""The container image: built from the repository's Dockerfile, run as the shipped
Deployment runs it (its own non-root user, a read-only root filesystem, no
capabilities), and called by the real API server for a developer's ``kubectl apply``.

The image starts from a Debian base made here (no registry is reachable; see
imagekit.py); everything after the ``FROM`` is the Dockerfile a user builds. Cold, the
base takes a minute or two to make and the build two more (pip downloads the
dependencies); warm, the base is cached and the dependencies' layer too, so only the
package itself is reinstalled.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import imagekit
import pytest
from controlplane.cluster import ControlPlane
from e2ekit import (
    GPU_TOLERATION,
    LEDGER_NAMESPACE,
    MUTATED_ANNOTATION,
    Deployment,
    NamespaceFactory,
    apply,
    capped_policy,
    get,
    gpu_pod,
    gpu_webhook,
    wait_ready,
)
from kit import free_port

from webhook import __version__

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    missing = imagekit.missing_tools()
    # Installed by `make test` (the Makefile's image-tools): missing, the test fails.
    assert not missing, f"{', '.join(missing)} not installed: make image-tools (as root)"
    return imagekit.podman_env(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="module")
def image(podman_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory,
          pytestconfig: pytest.Config) -> Iterator[str]:
    t0 = time.monotonic()
    tag = imagekit.build(podman_env, tmp_path_factory.mktemp("build"))
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nimage {tag}: {imagekit.size_mb(podman_env, tag):.0f} MB, "
                            f"built in {time.monotonic() - t0:.0f}s")
    yield tag


def test_the_image_runs_the_command_as_its_numeric_non_root_user(
        podman_env: dict[str, str], image: str) -> None:
    user = imagekit.podman(podman_env, "image", "inspect", "--format", "{{.Config.User}}",
                           image).stdout.strip()
    assert user == "65532:65532"  # the Deployment's runAsUser, checkable by runAsNonRoot
    version = imagekit.podman(podman_env, "run", "--rm", "--read-only",
                              "--entrypoint", "gpu-webhook", image, "--version").stdout
    assert version.strip() == f"gpu-webhook {__version__}"
    # The package's data files are in it: `manifests` renders from the embedded policy.
    manifests = imagekit.podman(podman_env, "run", "--rm", "--read-only",
                                "--entrypoint", "gpu-webhook", image, "manifests").stdout
    assert "kind: MutatingWebhookConfiguration" in manifests


def _served(control_plane: ControlPlane, work: Path) -> dict[Path, str]:
    """What the Deployment mounts, as files: the serving certificate (the Secret), the
    policy (the ConfigMap) and, instead of a ServiceAccount's token, a kubeconfig."""
    certs, policy, kube = work / "certs", work / "policy", work / "kube"
    gpu_webhook("certs", "--out", str(certs), "--dns", "localhost", "--ip", "127.0.0.1")
    policy.mkdir()
    capped_policy(policy, "policy.yaml", ["image"], 2)
    kube.mkdir()
    flat = control_plane.kubectl("config", "view", "--raw", "--flatten", "--minify").stdout
    (kube / "config").write_text(flat)
    for path in (certs, policy, kube):
        imagekit.readable_by_the_image_user(path)
    return {certs: "/certs", policy: "/etc/gpu-webhook", kube: "/var/run/gpu-webhook"}


def test_the_api_server_calls_the_webhook_served_from_the_image(
        podman_env: dict[str, str], image: str, control_plane: ControlPlane,
        namespace: NamespaceFactory, tmp_path: Path) -> None:
    work = tmp_path / "served"
    work.mkdir()
    mounts = _served(control_plane, work)
    port = free_port()
    args = ["--host", "127.0.0.1", "--cert-dir=/certs",
            "--policy=/etc/gpu-webhook/policy.yaml",
            "--kubeconfig=/var/run/gpu-webhook/config", "--namespace", LEDGER_NAMESPACE]
    with imagekit.running(podman_env, image, work, port, mounts, args) as container:
        wait_ready(container, work / "certs" / "ca.pem")  # type: ignore[arg-type]
        d = Deployment(control_plane, work, work / "certs", work / "policy" / "policy.yaml",
                       replicas=[container])  # type: ignore[list-item]

        # The process inside: the image's user, on a read-only root.
        status = imagekit.podman(podman_env, "exec", container.name,
                                 "cat", "/proc/1/status", "/proc/1/mounts").stdout
        uids = next(line.split()[1:] for line in status.splitlines()
                    if line.startswith("Uid:"))
        assert set(uids) == {"65532"}
        root = next(line.split() for line in status.splitlines()
                    if line.split()[1:2] == ["/"])
        assert "ro" in root[3].split(",")

        with d.installed():
            ns = namespace("image")
            out = apply(control_plane, ns, gpu_pod("train", limits="2"))
            assert out.returncode == 0, out.stderr + container.log()[-3000:]
            pod: dict[str, Any] = get(control_plane, ns, "pod", "train")
            resources = pod["spec"]["containers"][0]["resources"]
            assert resources["requests"] == {"nvidia.com/gpu": "2"}
            assert GPU_TOLERATION in pod["spec"]["tolerations"]
            assert MUTATED_ANNOTATION in pod["metadata"]["annotations"]

            # The quota ledger, kept in the cluster by the container: the tenant's 2 GPUs
            # are taken, one more is refused.
            more = apply(control_plane, ns, gpu_pod("more", limits="1"))
            assert more.returncode != 0
            assert "exceeded quota" in more.stderr, more.stderr

