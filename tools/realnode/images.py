"""Write the OCI image archives a one-node cluster needs, without Docker.

- ``pause.tar``: ``registry.k8s.io/pause:3.10.2``, the sandbox image containerd runs for
  every pod: one static program (pause.c).
- ``check.tar``: ``gpu-webhook.dev/check:1``, Debian's static busybox, glibc from Debian's
  libc6 (for ``nvidia-smi``, which NVIDIA's runtime mounts in from the host, and which
  links glibc) and ``/check`` (check.sh: what the container can reach of the GPU); and the
  same layers as ``gpu-webhook.dev/check:cuda``, whose config sets
  ``NVIDIA_VISIBLE_DEVICES=all`` as NVIDIA's CUDA images do.

Each archive is an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256``) with
the ``io.containerd.image.name`` annotation ``ctr -n k8s.io images import`` names it by.

    python3 images.py --pause PAUSE_BINARY --debs DIR_WITH_DEBS --out DIR
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAUSE_NAME = "registry.k8s.io/pause:3.10.2"
CHECK_NAME = "gpu-webhook.dev/check:1"
CUDA_NAME = "gpu-webhook.dev/check:cuda"
APPLETS = ("sh", "ls", "cat", "env", "sleep", "grep", "tr", "echo", "head", "dd", "ps",
           "mount", "id", "true", "false", "test", "[", "wc", "sed", "awk", "find")
EPOCH = 0  # reproducible archives: every mtime 0


def _info(name: str, *, mode: int = 0o644, kind: bytes = tarfile.REGTYPE,
          size: int = 0, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.mode, ti.type, ti.size, ti.linkname, ti.mtime = mode, kind, size, link, EPOCH
    ti.uid = ti.gid = 0
    return ti


class Layer:
    """One layer's tar, built in memory (the images are a few MiB)."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 (closed by close())
        self.dirs: set[str] = set()

    def _parents(self, path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d and d not in self.dirs:
                self.dirs.add(d)
                self.tar.addfile(_info(d, mode=0o755, kind=tarfile.DIRTYPE))

    def dir(self, path: str, mode: int = 0o755) -> None:
        self._parents(path + "/x")
        if path not in self.dirs:
            self.dirs.add(path)
            self.tar.addfile(_info(path, mode=mode, kind=tarfile.DIRTYPE))

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._parents(path)
        self.tar.addfile(_info(path, mode=mode, size=len(data)), io.BytesIO(data))

    def symlink(self, path: str, target: str) -> None:
        self._parents(path)
        self.tar.addfile(_info(path, mode=0o777, kind=tarfile.SYMTYPE, link=target))

    def close(self) -> bytes:
        self.tar.close()
        return self.buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return digest


def _descriptor(media: str, digest: str, size: int, **annotations: str) -> dict[str, object]:
    d: dict[str, object] = {"mediaType": media, "digest": digest, "size": size}
    if annotations:
        d["annotations"] = annotations
    return d


def write_archive(out: Path, images: list[tuple[str, list[bytes], dict[str, object]]]) -> None:
    """An OCI layout archive at ``out`` holding ``images``: (name, layer tars, config)."""
    blobs: dict[str, bytes] = {}
    manifests = []
    for name, layers, conf in images:
        layer_descs, diff_ids = [], []
        for raw in layers:
            diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
            gz = gzip.compress(raw, compresslevel=9, mtime=EPOCH)
            layer_descs.append(_descriptor("application/vnd.oci.image.layer.v1.tar+gzip",
                                           _blob(blobs, gz), len(gz)))
        config = {"architecture": "amd64", "os": "linux", "config": conf,
                  "rootfs": {"type": "layers", "diff_ids": diff_ids},
                  "history": [{"created_by": "tools/realnode/images.py"}]}
        cbytes = json.dumps(config, sort_keys=True).encode()
        manifest = {"schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": _descriptor("application/vnd.oci.image.config.v1+json",
                                          _blob(blobs, cbytes), len(cbytes)),
                    "layers": layer_descs}
        mbytes = json.dumps(manifest, sort_keys=True).encode()
        manifests.append(_descriptor(
            "application/vnd.oci.image.manifest.v1+json", _blob(blobs, mbytes), len(mbytes),
            **{"io.containerd.image.name": name,
               "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}))
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": manifests}
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as t:
        def add(path: str, data: bytes) -> None:
            t.addfile(_info(path, size=len(data)), io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        add("index.json", json.dumps(index, sort_keys=True).encode())
        t.addfile(_info("blobs", mode=0o755, kind=tarfile.DIRTYPE))
        t.addfile(_info("blobs/sha256", mode=0o755, kind=tarfile.DIRTYPE))
        for digest, data in sorted(blobs.items()):
            add("blobs/sha256/" + digest.split(":", 1)[1], data)


def _deb_files(deb: Path) -> Path:
    """The files of a .deb, unpacked into a temporary folder (dpkg-deb -x)."""
    root = Path(tempfile.mkdtemp(prefix="realnode-deb-"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root


def check_layer(debs: Path) -> bytes:
    layer = Layer()
    busybox = _deb_files(next(debs.glob("busybox-static_*.deb")))
    layer.file("bin/busybox", (busybox / "bin/busybox").read_bytes(), 0o755)
    for applet in APPLETS:
        layer.symlink(f"bin/{applet}", "busybox")
    libc = _deb_files(next(debs.glob("libc6_*.deb")))
    for path in sorted(libc.rglob("*")):
        rel = path.relative_to(libc).as_posix()
        if not rel.startswith(("lib/", "lib64/", "usr/lib/", "usr/lib64/")):
            continue
        if "/gconv/" in rel or "/audit/" in rel:
            continue
        if path.is_symlink():
            layer.symlink(rel, str(path.readlink()))
        elif path.is_file():
            layer.file(rel, path.read_bytes(), 0o755 if ".so" in path.name else 0o644)
    layer.file("etc/passwd", b"root:x:0:0:root:/:/bin/sh\n")
    layer.file("etc/group", b"root:x:0:\n")
    layer.file("etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n")
    layer.dir("etc/ld.so.conf.d")
    layer.dir("tmp", 0o1777)
    layer.dir("usr/bin")
    layer.dir("proc")
    layer.dir("sys")
    layer.dir("dev")
    layer.file("check", (HERE / "check.sh").read_bytes(), 0o755)
    return layer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pause", type=Path, required=True, help="the static pause program")
    ap.add_argument("--debs", type=Path, required=True,
                    help="a folder with busybox-static_*.deb and libc6_*.deb")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    pause = Layer()
    pause.file("pause", a.pause.read_bytes(), 0o755)
    write_archive(a.out / "pause.tar", [(PAUSE_NAME, [pause.close()], {
        "Entrypoint": ["/pause"], "User": "65535:65535"})])

    layer = check_layer(a.debs)
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    write_archive(a.out / "check.tar", [
        (CHECK_NAME, [layer], {"Cmd": ["/check"], "Env": [f"PATH={path}"]}),
        (CUDA_NAME, [layer], {"Cmd": ["/check"], "Env": [
            f"PATH={path}", "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]}),
    ])
    for f in ("pause.tar", "check.tar"):
        print(f"{a.out / f}: {(a.out / f).stat().st_size} bytes")


if __name__ == "__main__":
    main()
