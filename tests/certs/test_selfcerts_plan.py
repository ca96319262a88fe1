"""Self-managed certificates: when to renew, and what the Secret holds through a renewal
and a CA rollover (``selfcerts.plan``, pure: the clock is an argument).

The certificates are real and checked with cryptography's X.509 path validation, as
the API server would check them against the caBundle.
"""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from webhook.libs import certs
from webhook.server.certs.selfcerts import Material, Wanted, due, plan, renew_at

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
NAMES = ("gpu-webhook", "gpu-webhook.gpu-webhook", "gpu-webhook.gpu-webhook.svc")
WANTED = Wanted(NAMES, ("127.0.0.1",), validity=DAY, ca_validity=30 * DAY,
                grace=dt.timedelta(minutes=2))


@pytest.mark.parametrize(("lifetime", "left", "renew"), [
    (90 * DAY, 31 * DAY, False),
    (90 * DAY, 30 * DAY + dt.timedelta(seconds=1), False),
    (90 * DAY, 30 * DAY, True),       # a third left: due
    (90 * DAY, 29 * DAY, True),
    (90 * DAY, dt.timedelta(0), True),
    (90 * DAY, -DAY, True),           # expired
    (3650 * DAY, 1217 * DAY, False),  # a 10-year CA: due with ~3.3 years left
    (3650 * DAY, 1216 * DAY, True),
    (dt.timedelta(seconds=90), dt.timedelta(seconds=31), False),  # scales to seconds
    (dt.timedelta(seconds=90), dt.timedelta(seconds=30), True),
])
def test_renewal_is_due_with_a_third_of_the_lifetime_left(lifetime, left, renew):
    not_after = T0 + lifetime
    now = not_after - left
    assert due(T0, not_after, now) is renew
    assert renew_at(T0, not_after) == not_after - lifetime / 3


def cas(material: Material) -> list[certs.CertInfo]:
    return certs.inspect(material.ca_bundle)


def serving(material: Material) -> certs.CertInfo:
    return certs.inspect(material.cert)[0]


def verifies(material: Material, bundle: bytes, at: dt.datetime) -> bool:
    """Would a client holding ``bundle`` as caBundle accept the serving certificate at
    ``at`` for the Service's name?"""
    store = Store(x509.load_pem_x509_certificates(bundle))
    verifier = (PolicyBuilder().store(store).time(at)
                .build_server_verifier(x509.DNSName("gpu-webhook.gpu-webhook.svc")))
    try:
        verifier.verify(x509.load_pem_x509_certificate(material.cert), [])
    except VerificationError:
        return False
    return True


def test_first_plan_issues_a_ca_and_a_serving_certificate_it_signs():
    p = plan(None, WANTED, T0)
    m = p.material
    assert p.changed and p.reasons == ["no certificate Secret yet", "no serving certificate"]
    (ca,) = cas(m)
    assert ca.is_ca and certs.key_matches(ca.pem, m.ca_key)
    assert ca.not_after == T0 + 30 * DAY
    leaf = serving(m)
    assert set(leaf.names) == {*NAMES, "127.0.0.1"}
    assert leaf.not_after == T0 + DAY and certs.key_matches(m.cert, m.key)
    assert verifies(m, m.ca_bundle, T0)
    assert p.next_check == renew_at(leaf.not_before, leaf.not_after)


def test_a_fresh_secret_is_kept_as_it_is():
    m = plan(None, WANTED, T0).material
    later = plan(m, WANTED, T0 + DAY / 2, [m.ca_bundle])
    assert not later.changed and later.material == m


def test_renewal_keeps_the_ca_so_the_published_ca_bundle_stays_valid():
    m0 = plan(None, WANTED, T0).material
    at = renew_at(serving(m0).not_before, serving(m0).not_after)
    p = plan(m0, WANTED, at, [m0.ca_bundle])
    m1 = p.material
    assert p.changed and p.reasons[0].startswith("the serving certificate expires")
    assert (m1.ca_bundle, m1.ca_key) == (m0.ca_bundle, m0.ca_key)
    assert serving(m1).fingerprint != serving(m0).fingerprint
    assert serving(m1).not_after == at + DAY
    assert verifies(m1, m0.ca_bundle, at)  # the caBundle the API server holds already


@pytest.mark.parametrize(("breakage", "reason"), [
    (lambda m, other: Material(m.ca_bundle, m.ca_key, m.cert, other.key, m.published_at),
     "tls.key is not the key of tls.crt"),
    (lambda m, other: Material(m.ca_bundle, m.ca_key, b"", b"", m.published_at),
     "no serving certificate"),
    (lambda m, other: Material(m.ca_bundle, m.ca_key, other.cert, other.key, m.published_at),
     "the serving certificate is not signed by a CA in ca.crt"),
])
def test_an_unusable_serving_certificate_is_issued_again_at_once(breakage, reason):
    m = plan(None, WANTED, T0).material
    other = plan(None, WANTED, T0).material
    p = plan(breakage(m, other), WANTED, T0 + dt.timedelta(minutes=1), [m.ca_bundle])
    assert p.reasons == [reason]
    assert p.material.ca_bundle == m.ca_bundle
    assert verifies(p.material, m.ca_bundle, T0 + dt.timedelta(minutes=1))


