"""X.509 for the webhook: a CA and a serving certificate for the Service's DNS names.

This is the one module that imports ``cryptography``. The API server verifies the
webhook's certificate against the ``caBundle`` in the webhook configuration and checks
that a SAN matches the Service DNS name it calls (``svc.ns.svc``) or the URL host.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE, CA_KEY_FILE = "ca.pem", "ca-key.pem"
CERT_FILE, KEY_FILE = "tls.crt", "tls.key"


@dataclass(frozen=True)
class Issued:
    ca_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    not_after: dt.datetime


def service_names(service: str, namespace: str) -> list[str]:
    """Every name the API server may use for the Service."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def issue(dns_names: list[str], ip_addresses: list[str], *, days: int = 365,
          ca_days: int = 3650, ca_pem: bytes | None = None,
          ca_key_pem: bytes | None = None) -> Issued:
    """A serving certificate for the names, signed by the given CA or by a new one."""
    if days < 1 or ca_days < 1:
        raise ValueError("certificate validity must be at least 1 day")
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    for ip in ip_addresses:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ValueError(f"{ip!r} is not an IP address (give DNS names with --dns)") from None
    now = dt.datetime.now(dt.UTC)
    if ca_pem is None or ca_key_pem is None:
        ca_pem, ca_key_pem = new_ca(now - dt.timedelta(minutes=5),
                                    now + dt.timedelta(days=ca_days))
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    if now + dt.timedelta(days=days) > ca_cert.not_valid_after_utc:
        raise ValueError(
            f"the CA expires {ca_cert.not_valid_after_utc:%Y-%m-%d}, before a {days}-day "
            "serving certificate would: use fewer --days or a new CA")
    not_after = now + dt.timedelta(days=days)
    cert_pem, key_pem = sign_serving(ca_pem, ca_key_pem, dns_names, ip_addresses,
                                     now - dt.timedelta(minutes=5), not_after)
    return Issued(ca_pem, ca_key_pem, cert_pem, key_pem, not_after)


def _ca_key(ca_key_pem: bytes) -> ec.EllipticCurvePrivateKey:
    loaded = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an EC key")
    return loaded


def new_ca(not_before: dt.datetime, not_after: dt.datetime) -> tuple[bytes, bytes]:
    """A self-signed CA valid from ``not_before`` to ``not_after``: (certificate PEM, key PEM).

    Its common name carries its start time, so that two CAs side by side in a caBundle
    (during a rollover) are told apart in logs and by verifiers that look up issuers by
    name.
    """
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(
        NameOID.COMMON_NAME, f"gpu-webhook CA {not_before:%Y-%m-%dT%H:%M:%SZ}")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_cert.public_bytes(serialization.Encoding.PEM), _pem_key(ca_key)


def sign_serving(ca_pem: bytes, ca_key_pem: bytes, dns_names: list[str],
                 ip_addresses: list[str], not_before: dt.datetime,
                 not_after: dt.datetime) -> tuple[bytes, bytes]:
    """A serving certificate (EKU serverAuth) for the names, signed by the CA:
    (certificate PEM, key PEM)."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    ca_key = _ca_key(ca_key_pem)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    cn = dns_names[0] if dns_names else ip_addresses[0]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])])
    return _leaf(ca_cert, ca_key, subject, ExtendedKeyUsageOID.SERVER_AUTH, not_before,
                 not_after, sans)


def _leaf(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, subject: x509.Name,
          usage: x509.ObjectIdentifier, not_before: dt.datetime, not_after: dt.datetime,
          sans: list[x509.GeneralName] | None = None) -> tuple[bytes, bytes]:
    """An end-entity certificate with a new key, signed by the CA, for one extended key
    usage (serverAuth or clientAuth): (certificate PEM, key PEM)."""
    key = _key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = (
        builder
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=False, key_cert_sign=False, crl_sign=False,
            content_commitment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


@dataclass(frozen=True)
class CertInfo:
    """What the self-managed certificate code needs to know of one certificate."""

    pem: bytes
    """This certificate alone, re-encoded (a bundle is split into these)."""
    not_before: dt.datetime
    not_after: dt.datetime
    names: tuple[str, ...]
    """DNS and IP subject alternative names."""
    is_ca: bool
    fingerprint: str
    """SHA-256 of the DER encoding, hex: the certificate's identity."""
    subject: str


