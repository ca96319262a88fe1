"""The webhook's container image, built from the repository's own Dockerfile and run with
podman as a kubelet would run the shipped Deployment.

No image registry is reachable here, so the Dockerfile's ``BASE`` (``python:3.11-slim``
by default) is replaced by an image made from Debian's own packages: ``mmdebstrap``
writes a minimal bookworm root filesystem with Python 3.11 and its venv module, cached
under ``~/.cache/gpu-webhook/image-base`` by a key of what it contains, and ``podman
import`` makes it an image. Everything else is the Dockerfile as a user builds it.

podman runs as root with runc and cgroupfs, and no default ulimits: crun refuses this
machine's hybrid cgroups and the default ulimits cannot be set in its sandbox
(``containers.conf`` below). Both the build and the container use the host's network:
no bridge is configured, and the webhook then listens on the loopback address the
e2e API server calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import ssl
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from e2ekit import ROOT, Replica

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpu-webhook"
IMAGE = "localhost/gpu-webhook:e2e"

# The base image: Debian bookworm's Python 3.11 at `python`, its venv module, and the CA
# certificates pip needs. Documentation, manual pages and translations are left out.
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
BASE_DPKG_OPTIONS = tuple(f"path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale",
                                                                      "info"))

CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""

# What make test installs for this module (Makefile, image-tools).
TOOLS = ("podman", "runc", "mmdebstrap")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def podman_env(work: Path) -> dict[str, str]:
    conf = work / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(env: dict[str, str], *args: str, timeout: float = 120,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def base_key() -> str:
    spec = {"suite": BASE_SUITE, "packages": BASE_PACKAGES, "dpkg": BASE_DPKG_OPTIONS,
            "variant": "minbase"}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def base_image(env: dict[str, str]) -> str:
    """The Debian base image, imported into podman's store (the tarball built once)."""
    key = base_key()
    tag = f"localhost/gpu-webhook-base:{BASE_SUITE}-{key}"
    if podman(env, "image", "exists", tag, check=False).returncode == 0:
        return tag
    tarball = CACHE / "image-base" / f"{BASE_SUITE}-{key}.tar"
    if not tarball.exists():
        tarball.parent.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial")
        done = subprocess.run(
            ["mmdebstrap", "--variant=minbase", "--format=tar",
             "--include=" + ",".join(BASE_PACKAGES),
             *(f"--dpkgopt={o}" for o in BASE_DPKG_OPTIONS), BASE_SUITE, str(partial)],
            capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise AssertionError(f"mmdebstrap exited {done.returncode}:\n{done.stderr[-3000:]}")
        partial.rename(tarball)
    podman(env, "import", str(tarball), tag, timeout=300)
    return tag


def host_ca_bundle() -> Path:
    """The CA certificates the host trusts (a TLS-inspecting proxy's CA included), for
    pip inside the build."""
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      ssl.get_default_verify_paths().cafile,
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise AssertionError("no CA bundle on the host for pip inside the image build")


def build(env: dict[str, str], work: Path) -> str:
    """``podman build`` of the repository's Dockerfile on the Debian base; the tag."""
    before = podman(env, "image", "inspect", "--format", "{{.Id}}", IMAGE, check=False)
    pip_conf = work / "pip.conf"
    pip_conf.write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    podman(env, "build", "--network", "host", "--build-arg", f"BASE={base_image(env)}",
           # Mounted for the RUN steps only, never stored in a layer.
           "-v", f"{host_ca_bundle()}:/etc/ssl/certs/ca-certificates.crt:ro",
           "-v", f"{pip_conf}:/etc/pip.conf:ro",
           "-f", str(ROOT / "Dockerfile"), "-t", IMAGE, str(ROOT), timeout=1200)
    # The image this tag named before, now untagged: gone, so that runs do not pile up
    # copies of the virtualenv (the layers the next build reuses stay).
    now = podman(env, "image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    if before.returncode == 0 and before.stdout.strip() != now:
        podman(env, "rmi", before.stdout.strip(), check=False)
    return IMAGE


def size_mb(env: dict[str, str], image: str) -> float:
    out = podman(env, "image", "inspect", "--format", "{{.Size}}", image).stdout
    return int(out.strip()) / 1e6


@dataclass
class Container(Replica):
    """One ``podman run`` of the image, in the foreground (its logs to ``log_path``):
    stopped as a replica is (podman passes SIGTERM on to the webhook), then removed."""

    name: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        super().stop()
        podman(self.env, "rm", "-f", "--ignore", self.name, check=False)


def readable_by_the_image_user(path: Path) -> Path:
    """A Secret or ConfigMap volume as the kubelet mounts it for ``fsGroup: 65532``."""
    shutil.chown(path, 65532, 65532)
    path.chmod(0o750 if path.is_dir() else 0o440)
    for child in path.iterdir() if path.is_dir() else ():
        readable_by_the_image_user(child)
    return path


@contextmanager
def running(env: dict[str, str], image: str, work: Path, port: int,
            mounts: dict[Path, str], args: Sequence[str]) -> Iterator[Container]:
    """The image run as the shipped Deployment runs it: its own non-root user (the
    image's USER, not given here), a read-only root filesystem with a small /tmp, every
    capability dropped, no privilege escalation; ``mounts`` read-only."""
    name = f"gpu-webhook-e2e-{uuid.uuid4().hex[:6]}"
    volumes = [f"--volume={host}:{inside}:ro" for host, inside in mounts.items()]
    log_path = work / f"{name}.log"
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            ["podman", "run", "--rm", "--name", name, "--network", "host",
             "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:size=16m",
             "--cap-drop", "ALL", "--security-opt", "no-new-privileges", *volumes,
             image, "--port", str(port), *args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
    container = Container(process, port, log_path, name=name, env=env)
    try:
        yield container
    finally:
        container.stop()
