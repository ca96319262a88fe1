"""Wiring the webhook to a cluster: watches, the quota ledger, reading the workload of a
scale request, and readiness.

Used by ``serve`` when a cluster is configured (``--kubeconfig``, or running in a pod).
Without one the server keeps its in-memory usage store and says so in its log.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from webhook.admission.claimreads import ClaimReader, ClaimUnreadable
from webhook.admission.webhooks import WorkloadReader, WorkloadUnreadable
from webhook.k8s.claims import CLAIM, TEMPLATE
from webhook.libs import kube, logs
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.cache import ClusterState
from webhook.quota.ledger import LedgerStore
from webhook.server.sources.reload import PolicySource


def configured(kubeconfig: str | None) -> bool:
    return bool(kubeconfig) or bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def ledger_namespace(explicit: str | None) -> str:
    """Where the ledger lives: --namespace, else the pod's own namespace."""
    if explicit:
        return explicit
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or "gpu-webhook"
    except OSError:
        return "gpu-webhook"


@dataclass(frozen=True)
class Cluster:
    """The cluster as the server uses it: the watch-fed state, the ledger store, the
    reader of scale requests' workloads, and the watches to stop at shutdown."""

    state: ClusterState
    store: LedgerStore
    read_workload: WorkloadReader
    watchers: list[kube.Watcher]
    api: Any = None  # the API client, for what the leader replica writes (server.upkeep)
    read_claim: ClaimReader | None = None  # a claim or template the watches lack yet

    def stop(self) -> None:
        for w in self.watchers:
            w.stop()


def attach(source: PolicySource, kubeconfig: str | None, namespace: str | None,
           loop: asyncio.AbstractEventLoop) -> Cluster:
    """Start the pod and namespace watches and the ledger store, before the server is
    built from them. Raises kube.Unreachable when credentials cannot even be loaded."""
    api = kube.connect(kubeconfig)

    def policy() -> CompiledPolicy:
        assert source.active is not None
        return source.active.policy

    active = source.active
    assert active is not None
    state = ClusterState(policy)
    ns = ledger_namespace(namespace)
    store = LedgerStore(state, kube.ConfigMaps(api, ns), ttl=active.policy.reservation_ttl)
    pods = kube.Watcher(api, "pods", state.deliverer(loop, state.pod_event))
    namespaces = kube.Watcher(api, "namespaces", state.deliverer(loop, state.namespace_event))
    # DRA: the claims and templates pods name, found without an API call on admission.
    state.watch_claims()
    claims = kube.Watcher(api, "resourceclaims",
                          state.deliverer(loop, state.claim_event(CLAIM)))
    templates = kube.Watcher(api, "resourceclaimtemplates",
                             state.deliverer(loop, state.claim_event(TEMPLATE)))
    state.on_relabel = pods.resync
    # Pods listed before the templates they name were charged without them: once the
    # templates are in, count the pods again.
    state.on_templates_synced = pods.resync
    # A new policy may charge pods and claims differently.
    source.on_change.extend([pods.resync, claims.resync])
    watchers = [namespaces, templates, claims, pods]
    for w in watchers:
        w.start()
    logs.event("using the cluster for quota", kubeconfig=kubeconfig or "in-cluster",
               ledger_namespace=ns, reservation_ttl=active.policy.reservation_ttl)
    return Cluster(state, store, workload_reader(kube.Workloads(api)), watchers, api,
                   claim_reader(kube.ResourceClaims(api)))


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
