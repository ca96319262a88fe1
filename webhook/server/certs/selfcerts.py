"""Self-managed serving certificates, for clusters without cert-manager.

With ``serve --self-managed-certs`` every replica keeps one Secret (``--cert-secret``,
type kubernetes.io/tls) in step, and serves what it holds:

- ``ca.crt``: the caBundle, the CAs the API server must trust. The first is the
  *signing* CA; any other is an older CA kept until it expires (after a rollover).
- ``ca.key``: the signing CA's key. It lives only in the Secret and in memory, never in
  a file of the pod.
- ``tls.crt`` / ``tls.key``: the serving pair, for the Service's DNS names (plus
  ``--cert-hosts``).

One sync (at startup, before serving, then at the next renewal point and at least every
``--cert-check-seconds``; 30 seconds after a failure) reads the Secret, decides with
:func:`plan` (pure: no I/O, the clock passed in) whether anything must be issued, writes
the Secret with a resourceVersion precondition when it must, writes the serving pair into
the files the server reads (``CertReloader`` in serve.py swaps them into the live
SSLContext, the same path a mounted Secret's update takes) and patches ``caBundle`` into
the named webhook configurations wherever it differs.

Several replicas: the Secret is the only shared state, and every write is a
compare-and-swap (create fails with AlreadyExists, update with a stale resourceVersion).
The replica that loses reads again and adopts what the winner wrote, so a certificate is
issued once however many replicas start or renew together.

When to renew (:func:`due`): when a third or less of a certificate's lifetime is left,
as cert-manager does by default. With the default validities that is 30 days before a
90-day serving certificate expires, and about 3.3 years before a 10-year CA does: ample
time for a failing renewal to be noticed (every attempt is logged), and short enough
lifetimes that a leaked key does not stay useful for long. The rule scales down, so a
test can run with minutes-long certificates.

CA rollover: a new CA cannot replace the old one in one step, because a serving
certificate signed by the new CA is refused by every API server that still holds the old
caBundle (and a replica that has not re-read the Secret still serves the old
certificate). So, when the signing CA is due:

1. a new CA is issued and *published* first: ``ca.crt`` becomes [new, old], the new key
   goes to ``ca.key``, the serving certificate is left alone (still signed by the old CA,
   which stays trusted), and the bundle is patched into the webhook configurations;
2. a later sync, once every webhook of the named configurations holds a bundle with the
   new CA and ``grace`` (2 minutes) has passed since it was published (recorded in the
   Secret's ``gpu-webhook.dev/ca-published-at`` annotation), issues a serving certificate
   from the new CA;
3. the old CA stays in the bundle until it expires (replicas may serve its certificate
   until their next sync), then it is dropped.

A serving certificate that is unusable (missing, expired, not for the wanted names, not
signed by a CA in the bundle, or its key lost) is issued again at once from the signing
CA: there is nothing to keep it working for.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import logging
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from webhook.libs import certs, kube, logs

RENEW_FRACTION = 1 / 3
"""Renew when this share of a certificate's lifetime (notAfter - notBefore) or less is left."""
ROLLOVER_GRACE = dt.timedelta(minutes=2)
"""After a new CA is published: how long before certificates it signs are served."""
MAX_BACKDATE = dt.timedelta(minutes=5)
"""notBefore is set this far back (or a tenth of the validity, if less) for clock skew."""
PUBLISHED_ANNOTATION = "gpu-webhook.dev/ca-published-at"
LABELS = {"app.kubernetes.io/name": "gpu-webhook", "app.kubernetes.io/component": "certificates"}
RETRY_SECONDS = 30.0


# --- the decision (pure) ----------------------------------------------------------------


def renew_at(not_before: dt.datetime, not_after: dt.datetime) -> dt.datetime:
    """When a certificate valid from ``not_before`` to ``not_after`` is due."""
    return not_after - (not_after - not_before) * RENEW_FRACTION


def due(not_before: dt.datetime, not_after: dt.datetime, now: dt.datetime) -> bool:
    """True when a third or less of the certificate's lifetime is left (or none)."""
    return now >= renew_at(not_before, not_after)


def backdate(validity: dt.timedelta) -> dt.timedelta:
    return min(MAX_BACKDATE, validity / 10)


@dataclass(frozen=True)
class Wanted:
    """What the serving certificate must be."""

    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...] = ()
    validity: dt.timedelta = dt.timedelta(days=90)
    ca_validity: dt.timedelta = dt.timedelta(days=3650)
    grace: dt.timedelta = ROLLOVER_GRACE