def test_new_names_get_a_new_serving_certificate():
    m = plan(None, WANTED, T0).material
    wider = Wanted((*NAMES, "gpu-webhook.gpu-webhook.svc.cluster.local"), ("127.0.0.1",),
                   DAY, 30 * DAY)
    p = plan(m, wider, T0 + dt.timedelta(hours=1), [m.ca_bundle])
    assert p.reasons == ["the serving certificate lacks gpu-webhook.gpu-webhook.svc.cluster.local"]
    assert "gpu-webhook.gpu-webhook.svc.cluster.local" in serving(p.material).names


def test_ca_rollover_publishes_both_cas_before_switching_the_serving_certificate():
    # Keep the serving certificate renewed up to just before the CA is due (20 days).
    m = plan(None, WANTED, T0).material
    ca1 = cas(m)[0]
    t = T0 + dt.timedelta(days=19, hours=22)
    m = plan(m, WANTED, t, [m.ca_bundle]).material
    assert cas(m) == [ca1]
    old_serving = m.cert

    # 1. The CA is due: a new CA is published beside the old one; nothing else changes.
    t1 = renew_at(ca1.not_before, ca1.not_after)
    p1 = plan(m, WANTED, t1, [m.ca_bundle])
    m1 = p1.material
    assert p1.reasons[0].startswith("CA rollover")
    ca2, kept = cas(m1)
    assert kept == ca1 and ca2.is_ca and ca2.fingerprint != ca1.fingerprint
    assert certs.key_matches(ca2.pem, m1.ca_key)  # the new CA signs from now on
    assert m1.cert == old_serving and m1.published_at == t1
    assert verifies(m1, m1.ca_bundle, t1)  # old serving certificate, new bundle: trusted
    assert p1.next_check == t1 + WANTED.grace

    # 2a. Not yet: the grace has not passed, or a configuration lacks the new CA.
    soon = plan(m1, WANTED, t1 + dt.timedelta(minutes=1), [m1.ca_bundle, m1.ca_bundle])
    assert not soon.changed
    stale = plan(m1, WANTED, t1 + dt.timedelta(minutes=3), [m1.ca_bundle, m.ca_bundle])
    assert not stale.changed and stale.next_check > t1 + dt.timedelta(minutes=3)

    # 2b. Every webhook trusts the new CA: the serving certificate moves to it; the old
    # CA stays in the bundle for replicas still serving its certificate.
    t2 = t1 + dt.timedelta(minutes=3)
    p2 = plan(m1, WANTED, t2, [m1.ca_bundle, m1.ca_bundle])
    m2 = p2.material
    assert p2.reasons == ["the serving certificate moves to the new CA, now trusted"]
    assert cas(m2) == [ca2, ca1] and m2.ca_key == m1.ca_key
    assert certs.signed_by(m2.cert, ca2.pem)
    assert verifies(m2, m1.ca_bundle, t2)
    assert not verifies(m2, m.ca_bundle, t2)  # why the bundle had to go out first

    # 3. Once the old CA has expired it leaves the bundle.
    t3 = ca1.not_after + dt.timedelta(seconds=1)
    m2b = plan(m2, WANTED, t3 - DAY / 2, [m2.ca_bundle]).material  # renewed meanwhile
    p3 = plan(m2b, WANTED, t3, [m2b.ca_bundle])
    assert "expired CA dropped from the bundle" in p3.reasons
    assert cas(p3.material) == [ca2]
    assert verifies(p3.material, p3.material.ca_bundle, t3)


def test_a_serving_certificate_never_outlives_its_ca():
    wanted = Wanted(NAMES, (), validity=10 * DAY, ca_validity=30 * DAY)
    m = plan(None, wanted, T0).material
    p = plan(m, wanted, T0 + dt.timedelta(days=19, hours=23), [m.ca_bundle])
    assert serving(p.material).not_after <= cas(p.material)[0].not_after


def test_an_expired_ca_is_replaced_and_everything_issued_again():
    m = plan(None, WANTED, T0).material
    t = T0 + 31 * DAY
    p = plan(m, WANTED, t, [m.ca_bundle])
    assert p.reasons[0].startswith("the CA expired")
    assert [c.fingerprint for c in cas(p.material)] != [c.fingerprint for c in cas(m)]
    assert len(cas(p.material)) == 1  # the expired CA is not kept
    assert verifies(p.material, p.material.ca_bundle, t)
