"""Run the webhook: the `gpu-webhook serve` command's body. The policy, the certificates
(``webhook.server.certs.tls``), the cluster (``webhook.server.cluster``) and the app are made
in that order, each refusing to start with one line naming what is wrong; then the
server listens (``webhook.server.web.listen``) until SIGTERM, which drains and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
import uvloop

from webhook.admission.groups import no_members
from webhook.engine.devices import no_claims
from webhook.engine.routes.sights import no_sights
from webhook.engine.target import no_labels
from webhook.libs import certs, logs
from webhook.libs.kube import Unreachable
from webhook.policy.load import PolicyError
from webhook.quota.budget import no_spending
from webhook.quota.store import MemoryStore
from webhook.server import heap, metrics
from webhook.server.certs import selfcerts
from webhook.server.certs.tls import CertReloader, ClientCertGate, ssl_context, tls_files
from webhook.server.clock import clock
from webhook.server.cluster import Cluster, attach, configured, ledger_namespace
from webhook.server.leading import upkeep
from webhook.server.settings import Settings
from webhook.server.sources.policyobject import ObjectUnavailable, policy_source
from webhook.server.sources.reload import Active, PolicySource
from webhook.server.web.app import AdmissionApp, Runtime
from webhook.server.web.forward import Relay
from webhook.server.web.listen import (
    KEEP_ALIVE_TIMEOUT,
    AdmissionProtocol,
    BoundedServer,
    cannot_listen,
)


class CannotStart(Exception):
    """A reason ``serve`` does not start: logged as ``log`` (with ``fields``) and printed
    as one line, ``gpu-webhook: <line>``; the exit status is 2."""

    def __init__(self, log: str, said: str, *, line: str | None = None,
                 **fields: Any) -> None:
        super().__init__(said)
        self.log, self.line, self.fields = log, line or f"cannot start, {said}", fields


def self_managed(settings: Settings) -> selfcerts.SelfManagedCerts:
    """--self-managed-certs: get a serving pair from the Secret (issued if need be) into
    the files :func:`tls_files` names, before serving.

    The renewals that follow write the same files, and :class:`CertReloader` loads them
    as it would a mounted Secret's update: one path for every way a certificate changes.
    """
    d = Path(settings.cert_dir)
    cert = settings.tls_cert or str(d / certs.CERT_FILE)
    key = settings.tls_key or str(d / certs.KEY_FILE)
    namespace = ledger_namespace(settings.namespace)
    try:
        renewer = selfcerts.connect(
            settings.kubeconfig, namespace, settings.cert_secret, settings.service,
            settings.certificate_targets(), settings.cert_host_list(),
            settings.cert_validity_hours, settings.ca_validity_hours, cert, key,
            settings.written_ca())
    except Unreachable as exc:
        raise CannotStart("cannot start: --self-managed-certs needs the cluster",
                          f"--self-managed-certs needs the cluster: {exc}",
                          error=str(exc)) from None
    logs.event("self-managed certificates", secret=f"{namespace}/{settings.cert_secret}",
               names=[*renewer.wanted.dns_names, *renewer.wanted.ip_addresses],
               configurations=settings.certificate_targets(),
               validity_hours=settings.cert_validity_hours,
               ca_validity_hours=settings.ca_validity_hours)
    renewer.first_sync()
    return renewer


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def run(settings: Settings) -> int:
    """``serve``: start in order (policy, certificates, TLS), each step refusing to
    start with one line; then serve until SIGTERM. The exit status: 0 or 2."""
    logs.setup(settings.log_level)
    try:
        _kubeconfig_exists(settings)
        source, active = _policy(settings)
        renewer = self_managed(settings) if settings.self_managed_certs else None
        context, reloader = _tls(settings)
        _log_start(settings, active, reloader)
        problem = cannot_listen(settings.host, settings.port)
        if problem:
            raise CannotStart(f"cannot start: {problem}", problem)
    except CannotStart as exc:
        logs.event(exc.log, logging.ERROR, **exc.fields)
        print(f"gpu-webhook: {exc.line}")
        return 2
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal so that the
    # default action ends the process "killed by SIGTERM" (143). A drained, orderly stop
    # is a success: this handler turns the re-raised signal (or one that arrives before
    # uvicorn listens) into exit status 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvloop.run(_serve(settings, source, active, context, reloader, renewer))
    return 0


def _kubeconfig_exists(settings: Settings) -> None:
    if settings.kubeconfig and not os.path.isfile(settings.kubeconfig):
        # A missing file is a typo, not a cluster that is down: without this, the replica
        # would start and stay not-ready, retrying a file that will never appear.
        raise CannotStart("cannot start: --kubeconfig names no file",
                          f"--kubeconfig {settings.kubeconfig}: no such file",
                          kubeconfig=settings.kubeconfig)


def _policy(settings: Settings) -> tuple[PolicySource, Active]:
    source = policy_source(settings)
    try:
        return source, source.load()
    except ObjectUnavailable as exc:
        raise CannotStart("cannot start: no GPUPolicy to serve", str(exc),
                          error=str(exc)) from None
    except PolicyError as exc:
        raise CannotStart("cannot start: the policy is invalid",
                          f"the policy is invalid:\n{exc}", error=str(exc)) from None


def _tls(settings: Settings) -> tuple[ssl.SSLContext, CertReloader]:
    try:
        cert, key = tls_files(settings)
        context = ssl_context(settings, cert, key)
        reloader = CertReloader(context, cert, key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        msg = (f"TLS files unusable ({exc}); check --tls-cert/--tls-key or "
               "--cert-dir (and --client-ca), or regenerate them with "
               "`gpu-webhook certs --force`")
        raise CannotStart(f"cannot start: {msg}", msg, line=f"cannot start: {msg}") from None
    if reloader.serving.expired():
        logs.event("the TLS certificate has expired; the API server will refuse it until it "
                   "is renewed (the new files are picked up without a restart)",
                   logging.ERROR, not_after=reloader.serving.not_after.isoformat())
    # Read at scrape time, so it follows certificate reloads.
    metrics.CERT_EXPIRY.set_function(lambda: reloader.serving.not_after.timestamp())
    return context, reloader


def _log_start(settings: Settings, active: Active, reloader: CertReloader) -> None:
    logs.event("starting", host=settings.host, port=settings.port,
               policy=active.policy.name, policy_source=active.source,
               tls_min=settings.tls_min_version, mtls=bool(settings.client_ca),
               client_cns=settings.client_cn_list(),
               cert_serial=f"{reloader.serving.serial:x}",
               cert_names=reloader.serving.names,
               cert_not_after=reloader.serving.not_after.isoformat(),
               usage_store="cluster ledger" if configured(settings.kubeconfig)
               else "in-memory (no cluster configured)", pid=os.getpid())
    selecting = active.policy.selector_tenants()
    if selecting and not configured(settings.kubeconfig):
        logs.event("tenants chosen by namespace labels cannot match without a cluster: the "
                   "webhook reads namespace labels from the API server; their namespaces' GPU "
                   "pods are refused saying so (give --kubeconfig, or run in the cluster)",
                   logging.WARNING, tenants=selecting)


def _attach(settings: Settings, source: PolicySource
            ) -> tuple[Cluster | None, dict[str, Callable[[], bool]]]:
    """The cluster, when one is configured, and what readiness waits for."""
    if not configured(settings.kubeconfig):
        return None, {}
    try:
        cluster = attach(source, settings.kubeconfig, settings.namespace,
                         asyncio.get_running_loop(), settings.quota_commit)
    except Unreachable as exc:
        logs.event("cannot use the cluster; not ready until it can", logging.ERROR,
                   error=str(exc))
        return None, {"cluster": lambda: False}
    return cluster, {"caches-synced": cluster.state.synced}


def _runtime(settings: Settings, source: PolicySource, active: Active,
             cluster: Cluster | None, ready: dict[str, Callable[[], bool]],
             relay: Relay | None = None,
             notes: dict[str, Callable[[], str]] | None = None) -> Runtime:
    """What the app reads: the cluster's caches and ledger, or none of them."""
    return Runtime(
        policy=source,
        namespace_labels=cluster.state.namespace_labels if cluster else no_labels,
        # read at each scrape: a relist replaces the dict
        namespaces=(lambda: cluster.state.labels) if cluster else metrics.no_namespaces,
        store=cluster.store if cluster else MemoryStore(ttl=active.policy.reservation_ttl),
        read_workload=cluster.read_workload if cluster else None,
        claims=cluster.state.claim_lookup if cluster else no_claims,
        read_claim=cluster.read_claim if cluster else None,
        sights=cluster.sights if cluster else no_sights,
        read_group=cluster.read_group if cluster else None,
        group_members=(lambda group: cluster.state.line.running(group)) if cluster
        else no_members,
        gatekeeper=cluster.identity if cluster else None,
        spending=cluster.gputime.spending if cluster and cluster.gputime else no_spending,
        ready_checks=ready,
        ready_notes=notes or {},
        max_inflight=settings.max_inflight,
        request_timeout=settings.request_timeout,
        clock=clock(settings.test_clock_offset_file),
        relay=relay)