def inspect(pem: bytes) -> list[CertInfo]:
    """Every certificate in a PEM bundle, in order; ValueError when there is none."""
    try:
        chain = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise ValueError("no PEM certificate") from None
    out = []
    for cert in chain:
        try:
            basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
            is_ca = basic.ca
        except x509.ExtensionNotFound:
            is_ca = False
        out.append(CertInfo(cert.public_bytes(serialization.Encoding.PEM),
                            cert.not_valid_before_utc, cert.not_valid_after_utc,
                            tuple(_sans(cert)), is_ca,
                            cert.fingerprint(hashes.SHA256()).hex(),
                            cert.subject.rfc4514_string()))
    return out


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """True when the (first) certificate's signature verifies with the CA's key."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    """True when ``key_pem`` is the private key of the (first) certificate."""
    try:
        check_pair(cert_pem, key_pem)
    except ValueError:
        return False
    return True


def write(issued: Issued, directory: str | Path, *, force: bool = False) -> list[Path]:
    """Write the PEM files; refuse to overwrite existing ones unless ``force``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    files = {CA_FILE: issued.ca_pem, CA_KEY_FILE: issued.ca_key_pem,
             CERT_FILE: issued.cert_pem, KEY_FILE: issued.key_pem}
    existing = [d / n for n in files if (d / n).exists()]
    if existing and not force:
        raise FileExistsError(
            f"{', '.join(str(p) for p in existing)} already exist; pass --force to replace them")
    written = []
    for name, data in files.items():
        path = d / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                          0o600 if "key" in name else 0o644), "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic: a server reloading never reads half a file
        written.append(path)
    return written


@dataclass(frozen=True)
class ServingPair:
    """What the server tells about the certificate it serves (for logs and reload checks)."""

    serial: int
    subject: str
    names: list[str]
    not_before: dt.datetime
    not_after: dt.datetime

    def expired(self, now: dt.datetime | None = None) -> bool:
        return (now or dt.datetime.now(dt.UTC)) >= self.not_after


def check_pair(cert_pem: bytes, key_pem: bytes, *, cert_name: str = "certificate",
               key_name: str = "key") -> ServingPair:
    """Parse a serving certificate (chain) and its key; raise ValueError naming what is wrong.

    The server checks a pair before it lets OpenSSL near it: loading a certificate whose
    key does not match into a live SSLContext would leave that context without a usable
    key, and every new handshake would fail.
    """
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise ValueError(f"{cert_name} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{key_name} is not an unencrypted PEM private key ({exc})") from None
    leaf = chain[0]
    if leaf.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        raise ValueError(f"{key_name} is not the private key of the certificate in {cert_name}")
    return ServingPair(leaf.serial_number, leaf.subject.rfc4514_string(), _sans(leaf),
                       leaf.not_valid_before_utc, leaf.not_valid_after_utc)


def _sans(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*ext.get_values_for_type(x509.DNSName),
            *(str(ip) for ip in ext.get_values_for_type(x509.IPAddress))]


def common_names(cert_der: bytes) -> tuple[str, ...]:
    """The subject common names of a DER certificate (a TLS peer's, for the CN allow-list)."""
    cert = x509.load_der_x509_certificate(cert_der)
    return tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME))


def subject(cert_der: bytes) -> str:
    """The RFC 4514 subject of a DER certificate (the ASGI TLS extension's client_cert_name)."""
    return x509.load_der_x509_certificate(cert_der).subject.rfc4514_string()


def issue_client(common_name: str, ca_pem: bytes, ca_key_pem: bytes, *,
                 days: int = 365, organization: str | None = None) -> tuple[bytes, bytes]:
    """A client certificate (EKU clientAuth) for mTLS, e.g. the API server's identity.

    Returns (certificate PEM, key PEM).
    """
    now = dt.datetime.now(dt.UTC)
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    ca_key = _ca_key(ca_key_pem)
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return _leaf(ca_cert, ca_key, x509.Name(attrs), ExtendedKeyUsageOID.CLIENT_AUTH,
                 now - dt.timedelta(minutes=5), now + dt.timedelta(days=days))
