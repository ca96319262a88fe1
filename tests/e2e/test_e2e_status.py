"""``gpu-webhook status`` against a real API server: a tenant's GPUs used by its pods,
reserved in the webhook's ledger for pods being created, its limit and what is free,
and the top consumers; as the platform team (admin) and as a developer whose
ServiceAccount may only read pods in its own namespace (then the ledger it cannot read
is said, not guessed)."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import yaml
from e2ekit import (
    LEDGER_NAMESPACE,
    POLICY,
    apply,
    gpu_pod,
    gpu_webhook,
    service_account_kubeconfig,
)

from webhook.quota.entries import LABELS, LEDGER_PREFIX

pytestmark = pytest.mark.e2e


def ledger(tenant: str, namespace: str, gpus: float) -> str:
    """A ledger ConfigMap as the webhook writes it: one live reservation."""
    entry = {"pending-uid": {"ns": namespace, "owner": "pod/pending", "product": None,
                             "resources": {"nvidia.com/gpu": gpus}, "gpus": gpus,
                             "expires": time.time() + 3600}}
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": LEDGER_PREFIX + tenant, "namespace": LEDGER_NAMESPACE,
                     "labels": LABELS},
        "data": {"reservations": orjson.dumps(entry).decode()}})


def developer_kubeconfig(control_plane, ns: str, path: Path) -> Path:
    """A ServiceAccount in ``ns`` that may list pods there and nothing else."""
    cp = control_plane
    cp.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods",
               "-n", ns)
    return service_account_kubeconfig(cp, ns, path, "dev-pods", "--role=pod-reader")


def test_status_shows_used_reserved_free_and_top_consumers(control_plane, namespace,
                                                           tmp_path: Path) -> None:
    ns = namespace("status")
    # No webhook installed in this module: the pods are stored as written, and status
    # charges them as the webhook's cache would.
    for name, gpus in (("trainer-0", "4"), ("trainer-1", "2"), ("notebook", "1")):
        out = apply(control_plane, ns, gpu_pod(name, limits=gpus, requests=gpus))
        assert out.returncode == 0, out.stderr
    control_plane.kubectl("apply", "-f", "-", input=ledger("status", ns, 2))

    out = gpu_webhook("status", "--kubeconfig", str(control_plane.kubeconfig),
                      "--policy", str(POLICY), "--tenant", "status")
    rows = [line.split() for line in out.stdout.splitlines()]
    assert rows[0] == ["TENANT", "SCOPE", "CAP", "USED", "RESERVED", "LIMIT", "FREE"]
    assert ["status", "tenant", "gpus", "7", "2", "12", "3"] in rows
    assert ["status", "tenant", "pods", "3", "1", "10", "6"] in rows
    assert ("status: 3 GPU pods running; top consumers: pod/trainer-0 4, pod/trainer-1 2, "
            "pod/notebook 1") in out.stdout
    assert "note:" not in out.stdout

    # The developer: its own namespace's pods only; the ledger is not theirs to read.
    dev = developer_kubeconfig(control_plane, ns, tmp_path / "dev.kubeconfig")
    out = gpu_webhook("status", "--kubeconfig", str(dev), "--policy", str(POLICY),
                      "-n", ns, check=False)
    assert out.returncode == 2  # its tenant is chosen by namespace label, which it can't read
    assert "could not be read: pass --tenant" in out.stderr
    out = gpu_webhook("status", "--kubeconfig", str(dev), "--policy", str(POLICY),
                      "-n", ns, "--tenant", "status", "-o", "json")
    report = orjson.loads(out.stdout)
    caps = {c["cap"]: c for c in report["caps"]}
    assert caps["gpus"]["used"] == 7 and caps["gpus"]["limit"] == 12
    assert caps["gpus"]["reserved"] == 0  # not readable by the developer
    assert any("quota reservations not read" in n and "403" in n for n in report["notes"])
    assert any("namespace labels not read" in n for n in report["notes"])
    assert any("tenant-wide USED counts only namespace" in n for n in report["notes"])
    # Nor the nodes: a pod allowed two products is counted where admission charged it.
    assert any("nodes not read" in n for n in report["notes"])


def test_status_of_a_namespace_of_no_tenant_is_a_clear_error(control_plane) -> None:
    out = gpu_webhook("status", "--kubeconfig", str(control_plane.kubeconfig),
                      "--policy", str(POLICY), "-n", "default", check=False)
    assert out.returncode == 2
    assert 'namespace "default" belongs to no GPU tenant of policy e2e' in out.stderr
