"""Self-managed certificates with ``--quota-commit leader``: the replicas relay reviews to
the leader and check its certificate against the CA bundle of the certificate Secret,
which every sync writes into ``--cert-dir`` as ``ca.crt`` beside the serving pair (no
``--leader-ca-file`` to give, no Secret to mount). The relay reads that file again when
it changes (tests/server/test_relay.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from test_selfcerts_plan import T0, WANTED

from webhook.server.certs.selfcerts import Material, SelfManagedCerts, plan
from webhook.server.settings import Settings


def settings(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    return Settings.from_args(parser.parse_args(list(argv)))


def test_a_leader_replica_with_self_managed_certificates_needs_no_ca_flag(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_IP", "10.0.0.7")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    s = settings("--self-managed-certs", "--quota-commit", "leader", "--kubeconfig",
                 str(kubeconfig), "--cert-dir", str(tmp_path / "certs"))
    assert s.leader_ca() == str(tmp_path / "certs" / "ca.crt")
    assert s.written_ca() == s.leader_ca()
    # A CA of the operator's own is what checks the leader, and is never written over.
    own = tmp_path / "own-ca.crt"
    own.write_text("")
    s = settings("--self-managed-certs", "--quota-commit", "leader", "--kubeconfig",
                 str(kubeconfig), "--cert-dir", str(tmp_path / "certs"),
                 "--leader-ca-file", str(own))
    assert s.leader_ca() == str(own) and s.written_ca() is None


def test_each_sync_writes_the_ca_bundle_beside_the_serving_pair(tmp_path: Path) -> None:
    d = tmp_path / "certs"
    renewer = SelfManagedCerts(None, None, "gpu-webhook-tls", {}, WANTED,  # type: ignore[arg-type]
                               str(d / "tls.crt"), str(d / "tls.key"), str(d / "ca.crt"))
    first = plan(None, WANTED, T0).material
    renewer._write_files(first)
    assert (d / "ca.crt").read_bytes() == first.ca_bundle
    assert (d / "tls.crt").read_bytes() == first.cert
    # A rollover publishes a second CA first, the serving pair unchanged: the bundle
    # is written again all the same.
    second = plan(None, WANTED, T0).material.ca_bundle
    published = Material(first.ca_bundle + second, first.ca_key, first.cert, first.key,
                         first.published_at)
    renewer._write_files(published)
    assert (d / "ca.crt").read_bytes() == first.ca_bundle + second
    assert (d / "tls.crt").read_bytes() == first.cert
