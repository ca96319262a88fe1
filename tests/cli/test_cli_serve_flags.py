"""``gpu-webhook serve`` with a bad value for each flag: one line that names the flag.

An operator reads these in ``kubectl logs`` of a crash-looping pod: the line must say
which flag and what it may be, with no traceback and no 30-line usage text first. Cases
that fail while parsing the settings run in this process (fast); those found when the
server starts (files, the listen address) run the console script.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from webhook import cli
from webhook.server.settings import Settings

Run = Callable[..., subprocess.CompletedProcess[str]]  # the gpu_webhook fixture

# (flags, what the line must contain); every flag of `serve` with a value has a case.
PARSE_CASES: list[tuple[list[str], str]] = [
    (["--log-level", "loud"], "--log-level: invalid choice: 'loud'"),
    (["--port", "eighty"], "--port: invalid int value"),
    (["--port", "70000"], "--port must be 0-65535"),
    (["--host", " "], "--host is empty"),
    (["--cert-dir", ""], "--cert-dir is empty"),
    (["--tls-cert", "a.crt"], "--tls-cert and --tls-key go together"),
    (["--tls-key", "a.key"], "--tls-cert and --tls-key go together"),
    (["--tls-min-version", "1.1"], "--tls-min-version must be 1.2 or 1.3"),
    (["--client-ca", ""], "--client-ca is empty"),
    (["--client-cn", "kube-apiserver"], "--client-cn needs --client-ca"),
    (["--cert-poll-seconds", "0"], "--cert-poll-seconds must be more than 0"),
    (["--cert-poll-seconds", "nan"], "--cert-poll-seconds must be a finite number"),
    (["--policy", ""], "--policy is empty"),
    (["--policy-poll-seconds", "-1"], "--policy-poll-seconds must be more than 0"),
    (["--policy-poll-seconds", "inf"], "--policy-poll-seconds must be a finite number"),
    (["--policy-object", "Shared_Policy"], "--policy-object 'Shared_Policy' is not a GPUPolicy"),
    (["--policy-object", "shared"], "--policy-object reads the GPUPolicy from the cluster"),
    (["--policy-object", "shared", "--policy", "p.yaml"], "--policy and --policy-object are"),
    (["--policy-report-seconds", "0"], "--policy-report-seconds must be more than 0"),
    (["--kubeconfig", ""], "--kubeconfig is empty"),
    (["--namespace", "Team_A"], "--namespace 'Team_A' is not a namespace name"),
    (["--max-inflight", "0"], "--max-inflight must be at least 1"),
    (["--max-inflight", "many"], "--max-inflight: invalid int value"),
    (["--max-connections", "0"], "--max-connections must be at least 1"),
    (["--request-timeout", "60"], "--request-timeout must be more than 0 and at most 30"),
    (["--self-managed-certs"], "--self-managed-certs keeps the certificate in a Secret"),
    (["--cert-secret", "TLS!"], "--cert-secret 'TLS!' is not a valid object name"),
    (["--service", "Web Hook"], "--service 'Web Hook' is not a valid object name"),
    (["--cert-validity-hours", "soon"], "--cert-validity-hours: invalid float value"),
    (["--ca-validity-hours", "nan"], "--ca-validity-hours must be a finite number"),
    (["--cert-check-seconds", "inf"], "--cert-check-seconds must be a finite number"),
    (["--quota-status-seconds", "-1"], "--quota-status-seconds must be 0 (off) or more"),
    (["--audit-seconds", "often"], "--audit-seconds: invalid float value"),
    (["--release-seconds", "-1"], "--release-seconds must be 0 (off) or more"),
    (["--test-clock-offset-file", ""], "--test-clock-offset-file is empty"),
    (["--webhook-configurations-sync", "always"],
     "--webhook-configurations-sync must be fix, report or off, not 'always'"),
    (["--quota-commit", "queue"], "--quota-commit must be ledger or leader, not 'queue'"),
    (["--quota-commit", "leader"], "--quota-commit leader elects its leader in the cluster"),
    (["--leader-ca-file", ""], "--leader-ca-file is empty"),
    (["--leader-server-name", ""], "--leader-server-name is empty"),
    (["--workers", "2"], "unrecognized arguments: --workers 2"),
]
# Flags whose bad values only matter with --self-managed-certs, so need a kubeconfig.
SELF_MANAGED_CASES: list[tuple[list[str], str]] = [
    (["--webhook-configurations", "mutating"], "--webhook-configurations: 'mutating' is not"),
    (["--cert-hosts", ""], ""),  # empty is allowed: no extra names
    (["--cert-validity-hours", "0"], "--cert-validity-hours must be at least 0.01"),
    (["--cert-check-seconds", "0"], "--cert-check-seconds must be more than 0"),
    (["--ca-validity-hours", "1"], "--ca-validity-hours (1) must be at least 3 times"),
]

# Flags whose bad values only matter with --quota-commit leader, so need a kubeconfig.
LEADER_CASES: list[tuple[list[str], str]] = [
    (["--leader-url", "http://10.0.0.1:8443"],
     "--leader-url 'http://10.0.0.1:8443' must be an https:// URL"),
    (["--host", "0.0.0.0"], "the other replicas cannot reach this one at --host 0.0.0.0"),
    (["--cert-dir", "no-such-dir"], "checks the leader's certificate: give --leader-ca-file"),
]


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        status = cli.main(["serve", *argv])
    except SystemExit as exc:  # argparse's own errors exit from parse_args
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return status, lines[0]


@pytest.mark.parametrize(("argv", "says"), PARSE_CASES, ids=[" ".join(a) for a, _ in PARSE_CASES])
def test_a_bad_flag_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("GPU_WEBHOOK_")]:
        monkeypatch.delenv(var)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    status, line = _one_line(capsys, argv)
    assert status == 2
    assert line.startswith("gpu-webhook")
    assert says in line


@pytest.mark.parametrize(("argv", "says"), [c for c in SELF_MANAGED_CASES if c[1]],
                         ids=[" ".join(a) for a, s in SELF_MANAGED_CASES if s])
def test_a_bad_certificate_flag_is_one_line(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path, argv: list[str], says: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    status, line = _one_line(
        capsys, ["--self-managed-certs", "--kubeconfig", str(kubeconfig), *argv])
    assert status == 2
    assert says in line


@pytest.mark.parametrize(("argv", "says"), LEADER_CASES, ids=[" ".join(a) for a, _ in LEADER_CASES])
def test_a_bad_leader_flag_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       argv: list[str], says: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_IP", raising=False)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.pem").write_text("")
    monkeypatch.chdir(tmp_path)
    status, line = _one_line(capsys, ["--quota-commit", "leader", "--kubeconfig", str(kubeconfig),
                                      "--host", "127.0.0.1", *argv])
    assert status == 2
    assert says in line


def test_every_valued_flag_has_a_case() -> None:
    covered = {a[0] for a, _ in PARSE_CASES + SELF_MANAGED_CASES + LEADER_CASES}
    flags = {"--" + f.replace("_", "-") for f in Settings.__dataclass_fields__}
    assert flags - covered == set()


def test_an_environment_variable_is_checked_like_its_flag(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_WEBHOOK_LOG_LEVEL", "loud")
    status, line = _one_line(capsys, [])
    assert status == 2
    assert line == "gpu-webhook: --log-level must be one of debug, info, warning, error, " \
                   "not 'loud'"


# Found when the server starts: the console script, as an operator runs it.
def _busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize("case", ["missing-policy", "missing-tls", "missing-kubeconfig",
                                  "bad-host", "busy-port"])
def test_a_bad_file_or_address_is_one_line(gpu_webhook: Run, case: str) -> None:
    busy = _busy_port()
    with busy:
        argv, says = {
            "missing-policy": (["--policy", "nope.yaml"],
                               "nope.yaml: cannot read the file: No such file or directory"),
            "missing-tls": (["--tls-cert", "no.crt", "--tls-key", "no.key"],
                            "TLS files unusable"),
            "missing-kubeconfig": (["--kubeconfig", "no-kubeconfig"],
                                   "--kubeconfig no-kubeconfig: no such file"),
            "bad-host": (["--host", "no-such-host.invalid"],
                         "--host 'no-such-host.invalid' is not an address of this machine"),
            "busy-port": (["--host", "127.0.0.1", "--port", str(busy.getsockname()[1])],
                          "Address already in use"),
        }[case]
        done = gpu_webhook("serve", *argv)
    assert done.returncode == 2
    assert "Traceback" not in done.stdout + done.stderr
    assert says in done.stdout
    # The policy error spans a header line and one line per problem; the others are one.
    assert len(done.stdout.strip().splitlines()) == (2 if case == "missing-policy" else 1)


def test_a_policy_object_with_no_api_server_is_one_line(gpu_webhook: Run,
                                                        tmp_path: Path) -> None:
    closed = _busy_port()
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}",
                                 insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""")
    done = gpu_webhook("serve", "--policy-object", "shared", "--kubeconfig", str(kubeconfig))
    assert done.returncode == 2
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stdout.strip() == ("gpu-webhook: cannot start, cannot read GPUPolicy shared: "
                                   "read gpupolicy shared: cannot connect to the API server")
