"""Self-managed certificates against the real API server: two ``gpu-webhook serve
--self-managed-certs`` replicas, started together, agree on one certificate Secret that
one of them creates, serve the certificate it holds, patch its CA into the caBundle of
their (named) webhook configurations, and renew the certificate, without a restart,
while GPU pods keep being admitted.

The serving certificate is made to live 72 seconds (``--cert-validity-hours 0.02``), so
a renewal (due with a third of the lifetime left) comes about 53 seconds after it was
issued. The replicas sit behind a round-robin proxy, as behind a Service; the webhook
configurations call the proxy by URL, which is why the certificate also names 127.0.0.1
(``--cert-hosts``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import (
    LEDGER_NAMESPACE,
    MUTATED_ANNOTATION,
    POLICY,
    NamespaceFactory,
    Replica,
    RoundRobinProxy,
    apply,
    console_script,
    free_port,
    get,
    gpu_pod,
    gpu_webhook,
    short_id,
    wait_until,
)

from webhook.libs import certs

pytestmark = pytest.mark.e2e

SECRET = "gpu-webhook-selfcerts-e2e"
CONFIGURATION = "gpu-webhook-selfcerts-e2e"
KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
# mutate, claims.mutate; validate, scale, claims.validate, release (a gang workload's
# DELETE), policies (GPUPolicy objects)
VALIDITY_HOURS = "0.02"  # 72 seconds
CREATED = "certificate Secret created"


@dataclass
class SelfManaged:
    cp: ControlPlane
    replicas: list[Replica]
    proxy: RoundRobinProxy
    webhooks: int  # in the configurations applied, each to get the caBundle

    def logs(self) -> str:
        return "\n".join(f"--- replica {i} ---\n{r.log()[-4000:]}"
                         for i, r in enumerate(self.replicas))

    def secret(self) -> dict[str, bytes]:
        out = self.cp.kubectl("get", "secret", SECRET, "-n", LEDGER_NAMESPACE, "-o", "json")
        return {k: base64.b64decode(v) for k, v in json.loads(out.stdout)["data"].items()}

    def secret_exists(self) -> bool:
        return self.cp.kubectl("get", "secret", SECRET, "-n", LEDGER_NAMESPACE,
                               check=False).returncode == 0

    def ca_bundles(self) -> list[bytes]:
        out = []
        for kind in KINDS:
            obj = json.loads(self.cp.kubectl("get", kind, CONFIGURATION, "-o", "json").stdout)
            out += [base64.b64decode(h["clientConfig"].get("caBundle", ""))
                    for h in obj["webhooks"]]
        return out


def served_fingerprint(port: int) -> str:
    """SHA-256 of the certificate a replica presents in a TLS handshake now."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # we compare the certificate itself, below
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def fingerprint(cert_pem: bytes) -> str:
    return certs.inspect(cert_pem)[0].fingerprint


def start(workdir: Path, kubeconfig: Path, port: int, index: int) -> Replica:
    log_path = workdir / f"replica-{index}.log"
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            [console_script(), "serve", "--host", "127.0.0.1", "--port", str(port),
             "--cert-dir", str(workdir / f"replica-{index}"), "--policy", str(POLICY),
             "--kubeconfig", str(kubeconfig), "--namespace", LEDGER_NAMESPACE,
             "--self-managed-certs", "--cert-secret", SECRET,
             "--webhook-configurations",
             f"mutating={CONFIGURATION},validating={CONFIGURATION}",
             "--cert-hosts", "127.0.0.1,localhost",
             "--cert-validity-hours", VALIDITY_HOURS],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    return Replica(process, port, log_path)


