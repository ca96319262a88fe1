"""The helpers of tools/realnode/run.sh and build.sh (docs/real-gpu-node.md) that need no
GPU: the cluster's certificates (pki.py) and the OCI image archives (images.py)."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import tarfile
from pathlib import Path
from types import ModuleType

from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "realnode"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"realnode_{name}", TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_pki_signs_serving_and_client_certificates_with_one_ca(tmp_path: Path) -> None:
    _module("pki").main([str(tmp_path),
                         "apiserver=CN=kube-apiserver;IP:127.0.0.1,DNS:localhost",
                         "admin=O=system:masters,CN=realnode-admin"])
    ca = _cert(tmp_path / "ca.crt")
    server, admin = _cert(tmp_path / "apiserver.crt"), _cert(tmp_path / "admin.crt")
    for cert in (server, admin):
        assert cert.issuer == ca.subject
        cert.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    # The API server reads a client's groups from O and its name from CN.
    assert admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value \
        == "system:masters"
    assert admin.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "realnode-admin"
    assert list(admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) \
        == [ExtendedKeyUsageOID.CLIENT_AUTH]
    load_pem_public_key((tmp_path / "sa.pub").read_bytes())


def test_images_writes_an_oci_layout_ctr_can_name(tmp_path: Path) -> None:
    images = _module("images")
    layer = images.Layer()
    layer.file("bin/hello", b"#!/bin/sh\necho hello\n", 0o755)
    raw = layer.close()
    out = tmp_path / "hello.tar"
    images.write_archive(out, [("example.dev/hello:1", [raw], {"Cmd": ["/bin/hello"]})])
    with tarfile.open(out) as t:
        def read(name: str) -> bytes:
            f = t.extractfile(name)
            assert f is not None
            return f.read()

        assert json.loads(read("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        (desc,) = json.loads(read("index.json"))["manifests"]
        assert desc["annotations"]["io.containerd.image.name"] == "example.dev/hello:1"
        manifest_bytes = read("blobs/sha256/" + desc["digest"].split(":")[1])
        assert hashlib.sha256(manifest_bytes).hexdigest() == desc["digest"].split(":")[1]
        manifest = json.loads(manifest_bytes)
        config = json.loads(read("blobs/sha256/" + manifest["config"]["digest"].split(":")[1]))
        (layer_desc,) = manifest["layers"]
        gz = read("blobs/sha256/" + layer_desc["digest"].split(":")[1])
        assert len(gz) == layer_desc["size"]
        # the config names each layer by the digest of its uncompressed tar
        diff_id = "sha256:" + hashlib.sha256(gzip.decompress(gz)).hexdigest()
        assert config["rootfs"]["diff_ids"] == [diff_id]
        assert config["config"]["Cmd"] == ["/bin/hello"]
