"""The periodic audit: every ``interval`` seconds the leader replica decides the running
GPU pods and workloads with the policy it serves, as ``gpu-webhook audit`` does (the same
:func:`webhook.admission.audit.audit`), and writes the findings as PolicyReports
(``wgpolicyk8s.io/v1alpha2``, one per namespace, named ``gpu-webhook``).

So after a policy change lowers a cap, the pods now over it are listed in their
namespace's report; pods whose rules are in warn or audit mode are reported there too,
as the results of the pods they concern, for as long as they run. A report is applied
only when its results changed, and the report of a namespace with nothing left to
report is deleted. The reads (pods, Deployments, StatefulSets, Jobs: one list each) and
the deciding run off the event loop; admission never waits for them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from webhook.admission.audit import (
    REPORT_GROUP,
    REPORT_LABELS,
    REPORT_NAME,
    REPORT_PLURAL,
    REPORT_VERSION,
    audit,
    policy_reports,
    same_results,
)
from webhook.engine.routes.sights import NodeLookup, no_nodes
from webhook.libs import kube, logs
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.cache import ClusterState
from webhook.server import metrics
from webhook.server.leading import leader

_SELECTOR = ",".join(f"{k}={v}" for k, v in REPORT_LABELS.items())


def _skipped(namespace: str, exc: kube.KubeError) -> None:
    logs.event("audit report not written; tried again next round", logging.WARNING,
               namespace=namespace, error=str(exc), detail=exc.detail)


def reports(api: Any) -> kube.CustomObjects:
    return kube.CustomObjects(api, REPORT_GROUP, REPORT_VERSION, REPORT_PLURAL)


class BackgroundAudit:
    def __init__(self, api: Any, policy: Callable[[], CompiledPolicy], state: ClusterState,
                 objects: kube.CustomObjects, leading: Callable[[], bool], interval: float,
                 wall: Callable[[], float] = time.time,
                 node_gpus: NodeLookup = no_nodes) -> None:
        self.api, self.policy, self.state = api, policy, state
        self.node_gpus = node_gpus  # the node watch's (routes pods hold on GPU nodes)
        self.objects, self.leading = objects, leading
        self.interval, self.wall = interval, wall
        self.rounds = 0

    def _decide(self, policy: CompiledPolicy, labels: dict[str, dict[str, str]]
                ) -> dict[str, dict[str, Any]]:
        pods = kube.list_typed(self.api, "pods")
        workloads = [w for r in kube.AUDITED_WORKLOADS for w in kube.list_typed(self.api, r)]
        found = audit(policy, pods, workloads, labels.get, self.node_gpus)
        return policy_reports(found, policy.name, self.wall())

    def round(self, labels: dict[str, dict[str, str]]) -> None:
        """One audit and its reports (blocking: run it in a thread), with the namespace
        labels the watch has (copied on the event loop)."""
        policy = self.policy()
        # The reports first: without their CRD there is nothing to decide for.
        have = {str(o["metadata"]["namespace"]): o for o in self.objects.list(_SELECTOR)
                if o["metadata"]["name"] == REPORT_NAME}
        want = self._decide(policy, labels)
        for ns, report in want.items():
            old = have.get(ns)
            if old is not None and same_results(old.get("results") or [], report["results"]):
                continue
            if not self.leading():
                return  # lost the Lease mid-round: the new leader writes from here
            # One report that cannot be written (its namespace terminating) must not
            # keep the others from being written: logged, and tried again next round.
            try:
                self.objects.apply(report)
            except kube.KubeError as exc:
                _skipped(ns, exc)
        for ns in have.keys() - want.keys():
            try:
                self.objects.delete(ns, REPORT_NAME)
            except kube.KubeError as exc:
                _skipped(ns, exc)
        self.rounds += 1
        refused = sum(r["result"] == "fail" for rep in want.values() for r in rep["results"])
        warned = sum(len(rep["results"]) for rep in want.values()) - refused
        metrics.AUDIT_RESULTS.labels("fail").set(refused)
        metrics.AUDIT_RESULTS.labels("warn").set(warned)
        logs.event("audit done", policy=policy.name, namespaces=len(want), fail=refused,
                   warn=warned)

    async def run(self) -> None:
        """An audit every ``interval`` seconds while this replica leads (the first as
        soon as it leads), until cancelled."""
        await leader.every(
            self.interval, self.leading, self.state.synced,
            lambda: asyncio.to_thread(self.round, dict(self.state.labels)),
            missing="audit reports not written: the PolicyReport CRD "
                    "(wgpolicyk8s.io/v1alpha2) is not installed",
            failed="audit not done")