@dataclass(frozen=True)
class Material:
    """What the Secret holds."""

    ca_bundle: bytes = b""
    ca_key: bytes = b""
    cert: bytes = b""
    key: bytes = b""
    published_at: dt.datetime | None = None
    """When the signing CA (the first of ``ca_bundle``) was first published."""

    @classmethod
    def from_secret(cls, data: dict[str, bytes], annotations: dict[str, str]) -> Material:
        published = None
        if annotations.get(PUBLISHED_ANNOTATION):
            try:
                published = dt.datetime.fromisoformat(annotations[PUBLISHED_ANNOTATION])
            except ValueError:
                published = None  # unreadable: treated as long published
        return cls(data.get("ca.crt", b""), data.get("ca.key", b""), data.get("tls.crt", b""),
                   data.get("tls.key", b""), published)

    def data(self) -> dict[str, bytes]:
        return {"ca.crt": self.ca_bundle, "ca.key": self.ca_key, "tls.crt": self.cert,
                "tls.key": self.key}

    def annotations(self) -> dict[str, str]:
        return ({PUBLISHED_ANNOTATION: self.published_at.isoformat()}
                if self.published_at else {})


@dataclass(frozen=True)
class Plan:
    material: Material
    """What the Secret should hold after this sync."""
    reasons: list[str]
    """Why it changed (empty: the Secret is kept as it is)."""
    next_check: dt.datetime
    """When a decision may next differ (a renewal point, the end of a grace period, an
    old CA's expiry)."""

    @property
    def changed(self) -> bool:
        return bool(self.reasons)


def _parse(pem: bytes) -> list[certs.CertInfo]:
    try:
        return certs.inspect(pem) if pem else []
    except ValueError:
        return []


def plan(current: Material | None, wanted: Wanted, now: dt.datetime,
         published_bundles: Sequence[bytes] = ()) -> Plan:
    """Decide what the Secret must hold at ``now``.

    ``published_bundles``: the caBundle of every webhook in the named configurations, as
    read from the API server; a serving certificate moves to a new CA only once each of
    them trusts it.
    """
    cur = current or Material()
    reasons: list[str] = []
    bundle = _parse(cur.ca_bundle)
    ca_key, published_at = cur.ca_key, cur.published_at
    signer = bundle[0] if bundle else None
    reason = _ca_reason(current, signer, now)
    if reason or signer is None:
        start = now - backdate(wanted.ca_validity)
        ca_pem, ca_key = certs.new_ca(start, now + wanted.ca_validity)
        signer = certs.inspect(ca_pem)[0]
        bundle = [signer, *(c for c in bundle if c.is_ca)]
        published_at = now
        reasons.append(reason)
    # Older CAs stay trusted until they expire: a replica may serve their certificate.
    kept = [signer, *(c for c in bundle[1:] if now < c.not_after)]
    if len(kept) < len(bundle):
        reasons.append("expired CA dropped from the bundle")
    bundle = kept
    propagated = published_at is None or (
        now >= published_at + wanted.grace and bool(published_bundles) and all(
            signer.fingerprint in {c.fingerprint for c in _parse(b)}
            for b in published_bundles))
    serving = _parse(cur.cert)
    leaf = serving[0] if serving else None
    issuer = next((c for c in bundle if leaf and certs.signed_by(leaf.pem, c.pem)), None)
    reissue, waiting = _reissue_reason(cur, wanted, leaf, issuer, signer, propagated, now)
    cert, key = cur.cert, cur.key
    if reissue:
        start = now - backdate(wanted.validity)
        end = min(now + wanted.validity, signer.not_after)
        cert, key = certs.sign_serving(signer.pem, ca_key, list(wanted.dns_names),
                                       list(wanted.ip_addresses), start, end)
        leaf = certs.inspect(cert)[0]
        reasons.append(reissue)
    material = Material(b"".join(c.pem for c in bundle), ca_key, cert, key, published_at)
    return Plan(material, reasons, _next_check(bundle, leaf, waiting, published_at, wanted, now))


def _ca_reason(current: Material | None, signer: certs.CertInfo | None, now: dt.datetime
               ) -> str:
    """Why a new CA must be made now ("" when the signing CA serves on)."""
    if current is None:
        return "no certificate Secret yet"
    if signer is None:
        return "ca.crt holds no certificate"
    if not signer.is_ca or not certs.key_matches(signer.pem, current.ca_key):
        return "ca.key is not the key of the first CA in ca.crt"
    if now >= signer.not_after:
        return f"the CA expired {signer.not_after:%Y-%m-%d %H:%M:%S}Z"
    if due(signer.not_before, signer.not_after, now):
        return (f"CA rollover: the CA expires {signer.not_after:%Y-%m-%d %H:%M:%S}Z; a new "
                "CA is published beside it before it signs a serving certificate")
    return ""


