"""``gpu-webhook status`` for tenants of a cohort (policies/examples/cohorts.yaml): the
borrowed GPUs of each tenant apart from its own, as running pods (labelled borrowed) and
as reservations in the cohort's ledger, what it may borrow now, and a line per cohort
that says who borrows, who lends, and what the lenders have taken back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from webhook.engine.borrowed import BORROWED_LABEL, account
from webhook.engine.cost import Charge
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_file
from webhook.quota.entries import Entry, encode_borrowed
from webhook.tools.status import Cluster, report, table

POLICY = Path(__file__).parents[2] / "policies" / "examples" / "cohorts.yaml"


def pod(name: str, namespace: str, gpus: int, borrowed: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if borrowed:
        meta["labels"] = {BORROWED_LABEL: "true"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": "Running"}}


def test_borrowed_gpus_apart_from_own_with_what_may_be_borrowed_now() -> None:
    now = time.time()
    pending = Entry(Charge(account("vision"), "vision", "pod/pending", None,
                           {"nvidia.com/gpu": 1.0}, 1.0), now + 30, "vision/pending")
    cluster = Cluster(pods=[pod("own", "vision", 8), pod("extra", "vision", 3, True),
                            pod("asr", "speech", 2)],
                      borrowed={"research": encode_borrowed({"uid-pending": pending})})
    r = report(compile_policy(load_file(POLICY)), cluster, now=now)
    got = {(x.tenant, x.scope, x.cap): (x.used, x.reserved, x.limit, x.free) for x in r.rows}
    assert got[("vision", "tenant", "gpus")] == (8, 0, 8, 0)  # its own: borrowed apart
    # Borrowing limit 8: 3 running + 1 reserved, so 4 more may be borrowed now.
    assert got[("vision", "cohort research", "borrowed gpus")] == (3, 1, 8, 4)
    out = table(r)
    assert ("cohort research: borrowed (preemptible) by vision 4; idle to lend: vision 0, "
            "speech 6, nlp 4") in out


def test_a_lender_taking_its_gpus_back_is_said() -> None:
    cluster = Cluster(pods=[pod("own", "vision", 8), pod("extra", "vision", 6, True),
                            pod("asr", "speech", 8), pod("bert", "nlp", 4)])
    out = table(report(compile_policy(load_file(POLICY)), cluster))
    assert "6 borrowed GPUs are taken back by their lenders and will be preempted" in out
