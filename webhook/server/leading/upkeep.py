"""What one replica keeps for the whole cluster, while it leads: the leader Lease
(:mod:`webhook.server.leading.leader`), the GPUQuota status objects
(:mod:`webhook.server.leading.quotastatus`), the periodic audit's PolicyReports
(:mod:`webhook.server.leading.background_audit`) and the release of pods waiting for
quota (:mod:`webhook.server.leading.release`). Started by ``serve`` when a cluster is
configured; every replica contends for the Lease, one writes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from webhook.libs import kube, logs
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import GPUPolicy
from webhook.quota import status
from webhook.quota.budget import no_spending
from webhook.quota.decider import DecidingStore
from webhook.server import metrics
from webhook.server.cluster import Cluster, pod_namespace
from webhook.server.leading.accounting import Accountant
from webhook.server.leading.background_audit import BackgroundAudit, reports
from webhook.server.leading.configurations import ConfigurationKeeper
from webhook.server.leading.leader import Leadership
from webhook.server.leading.quotastatus import QuotaStatusWriter
from webhook.server.leading.release import Releaser
from webhook.server.sources.reload import PolicySource

# The label the leader sets on its own pod (--quota-commit leader): a Service selecting it
# (deploy/components/leader-decides) sends every review to the replica that decides quota,
# without the relay's hop.
LEADER_LABEL = "gpu-webhook.dev/quota-leader"


def own_pod() -> tuple[str, str] | None:
    """(namespace, name) of this replica's pod (POD_NAME, and POD_NAMESPACE or the
    service account's namespace); None outside a pod."""
    name, namespace = os.environ.get("POD_NAME"), pod_namespace()
    return (namespace, name) if name and namespace else None


@dataclass
class LeaderMark:
    """Keeps the leader label on this replica's pod while it leads and off it otherwise
    (written at start too: a container restarted in a pod that led keeps its labels).
    A loop of its own rather than a leadership callback: a write stalled by an API outage
    must not hold up the Lease's renewal, and one that failed is tried again."""

    pods: kube.Pods
    namespace: str
    name: str
    leading: Callable[[], bool]
    every: float = 1.0
    written: bool | None = None  # what the pod carries, as last written

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.once)
            await asyncio.sleep(self.every)

    def once(self) -> None:
        now = self.leading()
        if now == self.written:
            return
        try:
            self.pods.label(self.namespace, self.name, LEADER_LABEL, "true" if now else None)
            self.written = now
        except kube.KubeError as exc:
            logs.event("leader label not written on this replica's pod; tried again",
                       logging.WARNING, pod=f"{self.namespace}/{self.name}", leading=now,
                       error=str(exc))


@dataclass
class Upkeep:
    leadership: Leadership
    tasks: list[asyncio.Future[None]] = field(default_factory=list)
    keeper: ConfigurationKeeper | None = None  # the webhook configurations, when compared

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        # Another replica leads at once instead of after the Lease's duration.
        await asyncio.to_thread(self.leadership.release)


def start(cluster: Cluster, source: PolicySource, namespace: str,
          status_seconds: float, audit_seconds: float,
          clock: Callable[[], float] = time.time, *, release_seconds: float = 1.0,
          address: str = "", configurations: dict[str, str] | None = None,
          sync: str = "off") -> Upkeep | None:
    """The Lease and the writers that are turned on (None when none is, and the quota
    is not decided by the leader). ``address``: where this replica answers, written in
    the Lease while it leads (for the others to relay to, --quota-commit leader).
    ``configurations`` (kind -> name) are compared with the policy unless ``sync`` is
    off, and written as it needs them when it is fix."""
    deciding = isinstance(cluster.store, DecidingStore)
    comparing = sync != "off" and bool(configurations)
    if (status_seconds <= 0 and audit_seconds <= 0 and release_seconds <= 0
            and not deciding and not comparing):
        return None

    def policy() -> CompiledPolicy:  # the one served now: a reload is used at once
        assert source.active is not None
        return source.active.policy

    leadership = Leadership(kube.Leases(cluster.api, namespace), address=address)
    leadership.on_change.append(lambda leading: metrics.LEADER.set(1 if leading else 0))
    if isinstance(cluster.store, DecidingStore):
        store = cluster.store
        store.follow(leadership.leading)
        leadership.on_change.append(store.led)
        metrics.DECIDING.set_function(lambda: 0.0 if store.deciding() else 1.0)
    up = Upkeep(leadership, [asyncio.ensure_future(leadership.keep())])
    pod = own_pod() if deciding else None
    if pod is not None:
        mark = LeaderMark(kube.Pods(cluster.api), *pod, leading=leadership.leading)
        up.tasks.append(asyncio.ensure_future(mark.run()))
    if status_seconds > 0:
        writer = QuotaStatusWriter(
            policy, cluster.state, cluster.store,
            kube.CustomObjects(cluster.api, status.GROUP, status.VERSION, status.PLURAL),
            leadership.leading, status_seconds, clock=clock,
            spending=cluster.gputime.spending if cluster.gputime else no_spending)
        up.tasks.append(asyncio.ensure_future(writer.run()))
    if audit_seconds > 0:
        auditor = BackgroundAudit(cluster.api, policy, cluster.state, reports(cluster.api),
                                  leadership.leading, audit_seconds,
                                  node_gpus=cluster.sights.node_gpus)
        up.tasks.append(asyncio.ensure_future(auditor.run()))
    if release_seconds > 0:
        releaser = Releaser(policy, cluster.state, cluster.store,
                            kube.Pods(cluster.api, instance=leadership.me),
                            leadership.leading, release_seconds, wall=clock,
                            spending=cluster.gputime.spending if cluster.gputime
                            else no_spending)
        up.tasks.append(asyncio.ensure_future(releaser.run()))
    if cluster.gputime is not None:
        accountant = Accountant(cluster.gputime, leadership.leading)
        up.tasks.append(asyncio.ensure_future(accountant.run()))
    if comparing:
        assert configurations is not None

        def served() -> tuple[int, GPUPolicy | None]:
            active = source.active
            return (active.generation, active.policy.model) if active else (0, None)

        up.keeper = ConfigurationKeeper(
            kube.WebhookConfigurations(cluster.api, instance=leadership.me),
            dict(configurations), served, leadership.leading,
            interval=status_seconds if status_seconds > 0 else 10.0, fix=sync == "fix",
            policies=kube.AdmissionPolicies(cluster.api))
        up.tasks.append(asyncio.ensure_future(up.keeper.run()))
    logs.event("contending for the leader lease", identity=leadership.me,
               lease=f"{namespace}/{leadership.name}", quota_status_seconds=status_seconds,
               audit_seconds=audit_seconds)
    return up
