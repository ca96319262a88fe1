"""Wiring the webhook to a cluster: watches, the quota ledger, reading the workload of a
scale request, and readiness.

Used by ``serve`` when a cluster is configured (``--kubeconfig``, or running in a pod).
Without one the server keeps its in-memory usage store and says so in its log.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.admission.claimreads import ClaimReader, ClaimUnreadable
from webhook.admission.groups import GroupReader, GroupUnreadable
from webhook.admission.webhooks import WorkloadReader, WorkloadUnreadable
from webhook.engine.routes.sights import Sights, carries_gpus, no_sights
from webhook.k8s import podgroups
from webhook.k8s.claims import CLAIM, TEMPLATE
from webhook.k8s.identity import track
from webhook.k8s.slices import SLICE
from webhook.libs import kube, logs
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.cache import ClusterState
from webhook.quota.decider import DecidingStore
from webhook.quota.gputime import HoldBook
from webhook.quota.ledger import LedgerStore
from webhook.server import metrics
from webhook.server.gputime import GpuTime, records
from webhook.server.sources.reload import PolicySource


def configured(kubeconfig: str | None) -> bool:
    return bool(kubeconfig) or bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def pod_namespace() -> str | None:
    """This replica's pod's namespace: POD_NAMESPACE, else its service account's; None
    outside a pod."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def ledger_namespace(explicit: str | None) -> str:
    """Where the ledger lives: --namespace, else the pod's own namespace."""
    return explicit or pod_namespace() or "gpu-webhook"


class SightCache:
    """The nodes (whether each carries GPUs) and PriorityClasses (value, preemption
    policy) the watches have seen, for the GPU routes' checks (``webhook.engine.routes``).
    A node carries GPUs when its capacity holds a GPU resource, or it has the policy's
    product label or one of its GPU taints (a node whose device plugin has not yet
    reported counts as one). Until the first list, nothing is known: a ``nodeName``
    is refused, never let through."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy  # () -> CompiledPolicy
        self.nodes: dict[str, bool] = {}
        self.classes: dict[str, tuple[int, str]] = {}

    def sights(self) -> Sights:
        return Sights(self.nodes.get, self.classes.get)

    def node_event(self, typ: str, node: dict[str, Any]) -> None:
        if typ == "RESET":
            self.nodes.clear()
            return
        track(self.nodes, typ, node, lambda n: carries_gpus(self.policy(), n))

    def class_event(self, typ: str, pc: dict[str, Any]) -> None:
        if typ == "RESET":
            self.classes.clear()
            return
        track(self.classes, typ, pc, _priority_class)


def _priority_class(pc: dict[str, Any]) -> tuple[int, str] | None:
    """A PriorityClass's value and preemption policy; None for a value not an integer."""
    value = pc.get("value")
    if isinstance(value, int) and not isinstance(value, bool):
        return value, str(pc.get("preemptionPolicy") or "PreemptLowerPriority")
    return None


@dataclass(frozen=True)
class Cluster:
    """The cluster as the server uses it: the watch-fed state, the ledger store, the
    reader of scale requests' workloads, and the watches to stop at shutdown."""

    state: ClusterState
    store: LedgerStore | DecidingStore
    read_workload: WorkloadReader
    watchers: list[kube.Watcher | kube.LoopWatcher]
    api: Any = None  # the API client, for what the leader replica writes (server.upkeep)
    read_claim: ClaimReader | None = None  # a claim or template the watches lack yet
    sights: Sights = no_sights  # nodes and PriorityClasses (SightCache)
    read_group: GroupReader | None = None  # a PodGroup, at its gang's first pod
    # The username the webhook's API calls are made as (a SelfSubjectReview at start):
    # the only one the validating webhook lets remove the quota gate; None: unknown.
    identity: str | None = None
    # GPU time: the kept days and the budgets' snapshot (every replica; the leader
    # writes the days).
    gputime: GpuTime | None = None

    def stop(self) -> None:
        for w in self.watchers:
            w.stop()


