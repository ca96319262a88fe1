"""``gpu-webhook certs``: the files it writes are what the API server will accept.

The API server checks the serving certificate against the webhook configuration's
caBundle, for the Service DNS name it calls (``svc.ns.svc``) or the URL's host, and
rejects a certificate that is expired or not meant for server authentication. These tests
run the real command and verify its output with cryptography's X.509 path validation.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

GPU_WEBHOOK = str(Path(sys.executable).with_name("gpu-webhook"))
NAMES = ["gpu-webhook", "gpu-webhook.gpu-system", "gpu-webhook.gpu-system.svc",
         "gpu-webhook.gpu-system.svc.cluster.local"]


def certs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPU_WEBHOOK, "certs", *args], capture_output=True, text=True,
                          timeout=60)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def verify(ca: x509.Certificate, leaf: x509.Certificate,
           name: x509.DNSName | x509.IPAddress) -> None:
    verifier = PolicyBuilder().store(Store([ca])).build_server_verifier(name)
    verifier.verify(leaf, [])


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("certs") / "out"
    done = certs("--service", "gpu-webhook", "--namespace", "gpu-system", "--dns",
                 "webhook.example.com", "--ip", "127.0.0.1", "--ip", "::1", "--days", "30",
                 "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out, done


def test_writes_ca_serving_pair_and_prints_the_ca_bundle(issued):
    out, done = issued
    assert sorted(p.name for p in out.iterdir()) == ["ca-key.pem", "ca.pem", "tls.crt",
                                                     "tls.key"]
    # stdout is exactly the caBundle a webhook configuration needs, for scripts.
    assert base64.b64decode(done.stdout.strip()) == (out / "ca.pem").read_bytes()
    for key in ("tls.key", "ca-key.pem"):
        assert stat.S_IMODE(os.stat(out / key).st_mode) == 0o600, f"{key} readable by others"


def test_sans_cover_every_service_name_and_the_extra_names(issued):
    out, _ = issued
    sans = load(out / "tls.crt").extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [*NAMES, "webhook.example.com"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1"),
                                                        ipaddress.ip_address("::1")]


@pytest.mark.parametrize("name", [*NAMES, "webhook.example.com"])
def test_chain_verifies_for_each_dns_name(issued, name):
    out, _ = issued
    verify(load(out / "ca.pem"), load(out / "tls.crt"), x509.DNSName(name))


@pytest.mark.parametrize("ip", ["127.0.0.1", "::1"])
def test_chain_verifies_for_each_ip(issued, ip):
    out, _ = issued
    verify(load(out / "ca.pem"), load(out / "tls.crt"), x509.IPAddress(ipaddress.ip_address(ip)))


def test_chain_does_not_verify_for_another_name_or_another_ca(issued, tmp_path):
    out, _ = issued
    with pytest.raises(VerificationError):
        verify(load(out / "ca.pem"), load(out / "tls.crt"),
               x509.DNSName("gpu-webhook.other-namespace.svc"))
    assert certs("--out", str(tmp_path / "other")).returncode == 0
    with pytest.raises(VerificationError):
        verify(load(tmp_path / "other" / "ca.pem"), load(out / "tls.crt"),
               x509.DNSName("gpu-webhook.gpu-system.svc"))


def test_validity_dates_and_expiry_explained(issued):
    out, done = issued
    leaf, ca = load(out / "tls.crt"), load(out / "ca.pem")
    now = dt.datetime.now(dt.UTC)
    assert leaf.not_valid_before_utc <= now
    assert abs(leaf.not_valid_after_utc - (now + dt.timedelta(days=30))) < dt.timedelta(hours=1)
    assert ca.not_valid_after_utc > leaf.not_valid_after_utc
    assert f"expires {leaf.not_valid_after_utc:%Y-%m-%d} (30 days)" in done.stderr
    assert "renew" in done.stderr


def test_key_usage_is_server_auth_only(issued):
    out, _ = issued
    leaf, ca = load(out / "tls.crt"), load(out / "ca.pem")
    assert leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == \
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
    usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True


def test_refuses_to_overwrite_without_force(issued):
    out, _ = issued
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    done = certs("--out", str(out))
    assert done.returncode == 2
    assert "--force" in done.stderr and "already exist" in done.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_force_renews_with_the_same_ca(tmp_path):
    out = tmp_path / "certs"
    assert certs("--out", str(out)).returncode == 0
    ca_pem, ca_key = (out / "ca.pem").read_bytes(), (out / "ca-key.pem").read_bytes()
    old_serial = load(out / "tls.crt").serial_number
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "ca.pem").write_bytes(ca_pem)
    (keep / "ca-key.pem").write_bytes(ca_key)
    done = certs("--out", str(out), "--force", "--ca", str(keep / "ca.pem"),
                 "--ca-key", str(keep / "ca-key.pem"))
    assert done.returncode == 0, done.stderr
    assert (out / "ca.pem").read_bytes() == ca_pem  # the caBundle in the cluster stays valid
    leaf = load(out / "tls.crt")
    assert leaf.serial_number != old_serial
    verify(x509.load_pem_x509_certificate(ca_pem), leaf,
           x509.DNSName("gpu-webhook.gpu-webhook.svc"))


@pytest.mark.parametrize(("args", "message"), [
    (["--ip", "not-an-ip"], "is not an IP address"),
    (["--days", "0"], "at least 1 day"),
    (["--ca", "x.pem"], "--ca and --ca-key go together"),
])
def test_bad_input_is_a_usage_error(tmp_path, args, message):
    done = certs("--out", str(tmp_path / "out"), *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "out").exists()


def test_serving_certificate_may_not_outlive_the_ca(tmp_path):
    assert certs("--out", str(tmp_path / "a"), "--days", "1").returncode == 0
    # A CA made with the default 10 years cannot sign a 20-year serving certificate.
    done = certs("--out", str(tmp_path / "b"), "--days", str(365 * 20), "--ca",
                 str(tmp_path / "a" / "ca.pem"), "--ca-key", str(tmp_path / "a" / "ca-key.pem"))
    assert done.returncode == 2
    assert "the CA expires" in done.stderr