@pytest.fixture(scope="module")
def selfmanaged(control_plane: ControlPlane,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[SelfManaged]:
    cp = control_plane
    workdir = tmp_path_factory.mktemp("selfcerts")
    cp.kubectl("delete", "secret", SECRET, "-n", LEDGER_NAMESPACE, "--ignore-not-found")
    ports = [free_port(), free_port()]
    proxy = RoundRobinProxy(ports).start()
    # The configurations as an operator installs them: no caBundle, the webhook adds it.
    text = gpu_webhook("manifests", "--policy", str(POLICY), "--name", CONFIGURATION,
                       "--url", f"https://127.0.0.1:{proxy.port}").stdout
    assert "caBundle" not in text
    cp.kubectl("apply", "-f", "-", input=text)
    # Both at once: they race to create the Secret.
    webhooks = sum(len(doc["webhooks"]) for doc in yaml.safe_load_all(text))
    d = SelfManaged(cp, [start(workdir, cp.kubeconfig, p, i) for i, p in enumerate(ports)],
                    proxy, webhooks)
    try:
        def serving() -> bool:
            for r in d.replicas:
                if r.process.poll() is not None:
                    raise AssertionError(f"a replica exited:\n{d.logs()}")
            try:
                for r in d.replicas:
                    served_fingerprint(r.port)
            except OSError:
                return False
            return True

        try:
            wait_until("both replicas to serve", serving, timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{d.logs()}") from None
        yield d
    finally:
        for r in d.replicas:
            r.terminate()
        for r in d.replicas:
            r.stop()
        proxy.stop()
        for kind in KINDS:
            cp.kubectl("delete", kind, CONFIGURATION, "--ignore-not-found", "--wait=false")
        cp.kubectl("delete", "secret", SECRET, "-n", LEDGER_NAMESPACE, "--ignore-not-found")


def admitted(cp: ControlPlane, namespace: str) -> dict[str, Any]:
    """Create a GPU pod through the API server; it must succeed, mutated by the webhook."""
    name = f"selfcerts-{short_id()}"
    out = apply(cp, namespace, gpu_pod(name))
    assert out.returncode == 0, out.stderr
    pod = get(cp, namespace, "pod", name)
    assert MUTATED_ANNOTATION in (pod["metadata"].get("annotations") or {})
    return pod


def wait_trusted(cp: ControlPlane, namespace: str) -> None:
    """The API server learns of the patched caBundle through a watch: probe with dry runs."""
    def called() -> bool:
        out = apply(cp, namespace, gpu_pod(f"probe-{short_id()}"), dry_run=True)
        if out.returncode != 0:
            return False
        obj = yaml.safe_load(out.stdout)
        return MUTATED_ANNOTATION in (obj["metadata"].get("annotations") or {})

    wait_until("the API server to trust the webhook", called, timeout=30, every=0.2)


def test_one_replica_creates_the_secret_and_both_serve_its_certificate(selfmanaged):
    d = selfmanaged
    created = sum(r.log().count(CREATED) for r in d.replicas)
    assert created == 1, d.logs()
    data = d.secret()
    assert sorted(data) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    (ca,) = certs.inspect(data["ca.crt"])
    assert ca.is_ca and certs.signed_by(data["tls.crt"], data["ca.crt"])
    leaf = certs.inspect(data["tls.crt"])[0]
    assert {"gpu-webhook.gpu-webhook.svc", "127.0.0.1"} <= set(leaf.names)

    def same() -> bool:  # the Secret may renew meanwhile: compare with what it holds now
        want = fingerprint(d.secret()["tls.crt"])
        return all(served_fingerprint(r.port) == want for r in d.replicas)

    wait_until("both replicas to serve the Secret's certificate", same, timeout=30)


def test_the_ca_bundle_is_patched_and_the_api_server_trusts_it(selfmanaged, namespace):
    d = selfmanaged
    ca = d.secret()["ca.crt"]
    # Every webhook of both configurations as rendered: mutate and validate, the scale
    # subresource's, the two for DRA claims, a gang's release, GPUPolicy objects', and
    # the routes webhooks of tenants' pods without GPUs.
    wait_until("the caBundle patched into every webhook",
               lambda: d.ca_bundles() == [ca] * d.webhooks, timeout=30)
    ns: str = namespace("research")
    wait_trusted(d.cp, ns)
    admitted(d.cp, ns)


def test_renewal_is_picked_up_without_restart_and_pods_keep_being_admitted(
        selfmanaged, namespace: NamespaceFactory):
    d = selfmanaged
    ns = namespace("research")
    wait_trusted(d.cp, ns)
    pids = [r.process.pid for r in d.replicas]
    first = d.secret()
    old = fingerprint(first["tls.crt"])

    def renewed_and_served() -> bool:
        admitted(d.cp, ns)  # every creation during the renewal must succeed
        now = d.secret()
        new = fingerprint(now["tls.crt"])
        return new != old and all(served_fingerprint(r.port) == new for r in d.replicas)

    try:
        wait_until("a renewed certificate served by both replicas", renewed_and_served,
                   timeout=150, every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{d.logs()}") from None
    after = d.secret()
    assert after["ca.crt"] == first["ca.crt"]  # the CA is kept: the caBundle stays valid
    assert d.ca_bundles() == [first["ca.crt"]] * d.webhooks
    assert [r.process.pid for r in d.replicas] == pids
    assert all(r.process.poll() is None for r in d.replicas)
    assert all("TLS certificate reloaded" in r.log() for r in d.replicas), d.logs()
    assert not any("reload failed" in r.log() for r in d.replicas), d.logs()
    assert sum(r.log().count(CREATED) for r in d.replicas) == 1
    admitted(d.cp, ns)
