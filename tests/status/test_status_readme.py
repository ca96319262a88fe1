"""The README's GPUQuota and PolicyReport listings and docs/quota.md's agree, and are
what kubectl prints for those objects: the CRDs' columns. (What the README's cluster
block prints on `make demo`'s cluster is checked by running it,
tests/e2e/test_e2e_sim_demo.py; docs/quota.md's GPUQuota row is the
object of the report its numbers come from.)"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from test_status_report import ledger, policy

from webhook.quota.status import gpuquota_status
from webhook.tools.status import Cluster, report

README = (Path(__file__).parents[2] / "README.md").read_text()
PRODUCT = {"a100": "NVIDIA-A100-SXM4-80GB", "h100": "NVIDIA-H100-80GB-HBM3"}


def pod(name: str, gpus: int, product: str, job: str | None = None) -> dict[str, Any]:
    term = {"matchExpressions": [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": [PRODUCT[product]]}]}
    meta: dict[str, Any] = {"name": name, "namespace": "research", "uid": f"uid-{name}"}
    if job:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                    "uid": "uid-job", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                              {"nodeSelectorTerms": [term]}}}},
            "status": {"phase": "Running"}}


def tour_output(command: str) -> list[str]:
    """The ``#   `` lines after ``command`` in the README's tour."""
    after = README.split(f"\n{command}\n", 1)[1]
    lines = []
    for line in after.splitlines():
        if not line.startswith("#"):
            break
        lines.append(re.sub(r"^#(   )?", "", line))
    return lines


def the_tours_report() -> Any:
    now = time.time()
    pods = ([pod(f"pretrain-{i}", 3, "a100", job="pretrain") for i in range(4)]
            + [pod("notebook-x", 4, "a100")]
            + [pod("serve-0", 2, "h100"), pod("serve-1", 2, "h100"),
               pod("dbg-0", 1, "h100"), pod("dbg-1", 1, "h100")])
    cluster = Cluster(pods=pods, ledgers={"research": ledger(
        ("being-created", "research", 2, now + 30))})
    return report(policy(), cluster, namespace="research", now=now)


def test_docs_quota_gpuquota_row_is_the_object_of_the_same_report() -> None:
    head, row = doc_output("kubectl get gpuquotas -n research")
    assert head.split() == ["NAME", "TENANT", "USED", "RESERVED", "LIMIT", "FREE", "PODS",
                            "AGE"]
    st = gpuquota_status(the_tours_report(), "research", "shared-gpu-cluster")
    assert row.split()[:7] == ["research", st["tenant"], *(
        str(st[k]) for k in ("used", "reserved", "limit", "free", "pods"))]


QUOTA_MD = (Path(__file__).parents[2] / "docs" / "quota.md").read_text()
ROOT = Path(__file__).parents[2]


def doc_output(command: str) -> list[str]:
    """The lines after ``$ command`` in a ```text block of docs/quota.md."""
    after = QUOTA_MD.split(f"\n$ {command}\n", 1)[1]
    return after.split("\n```", 1)[0].splitlines()


def test_docs_quota_and_the_readme_show_the_same_gpuquota_columns() -> None:
    assert doc_output("kubectl get gpuquotas -n research")[0] == tour_output(
        "kubectl get gpuquotas -n research")[0]


def test_the_policyreport_listings_are_the_crds_columns() -> None:
    import yaml

    [crd] = [d for d in yaml.safe_load_all(
        (ROOT / "tests" / "e2e" / "crds" / "wgpolicyk8s.io_policyreports.yaml").read_text())
        if d]
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    columns = ["NAME", *(c["name"].upper() for c in version["additionalPrinterColumns"])]
    for shown, row_says in (
            # notebooks' tenant in warn mode: one warned pod
            (tour_output("kubectl get policyreports -n notebooks"), ["0", "0", "1", "0", "0"]),
            # research's lowered cap: one refused pod (the e2e test shows kubectl printing it)
            (doc_output("kubectl get policyreports -n research"), ["0", "1", "0", "0", "0"])):
        head, row = shown
        assert head.split() == columns
        assert row.split()[:6] == ["gpu-webhook", *row_says]