def _unusable(cur: Material, wanted: Wanted, leaf: certs.CertInfo | None,
              issuer: certs.CertInfo | None, now: dt.datetime) -> str:
    """Why the serving pair cannot be served at all ("" when it can)."""
    names = {*wanted.dns_names, *wanted.ip_addresses}
    if leaf is None:
        return "no serving certificate"
    if not certs.key_matches(cur.cert, cur.key):
        return "tls.key is not the key of tls.crt"
    if now >= leaf.not_after:
        return f"the serving certificate expired {leaf.not_after:%Y-%m-%d %H:%M:%S}Z"
    if issuer is None:
        return "the serving certificate is not signed by a CA in ca.crt"
    if not names <= set(leaf.names):
        return "the serving certificate lacks " + ", ".join(sorted(names - set(leaf.names)))
    return ""


def _reissue_reason(cur: Material, wanted: Wanted, leaf: certs.CertInfo | None,
                    issuer: certs.CertInfo | None, signer: certs.CertInfo, propagated: bool,
                    now: dt.datetime) -> tuple[str, bool]:
    """Why the serving certificate is issued again ("" when it is kept), and whether it
    is kept only while a new CA propagates to the webhook configurations."""
    reissue = _unusable(cur, wanted, leaf, issuer, now)
    if reissue or leaf is None or issuer is None:
        return reissue, False
    if issuer.fingerprint != signer.fingerprint:
        if propagated:
            return "the serving certificate moves to the new CA, now trusted", False
        return "", True  # still valid under the old CA; it has time left
    if due(leaf.not_before, leaf.not_after, now):
        return f"the serving certificate expires {leaf.not_after:%Y-%m-%d %H:%M:%S}Z", False
    return "", False


def _next_check(bundle: Sequence[certs.CertInfo], leaf: certs.CertInfo | None, waiting: bool,
                published_at: dt.datetime | None, wanted: Wanted, now: dt.datetime
                ) -> dt.datetime:
    """When the decision may next differ: a renewal point, an old CA's expiry, or the end
    of the grace a new CA is given."""
    signer = bundle[0]
    checks = [renew_at(signer.not_before, signer.not_after)]
    checks += [c.not_after for c in bundle[1:]]
    if waiting and leaf is not None and published_at is not None:
        # Its renewal point may have passed: look again when the grace ends, or (the
        # configurations not trusting the new CA yet) a little later, not at once.
        checks += [leaf.not_after, max(published_at + wanted.grace, now + wanted.grace / 4)]
    elif leaf is not None:
        checks.append(renew_at(leaf.not_before, leaf.not_after))
    return min(checks)


# --- the sync (I/O) ---------------------------------------------------------------------


