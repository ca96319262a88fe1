"""Optional mTLS (``--client-ca``, ``--client-cn``): only the API server's certificate
reaches the admission paths; the kubelet's probes, which carry no certificate, still
work."""

from __future__ import annotations

import ssl

import pytest
from tlskit import REVIEW, client_context, connect, new_ca, request


@pytest.fixture
def clients(tmp_path, ca):
    client_ca = new_ca(tmp_path / "client-ca")
    d = tmp_path / "clients"
    return client_ca, {
        "apiserver": client_ca.client(d, "kube-apiserver"),
        "stranger": client_ca.client(d, "someone-else"),
        "forged": new_ca(tmp_path / "forger").client(d / "forged", "kube-apiserver"),
    }


def test_only_the_allowed_common_name_is_answered(serve, ca, clients):
    client_ca, certs = clients
    server = serve("--client-ca", str(client_ca.path), "--client-cn", "kube-apiserver")

    ok = request(server, client_context(ca.path, cert=certs["apiserver"]), "POST", "/validate",
                 REVIEW)
    assert ok.status == 200 and ok.body["response"]["allowed"] is True

    wrong = request(server, client_context(ca.path, cert=certs["stranger"]), "POST",
                    "/validate", REVIEW)
    assert wrong.status == 403
    assert "someone-else" in str(wrong.body["error"])
    assert "kube-apiserver" in str(wrong.body["error"])

    anonymous = request(server, client_context(ca.path), "POST", "/mutate", REVIEW)
    assert anonymous.status == 403
    assert "client certificate" in str(anonymous.body["error"])
    assert request(server, client_context(ca.path), "GET", "/metrics").status == 403


def test_probes_need_no_client_certificate(serve, ca, clients):
    client_ca, _ = clients
    server = serve("--client-ca", str(client_ca.path), "--client-cn", "kube-apiserver")
    assert request(server, client_context(ca.path), "GET", "/healthz").status == 200
    assert request(server, client_context(ca.path), "GET", "/readyz").status == 200


def test_a_certificate_from_another_ca_is_refused_in_the_handshake(serve, ca, clients):
    client_ca, certs = clients
    server = serve("--client-ca", str(client_ca.path))
    # TLS 1.3 sends the client certificate after the client considers the handshake
    # done, so the server's refusal arrives on the first read.
    with pytest.raises((ssl.SSLError, ConnectionError)):
        request(server, client_context(ca.path, cert=certs["forged"]), "POST", "/validate",
                REVIEW)
    with pytest.raises(ssl.SSLError):
        connect(server, client_context(ca.path, cert=certs["forged"],
                                       max_version=ssl.TLSVersion.TLSv1_2)).close()


def test_without_a_cn_list_any_certificate_the_ca_signed_is_accepted(serve, ca, clients):
    client_ca, certs = clients
    server = serve("--client-ca", str(client_ca.path))
    for who in ("apiserver", "stranger"):
        answer = request(server, client_context(ca.path, cert=certs[who]), "POST",
                         "/validate", REVIEW)
        assert answer.status == 200, who


def test_without_client_ca_no_certificate_is_needed(serve, ca):
    server = serve()
    assert request(server, client_context(ca.path), "POST", "/validate", REVIEW).status == 200
