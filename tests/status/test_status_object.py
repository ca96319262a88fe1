"""The GPUQuota object's status, from the same report as ``gpu-webhook status``: the
headline numbers ``kubectl get gpuquotas`` prints are the binding GPU cap's, every cap
is listed with the table's numbers, and MIG slices keep their fractions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from test_status_report import ledger, pod, policy

from webhook.engine.waiting import GATE
from webhook.policy.budgets import Span
from webhook.quota.budget import Used
from webhook.quota.status import Row, gpuquota, gpuquota_status, headline
from webhook.tools.status import Cluster, report, table

CRD = Path(__file__).parents[2] / "deploy" / "base" / "crd-gpuquota.yaml"


def test_the_object_says_what_the_table_says() -> None:
    now = time.time()
    cluster = Cluster(pods=[pod("a", "research", 4), pod("b", "research-dev", 2)],
                      ledgers={"research": ledger(("pending", "research", 3, now + 30))})
    r = report(policy(), cluster, tenant="research", now=now)
    st = gpuquota_status(r, "research", "shared-gpu-cluster")
    # The table's rows, cap by cap.
    rows = [line.split() for line in table(r).splitlines()[1:len(r.rows) + 1]]
    assert [[c["cap"], str(c["used"]), str(c["reserved"]), str(c["limit"]), str(c["free"])]
            for c in st["caps"]] == [row[-5:] for row in rows]
    # The binding GPU cap: research-dev's own 4 GPUs (2 free) binds before the tenant's
    # 32 (23 free).
    assert (st["scope"], st["used"], st["reserved"], st["limit"], st["free"]) == (
        "namespace research-dev", 2, 0, 4, 2)
    assert st["pods"] == 2
    assert st["topConsumers"] == [{"owner": "pod/a", "gpus": 4}, {"owner": "pod/b", "gpus": 2}]
    obj = gpuquota("research-dev", "research", st)
    assert obj["apiVersion"] == "gpu-webhook.dev/v1alpha1" and obj["kind"] == "GPUQuota"
    assert obj["metadata"] == {"name": "research", "namespace": "research-dev",
                               "labels": {"app.kubernetes.io/managed-by": "gpu-webhook"}}


def test_headline_is_the_gpu_cap_with_least_free_and_the_tenants_on_a_tie() -> None:
    tenant = Row("t", "tenant", "gpus", 2, 0, 8)
    ns = Row("t", "namespace n", "gpus", 0, 0, 6)
    pods = Row("t", "tenant", "pods", 9, 0, 10)
    assert headline([tenant, ns, pods]) is tenant  # 6 free each: the tenant's
    assert headline([tenant, Row("t", "namespace n", "gpus", 3, 0, 6), pods]).scope == \
        "namespace n"
    assert headline([pods]) is None  # no GPU cap: no headline numbers


def test_slices_keep_their_fraction_and_whole_numbers_print_whole() -> None:
    r = report(policy(), Cluster(), tenant="research")
    r.rows[:] = [Row("research", "tenant", "gpus", 1.125, 0.25, 4)]
    st = gpuquota_status(r, "research", "p")
    assert (st["used"], st["reserved"], st["limit"], st["free"]) == (1.125, 0.25, 4, 2.625)
    assert isinstance(st["limit"], int)


def test_every_status_field_is_in_the_crd_schema() -> None:
    # The API server prunes fields its schema does not name: a field written but not
    # declared would silently never be seen.
    crd = yaml.safe_load(CRD.read_text())
    [version] = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    st = gpuquota_status(report(policy(), Cluster(pods=[pod("a", "research", 4),
                                                        waiting("w", "research", 2)]),
                                tenant="research"), "research", "p")
    # "window" is written for a tenant with a quotaSchedule only (tests/quota/
    # test_quota_windows.py writes one), "budget" for one with a budget (below).
    assert set(st) | {"updated", "window", "budget"} == set(schema)
    r = report(policy(), Cluster(pods=[pod("a", "research", 4)]), tenant="research")
    r.budgets["research"] = Used(1.5, 10.0, Span(0.0, 1.0, "December 2026 (UTC)"))
    budget = gpuquota_status(r, "research", "p")["budget"]
    assert budget == {"gpuHours": 10, "usedGpuHours": 1.5, "period": "December 2026 (UTC)",
                      "percent": 15}
    assert set(budget) == set(schema["budget"]["properties"])
    assert set(st["caps"][0]) == set(schema["caps"]["items"]["properties"])
    assert set(st["topConsumers"][0]) == set(schema["topConsumers"]["items"]["properties"])
    assert set(st["byProduct"][0]) == set(schema["byProduct"]["items"]["properties"])
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert all(columns[k.title()] == f".status.{k}"
               for k in ("tenant", "used", "reserved", "limit", "free", "pods"))


def waiting(name: str, namespace: str, gpus: int) -> dict[str, Any]:
    """A pod waiting behind the quota gate (tenants[].overQuota: wait)."""
    p = pod(name, namespace, gpus, phase="Pending")
    p["spec"]["schedulingGates"] = [{"name": GATE}]
    return p


def test_waiting_pods_are_listed_apart_and_hold_no_quota() -> None:
    cluster = Cluster(pods=[pod("a", "research", 4), waiting("w0", "research", 2),
                            waiting("w1", "research", 8)])
    r = report(policy(), cluster, tenant="research")
    st = gpuquota_status(r, "research", "p")
    [gpus] = [c for c in st["caps"] if (c["scope"], c["cap"]) == ("tenant", "gpus")]
    assert (gpus["used"], st["pods"], st["waitingPods"], st["waitingGpus"]) == (4, 1, 2, 10)
    assert "research: 2 pods wait for GPU quota (10 GPUs asked), released in order" in table(r)


def test_one_report_per_tenant_seen_from_each_namespace_is_the_namespaces_report() -> None:
    from webhook.quota.status import seen_from

    cluster = Cluster(pods=[pod("a", "research", 4), pod("b", "research-dev", 2)])
    whole = report(policy(), cluster, tenant="research")
    for ns in ("research", "research-dev"):
        assert seen_from(whole, ns).rows == report(policy(), cluster, tenant="research",
                                                   namespace=ns).rows


def test_an_account_that_reads_little_gets_the_objects_numbers() -> None:
    # A developer: its namespace's pods only, no ledger, no labels; the GPUQuota the
    # webhook keeps there (readable under `view`) has the tenant-wide numbers.
    now = time.time()
    full = report(policy(), Cluster(pods=[pod("a", "research", 4), pod("b", "research-dev", 2)],
                                    ledgers={"research": ledger(("x", "research", 3, now + 30))}),
                  tenant="research", namespace="research", now=now)
    obj = gpuquota("research", "research", {**gpuquota_status(full, "research", "p"),
                                           "updated": "2026-12-01T12:00:00Z"})
    dev = Cluster(pods=[pod("a", "research", 4)], quotas=[obj],
                  unread=["namespace labels not read (...)"])
    r = report(policy(), dev, namespace="research")  # no --tenant needed
    assert r.rows == full.rows and r.pods == full.pods and r.top == full.top
    assert r.unread == ["numbers from the webhook's GPUQuota research/research (updated "
                        "2026-12-01T12:00:00Z): it counts the pods, namespaces and "
                        "reservations this account may not read"]