def _server(settings: Settings, runtime: Runtime, context: ssl.SSLContext) -> BoundedServer:
    app: Any = AdmissionApp(runtime)
    if settings.client_ca:
        app = ClientCertGate(app, settings.client_cn_list())
    # No ssl= here: Acceptor starts TLS itself (see the module docstring). The API server
    # and the kubelet call the webhook directly, never through a proxy: X-Forwarded-For
    # is not trusted (uvicorn would, from 127.0.0.1, and put it in every log line's
    # client) nor parsed on each review; and no Server header says what serves it.
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, loop="uvloop",
        http=AdmissionProtocol, lifespan="off", access_log=False, log_config=None,
        timeout_keep_alive=KEEP_ALIVE_TIMEOUT, timeout_graceful_shutdown=20,
        proxy_headers=False, server_header=False,
    )
    return BoundedServer(config, context, settings.max_connections)


async def _serve(settings: Settings, source: PolicySource, active: Active,
                 context: ssl.SSLContext, reloader: CertReloader,
                 renewer: selfcerts.SelfManagedCerts | None) -> None:
    # The cluster first, then the app built on it once: nothing is swapped into a
    # running server.
    cluster, ready = _attach(settings, source)
    # The leader's work before the app: with --quota-commit leader the app relays to the
    # leader the Lease names.
    namespace = ledger_namespace(settings.namespace)
    kept = (upkeep.start(cluster, source, namespace,
                        settings.quota_status_seconds,
                        settings.audit_seconds,
                        clock(settings.test_clock_offset_file),
                        release_seconds=settings.release_seconds,
                        address=settings.advertised() if settings.quota_commit == "leader"
                        else "", configurations=settings.certificate_targets(),
                        sync=settings.webhook_configurations_sync)
            if cluster is not None else None)
    relay = None
    if kept is not None and settings.quota_commit == "leader":
        ca = settings.leader_ca()
        assert ca is not None  # checked with the settings
        leadership = kept.leadership
        relay = Relay(lambda: leadership.leader_address, ca, settings.leader_name(namespace))
    # The drift of the webhook configurations is said, never a reason to be unready: a
    # leader taken out of the Service would leave GPU pods with no replica to decide them
    # (--quota-commit leader), which is worse than the drift it reports.
    notes = ({"webhookConfigurations": kept.keeper.summary}
             if kept is not None and kept.keeper is not None else {})
    server = _server(settings, _runtime(settings, source, active, cluster, ready, relay,
                                        notes), context)
    watchers = [asyncio.ensure_future(source.watch(settings.policy_poll_seconds)),
                asyncio.ensure_future(reloader.watch(settings.cert_poll_seconds))]
    if renewer is not None:
        watchers.append(asyncio.ensure_future(
            renewer.keep_renewed(settings.cert_check_seconds)))
    # Out of the garbage collector's full passes: what start-up made, the caches'
    # first list, each new policy (webhook.server.heap).
    metrics.HEAP_FROZEN.set_function(heap.frozen)
    heap.settle("started")
    if cluster is not None and cluster.gputime is not None:
        cluster.gputime.clock = clock(settings.test_clock_offset_file)
        watchers.append(asyncio.ensure_future(cluster.gputime.run()))
    if cluster is not None:
        watchers.append(asyncio.ensure_future(
            heap.settle_when(cluster.state.synced, "caches listed the cluster")))
    source.on_change.append(heap.resettle_for_policy)
    try:
        await server.serve()
    finally:
        for w in watchers:
            w.cancel()
        if kept is not None:
            await kept.stop()
        if relay is not None:
            await relay.close()
        if cluster is not None:
            cluster.stop()
        # uvicorn re-raises SIGTERM after its shutdown, which skips atexit: write the
        # buffered log lines now.
        logs.flush()