def attach(source: PolicySource, kubeconfig: str | None, namespace: str | None,
           loop: asyncio.AbstractEventLoop, quota_commit: str = "ledger") -> Cluster:
    """Start the pod and namespace watches and the ledger store, before the server is
    built from them. Raises kube.Unreachable when credentials cannot even be loaded."""
    api = kube.connect(kubeconfig)

    def policy() -> CompiledPolicy:
        assert source.active is not None
        return source.active.policy

    active = source.active
    assert active is not None
    state = ClusterState(policy)
    state.hours = HoldBook()  # GPU time: kept whatever the policy, so one that turns
    # budgets on finds every pod's hold (a new policy relists the pods too)
    ns = ledger_namespace(namespace)
    # A create of a name the cache sees held asks the API server who holds it now (rare;
    # short timeout: an unanswered read records the create as before, see LedgerStore).
    holder = kube.Pods(api, timeout=2.0).holder
    # --quota-commit leader: decided in the leader's memory (webhook.quota.decider).
    store: LedgerStore | DecidingStore = (
        DecidingStore(state, ttl=active.policy.reservation_ttl, holder=holder)
        if quota_commit == "leader" else
        LedgerStore(state, kube.ConfigMaps(api, ns), ttl=active.policy.reservation_ttl,
                    holder=holder, phase=ledger_phase))
    # Every pod of the cluster, read and applied on the loop (no thread hop per event).
    pods: kube.Watcher | kube.LoopWatcher = (
        kube.loop_watcher(api, "pods", state.pod_event, state.watch_window)
        or kube.Watcher(api, "pods", state.deliverer(loop, state.pod_event)))
    namespaces = kube.Watcher(api, "namespaces", state.deliverer(loop, state.namespace_event))
    # DRA: the claims and templates pods name, found without an API call on admission.
    state.watch_claims(slices=True, groups=True)
    claims = kube.Watcher(api, "resourceclaims",
                          state.deliverer(loop, state.claim_event(CLAIM)))
    # What each DRA device holds: a claim of part of one is charged its share.
    resource_slices = kube.Watcher(api, "resourceslices",
                                   state.deliverer(loop, state.claim_event(SLICE)))
    templates = kube.Watcher(api, "resourceclaimtemplates",
                             state.deliverer(loop, state.claim_event(TEMPLATE)))
    # The core gang API's PodGroups and CompositePodGroups (absent unless GenericWorkload
    # and CompositePodGroup are on): the claims a group's pods share and the gangs they
    # start in, found without an API call on admission.
    groups = kube.Watcher(api, "podgroups",
                          state.deliverer(loop, state.claim_event(podgroups.KIND)))
    composites = kube.Watcher(api, "compositepodgroups",
                              state.deliverer(loop, state.claim_event(podgroups.COMPOSITE)))
    seen = SightCache(policy)
    def node_event(typ: str, node: dict[str, Any]) -> None:
        seen.node_event(typ, node)
        state.node_event(typ, node)  # a bound pod is charged to its node's product

    nodes = kube.Watcher(api, "nodes", _on(loop, node_event, state))
    classes = kube.Watcher(api, "priorityclasses", _on(loop, seen.class_event, state))
    state.on_relabel = pods.resync
    # Pods listed before the templates they name were charged without them: once the
    # templates are in, count the pods again.
    state.on_templates_synced = pods.resync
    # A new policy may charge pods and claims differently.
    source.on_change.extend([pods.resync, claims.resync])
    watchers = [namespaces, templates, groups, composites, claims, pods, nodes, classes,
                resource_slices]
    for w in watchers:
        w.start()
    logs.event("using the cluster for quota", kubeconfig=kubeconfig or "in-cluster",
               ledger_namespace=ns, reservation_ttl=active.policy.reservation_ttl)
    read_claim = claim_reader(kube.ResourceClaims(api))
    return Cluster(state, store, workload_reader(kube.Workloads(api)), watchers, api,
                   read_claim, seen.sights(), group_reader(read_claim), _identity(api),
                   GpuTime(records(api), state, policy))


def _identity(api: Any) -> str | None:
    try:
        me = kube.whoami(api)
    except kube.KubeError as exc:
        logs.event("the webhook's own identity is unknown: no one may remove the quota gate "
                   "of a waiting pod, and waiting pods stay waiting", logging.ERROR,
                   error=str(exc), detail=exc.detail)
        return None
    logs.event("the webhook's own identity", username=me)
    return me or None


def _on(loop: asyncio.AbstractEventLoop, handler: Any, state: ClusterState) -> Any:
    """A watch callback applying ``handler`` on the loop, ignoring the watch's own
    liveness events (SYNCED, PROGRESS, ABSENT), with the state's watch window."""

    def apply(typ: str, obj: dict[str, Any]) -> None:
        if typ in ("ADDED", "MODIFIED", "DELETED", "RESET"):
            handler(typ, obj)

    return state.deliverer(loop, apply)


def workload_reader(workloads: kube.Workloads) -> WorkloadReader:
    """Read a workload (for a scale request) off the event loop, within ``timeout``."""

    async def read(resource: str, namespace: str, name: str, timeout: float
                   ) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(workloads.read, resource, namespace, name, timeout),
                timeout)
        except TimeoutError:
            raise WorkloadUnreadable(
                f"read {resource.removesuffix('s')} {namespace}/{name}: no answer from the "
                f"API server within {timeout:.1f}s") from None
        except kube.KubeError as exc:
            raise WorkloadUnreadable(str(exc)) from None

    return read


def claim_reader(claims: kube.ResourceClaims) -> ClaimReader:
    """Read a DRA claim or template (one a pod names before the watch has delivered it)
    off the event loop, within ``timeout``; None when the API server has none."""

    async def read(kind: str, namespace: str, name: str, timeout: float
                   ) -> dict[str, Any] | None:
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(claims.read, kind, namespace, name, timeout), timeout)
        except TimeoutError:
            raise ClaimUnreadable(
                f"the API server did not answer within {timeout:g}s") from None
        except kube.KubeError as exc:
            raise ClaimUnreadable(exc.reason) from None

    return read


def group_reader(read: ClaimReader) -> GroupReader:
    """Read a PodGroup or CompositePodGroup (at its gang's first pod, when the watches
    have not delivered it) as a claim is read; None when the API server has none."""

    async def read_group(kind: str, namespace: str, name: str, timeout: float
                         ) -> Mapping[str, Any] | None:
        try:
            return await read(kind, namespace, name, timeout)
        except ClaimUnreadable as exc:
            raise GroupUnreadable(str(exc)) from None

    return read_group


def ledger_phase(phase: str, seconds: float) -> None:
    """A phase of a ledger commit, into the admission phase histogram."""
    metrics.child(metrics.PHASE, "ledger", phase).observe(seconds)