def split_hosts(hosts: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Extra subject names: (DNS names, IP addresses)."""
    dns, ips = [], []
    for h in (h.strip() for h in hosts):
        if not h:
            continue
        try:
            ips.append(str(ipaddress.ip_address(h)))
        except ValueError:
            dns.append(h)
    return tuple(dns), tuple(ips)


def _write_file(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # atomic: the reloader never reads half a file


class SelfManagedCerts:
    """Keeps the certificate Secret, the serving files and the caBundles in step."""

    def __init__(self, secrets: kube.Secrets, configurations: kube.WebhookConfigurations,
                 secret: str, targets: dict[str, str], wanted: Wanted,
                 cert_file: str, key_file: str, ca_file: str | None = None) -> None:
        self.secrets, self.configurations = secrets, configurations
        self.secret, self.targets, self.wanted = secret, targets, wanted
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        # The bundle (public), for what checks a replica's certificate: the relay of
        # --quota-commit leader (webhook.server.web.forward).
        self.ca_file = Path(ca_file) if ca_file else None
        self.next_check = dt.datetime.now(dt.UTC)

    def _bundles(self) -> list[bytes]:
        out: list[bytes] = []
        for kind, name in self.targets.items():
            try:
                out += self.configurations.ca_bundles(kind, name).values()
            except kube.NotFound:
                logs.event("webhook configuration not found; its caBundle is set once it "
                           "exists", logging.WARNING, kind=kind, name=name)
        return out

    def sync(self) -> dt.datetime:
        """One pass; returns when the next is due. Raises kube.KubeError on API failure."""
        where = f"{self.secrets.namespace}/{self.secret}"
        for _ in range(5):
            now = dt.datetime.now(dt.UTC)
            stored = self.secrets.read(self.secret)
            current = (Material.from_secret(stored.data, stored.annotations)
                       if stored.resource_version is not None else None)
            decided = plan(current, self.wanted, now, self._bundles())
            if not decided.changed:
                break
            try:
                self.secrets.write(self.secret, decided.material.data(),
                                   decided.material.annotations(), stored.resource_version,
                                   LABELS)
            except kube.Conflict:
                # Another replica wrote first: adopt what it wrote (read again).
                logs.event("certificate Secret changed by another replica; reading it again",
                           secret=where)
                continue
            leaf = certs.inspect(decided.material.cert)[0]
            logs.event("certificate Secret created" if current is None
                       else "certificate Secret updated", secret=where,
                       reasons=decided.reasons, serving_not_after=leaf.not_after.isoformat(),
                       cas=[c.subject for c in certs.inspect(decided.material.ca_bundle)])
            break
        else:
            raise kube.Conflict(f"certificate Secret {where} kept changing under 5 attempts")
        material = decided.material
        self._write_files(material)
        for kind, name in self.targets.items():
            try:
                patched = self.configurations.patch_ca_bundle(kind, name, material.ca_bundle)
            except kube.NotFound:
                continue  # logged by _bundles; patched on a later sync
            if patched:
                logs.event("caBundle patched", configuration=f"{kind}webhookconfiguration/{name}",
                           webhooks=patched)
        self.next_check = decided.next_check
        return decided.next_check

    def _write_files(self, material: Material) -> None:
        def current(path: Path) -> bytes | None:
            try:
                return path.read_bytes()
            except OSError:
                return None

        if self.ca_file is not None and current(self.ca_file) != material.ca_bundle:
            self.ca_file.parent.mkdir(parents=True, exist_ok=True)
            _write_file(self.ca_file, material.ca_bundle, 0o644)
        if current(self.cert_file) == material.cert and current(self.key_file) == material.key:
            return
        self.cert_file.parent.mkdir(parents=True, exist_ok=True)
        self.key_file.parent.mkdir(parents=True, exist_ok=True)
        # The key first: between the two renames the reloader may see a mismatched pair,
        # which it logs and skips; the second rename is a new change it then loads.
        _write_file(self.key_file, material.key, 0o600)
        _write_file(self.cert_file, material.cert, 0o644)
        leaf = certs.inspect(material.cert)[0]
        logs.event("serving certificate written", cert=str(self.cert_file),
                   fingerprint=leaf.fingerprint[:16], not_after=leaf.not_after.isoformat())

    def first_sync(self, max_wait: float = 30.0) -> None:
        """Sync until it succeeds (the server cannot serve without a certificate),
        backing off up to ``max_wait`` seconds between attempts."""
        delay = 1.0
        while True:
            try:
                self.sync()
                return
            except (kube.KubeError, ValueError) as exc:
                logs.event("cannot get a serving certificate yet; retrying", logging.ERROR,
                           error=str(exc), retry_in=delay)
            time.sleep(delay)
            delay = min(delay * 2, max_wait)

    async def keep_renewed(self, interval: float) -> None:
        """Sync at each renewal point, at least every ``interval`` seconds, and
        ``RETRY_SECONDS`` (at most ``interval``) after a failure."""
        while True:
            wait = (self.next_check - dt.datetime.now(dt.UTC)).total_seconds()
            # A little jitter so replicas do not all reach the API at the same instant
            # (the compare-and-swap makes it safe either way); at least a second, so a
            # clock that reads a hair early does not spin.
            wait = max(1.0, min(interval, wait + random.uniform(0, min(5.0, wait / 50 + 0.5))))
            await asyncio.sleep(wait)
            try:
                await asyncio.to_thread(self.sync)
            except Exception as exc:  # a renewer must never die: retry later
                logs.event("certificate sync failed; retrying", logging.ERROR,
                           error=f"{type(exc).__name__}: {exc}",
                           retry_in=min(RETRY_SECONDS, interval))
                self.next_check = dt.datetime.now(dt.UTC) + dt.timedelta(
                    seconds=min(RETRY_SECONDS, interval))


def connect(kubeconfig: str | None, namespace: str, secret: str, service: str,
            targets: dict[str, str], hosts: Sequence[str], validity_hours: float,
            ca_validity_hours: float, cert_file: str, key_file: str,
            ca_file: str | None = None) -> SelfManagedCerts:
    """The manager for ``serve``'s flags. Raises kube.Unreachable when credentials
    cannot be loaded."""
    api = kube.connect(kubeconfig)
    dns, ips = split_hosts(hosts)
    wanted = Wanted((*certs.service_names(service, namespace), *dns), ips,
                    dt.timedelta(hours=validity_hours), dt.timedelta(hours=ca_validity_hours))
    return SelfManagedCerts(kube.Secrets(api, namespace), kube.WebhookConfigurations(api),
                            secret, targets, wanted, cert_file, key_file, ca_file)
