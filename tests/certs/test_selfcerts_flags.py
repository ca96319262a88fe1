"""``serve --self-managed-certs`` flags: what they parse to, and errors that name the flag."""

from __future__ import annotations

import argparse

import pytest

from webhook.server.certs.selfcerts import split_hosts
from webhook.server.settings import Settings


def settings(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    return Settings.from_args(parser.parse_args(list(argv)))


def test_defaults_and_parsed_values():
    s = settings("--self-managed-certs", "--kubeconfig", "/k", "--cert-hosts",
                 "127.0.0.1, localhost,::1", "--webhook-configurations",
                 "validating=v-name,mutating=m-name")
    assert s.self_managed_certs is True and s.cert_secret == "gpu-webhook-tls"
    assert s.certificate_targets() == {"mutating": "m-name", "validating": "v-name"}
    assert split_hosts(s.cert_host_list()) == (("localhost",), ("127.0.0.1", "::1"))
    assert settings().self_managed_certs is False


def test_the_switch_from_the_environment(monkeypatch):
    monkeypatch.setenv("GPU_WEBHOOK_SELF_MANAGED_CERTS", "true")
    monkeypatch.setenv("GPU_WEBHOOK_KUBECONFIG", "/k")
    assert settings().self_managed_certs is True
    monkeypatch.setenv("GPU_WEBHOOK_SELF_MANAGED_CERTS", "maybe")
    with pytest.raises(SystemExit, match="GPU_WEBHOOK_SELF_MANAGED_CERTS='maybe' is not a "):
        settings()


@pytest.mark.parametrize(("argv", "message"), [
    (["--webhook-configurations", "mutating"], "--webhook-configurations: 'mutating' is not"),
    (["--webhook-configurations", "ingress=x"], "KIND mutating or validating"),
    (["--webhook-configurations", "mutating=a,mutating=b"], "each once"),
    (["--webhook-configurations", ","], "--webhook-configurations is empty"),
    (["--cert-validity-hours", "0.001"], "--cert-validity-hours must be at least 0.01"),
    (["--cert-validity-hours", "1000", "--ca-validity-hours", "2000"],
     "must be at least 3 times --cert-validity-hours"),
])
def test_bad_values_name_the_flag(argv, message):
    with pytest.raises(SystemExit, match=message):
        settings("--self-managed-certs", "--kubeconfig", "/k", *argv)


def test_a_cluster_is_needed(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("GPU_WEBHOOK_KUBECONFIG", raising=False)
    with pytest.raises(SystemExit, match="give --kubeconfig"):
        settings("--self-managed-certs")
