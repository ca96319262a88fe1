"""The one-node cluster's certificates, with the ``cryptography`` package gpu-webhook
already needs (so the host needs no openssl): a CA, then one key and certificate per
``NAME=SUBJECT[;SAN,...]`` argument, and the service-account key pair.

    python3 pki.py DIR apiserver='CN=kube-apiserver;IP:127.0.0.1,DNS:localhost' \
        admin='O=system:masters,CN=admin' ...

A SAN list makes a serving (and client) certificate; none, a client certificate. Files:
DIR/ca.crt, ca.key, NAME.crt, NAME.key, sa.key, sa.pub (PEM).
"""

from __future__ import annotations

import datetime
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ATTRS = {"CN": NameOID.COMMON_NAME, "O": NameOID.ORGANIZATION_NAME}
DAYS = 2


def _name(subject: str) -> x509.Name:
    parts = [p.split("=", 1) for p in subject.split(",") if p]
    return x509.Name([x509.NameAttribute(ATTRS[k], v) for k, v in parts])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=DAYS)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("CN=realnode-ca")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (out / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(out / "ca.key", ca_key)

    for spec in argv[1:]:
        name, _, rest = spec.partition("=")
        subject, _, sans = rest.partition(";")
        key = ec.generate_private_key(ec.SECP256R1())
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(ca_name)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(start).not_valid_after(end)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        if sans:
            alt: list[x509.GeneralName] = []
            for s in sans.split(","):
                kind, _, value = s.partition(":")
                alt.append(x509.IPAddress(ipaddress.ip_address(value)) if kind == "IP"
                           else x509.DNSName(value))
            b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
            usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        (out / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(out / f"{name}.key", key)

    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(out / "sa.key", sa)
    (out / "sa.pub").write_bytes(sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


if __name__ == "__main__":
    main(sys.argv[1:])
