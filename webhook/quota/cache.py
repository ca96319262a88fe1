"""The cluster as quota sees it: GPU pods and namespace labels, fed by watches.

Only what quota needs is kept: one :class:`~webhook.quota.usage.Charge` per GPU pod
(non-GPU pods cost nothing), which pod holds each ``namespace/name`` (a re-created name
is refused by the API server while another pod holds it), namespace labels for
selector-based tenants, and, for a while, the uids of pods that ended so a reservation
for them is not counted again. Events arrive on watch threads and are applied on the
event loop, so the usage totals are only ever touched by one thread.

Liveness: a watch whose connection stalls silently (a dead load-balancer path: no FIN,
no RST) delivers nothing, and nothing tells an idle watch from a dead one but time. Each
watch therefore shows progress at least every :meth:`ClusterState.watch_window` seconds
(an event, a bookmark, or the end of a watch window the server closes), and the state is
*live* only while every watch has shown progress within twice that. The window is a
quarter of the reservation TTL (at most 5 s: a watch request each, cheap), so a live
cache is never older than half a TTL: a reservation that expired was made long enough
ago that its pod, if created, is in a live cache. While not live, :meth:`synced` is
false (``/readyz`` says not ready) and the ledger refuses to commit (``onUnavailable``
applies), because expired reservations would be counted as free for pods this cache has
not seen.

The same bound tells the ledger when a reservation has done its work: a pod this replica
has seen for :meth:`ClusterState.settle_time` is in the cache of every replica that may
commit, so its entry is dropped from the next write (:mod:`webhook.quota.ledger`), and a
ledger holds about a quarter-minute of admissions instead of a TTL's.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.engine.charge import TERMINAL_PHASES
from webhook.engine.cost import Charge
from webhook.k8s import podgroups
from webhook.k8s.claims import CLAIM, TEMPLATE
from webhook.k8s.identity import ObjectId
from webhook.k8s.objects import label_of
from webhook.k8s.slices import SLICE
from webhook.libs.kube.watch import apply_event
from webhook.policy.compiled import CompiledPolicy
from webhook.quota.charges import ChargeMemo
from webhook.quota.claims import ClaimCache
from webhook.quota.gputime import HoldBook
from webhook.quota.line import WaitLine
from webhook.quota.usage import Usage

# Watch windows: short enough to show progress well within the reservation TTL, long
# enough that an idle cluster costs one request per watch every few seconds at most.
MAX_WATCH_WINDOW = 5.0
MIN_WATCH_WINDOW = 1.0
MIN_SETTLE_MARGIN = 2.0  # see ClusterState.settle_time
PODS, NAMESPACES = "pods", "namespaces"
# Watch events applied per turn of the event loop before its other callbacks run again
# (a relist delivers every pod at once).
EVENTS_PER_TURN = 256
PROGRESS = "PROGRESS"  # an event type: the watch is alive, nothing changed


class _Pods:
    """The GPU pods of one list-and-watch: charges by uid, and who holds each name."""

    __slots__ = ("name_of", "names", "usage")

    def __init__(self) -> None:
        self.usage = Usage()
        # "namespace/name" -> (uid, charge or None) of the pod holding that name.
        self.names: dict[str, tuple[str, Charge | None]] = {}
        self.name_of: dict[str, str] = {}  # uid -> "namespace/name"

    def put(self, uid: str, name: str | None, charge: Charge | None) -> None:
        """Set the pod's charge and name; ``name`` None: the pod is gone."""
        self.usage.put(uid, charge)
        held = self.name_of.pop(uid, None)
        if held is not None and self.names.get(held, ("",))[0] == uid:
            del self.names[held]
        if name is not None:
            self.names[name] = (uid, charge)
            self.name_of[uid] = name


class ClusterState:
    def __init__(self, policy: Callable[[], CompiledPolicy], tombstone_ttl: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._pods = _Pods()
        # A relist builds here and replaces ``_pods`` at its end in one step: a cache half
        # refilled would count too little for every admission decided meanwhile.
        self._relisting: _Pods | None = None
        self.labels: dict[str, dict[str, str]] = {}
        self._ended: dict[str, float] = {}  # uid -> when it ended, oldest first (_end)
        # Tenant -> when (``clock``) a pod of it last gave GPUs back (ended, was deleted or
        # asks less): the moment a waiting pod may have come to fit, from which the
        # leader's release is timed (gpu_webhook_release_latency_seconds).
        self.freed: dict[str, float] = {}
        self._tombstone_ttl = tombstone_ttl
        self._clock = clock
        self.pods_synced = False
        self.namespaces_synced = False
        self.on_relabel: Callable[[], None] | None = None
        self._progress: dict[str, float] = {}  # watch -> last sign of life (clock)
        self._watches: tuple[str, ...] = (PODS, NAMESPACES)
        self._absent: set[str] = set()  # watched kinds the API server does not serve
        # DRA claims and templates, once the cluster is known to serve them.
        self.claims: ClaimCache | None = None
        # Pods naming a ResourceClaimTemplate this replica has not seen yet (another
        # replica admitted them; the template's watch is behind the pods'): charged
        # without its devices for now, so not "seen" (their reservations still count),
        # and charged again when it arrives. uid -> (pod, its missing templates).
        self._waiting: dict[str, tuple[dict[str, Any], frozenset[tuple[str, str]]]] = {}
        self._waiting_on: dict[tuple[str, str], set[str]] = {}  # (ns, template) -> uids
        self.on_templates_synced: Callable[[], None] | None = None
        # Pods waiting behind our scheduling gate (quota.line), for the leader's release.
        self.line = WaitLine(self.claim_lookup)
        # Nodes' product label values (None: a node without one), when nodes are fed in
        # (node_event): a bound pod is charged to its node's product. Pods bound to a
        # node not seen yet are charged again when it is: node -> their uids.
        self.node_products: dict[str, str | None] = {}
        self._on_node: dict[str, set[str]] = {}
        self._bound: dict[str, dict[str, Any]] = {}  # uid -> pod, while its node is unseen
        # Told each uid the watch shows with all it costs (or ended): a store deciding
        # in this process drops its reservation then (webhook.quota.decider).
        self.on_seen: Callable[[str], None] | None = None
        # Charges made for pods of one shape, for the events that repeat them.
        self.charges = ChargeMemo()
        # The GPU time each pod held, when it is accounted (webhook.quota.gputime): kept
        # by every replica, so a new leader knows the pods that ended under the last.
        self.hours: HoldBook | None = None

    def watch_claims(self, slices: bool = False, groups: bool = False) -> ClaimCache:
        """Keep DRA claims and templates too (their watches then count for liveness),
        ResourceSlices with ``slices``, and PodGroups with ``groups``."""
        self.claims = ClaimCache(self.policy, self.namespace_labels)
        self._watches = (PODS, NAMESPACES, CLAIM, TEMPLATE)
        if slices:
            self.claims.watch_slices()
            self._watches += (SLICE,)
        if groups:
            self.claims.watch_groups()
            self._watches += (podgroups.KIND, podgroups.COMPOSITE)
        return self.claims

    def claim_lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.claims.lookup(kind, namespace, name) if self.claims else None

    @property
    def pods(self) -> Usage:
        return self._pods.usage

    # -- readiness --------------------------------------------------------------------

    def watch_window(self) -> float:
        """Seconds a watch request may stay open before the server ends it (and so the
        longest a healthy, idle watch goes without progress)."""
        ttl = self.policy().reservation_ttl
        return max(MIN_WATCH_WINDOW, min(MAX_WATCH_WINDOW, ttl / 4))

    def settle_time(self) -> float:
        """Seconds after this replica first sees a pod by which every replica that may
        commit has seen it too. A replica commits only while live (each watch showed
        progress within twice its window), so one that commits at ``t`` has seen what
        was stored before ``t - 2 x window``; one more window covers the lag of the API
        server's watch cache behind its store (at least :data:`MIN_SETTLE_MARGIN`)."""
        window = self.watch_window()
        return 2 * window + max(MIN_SETTLE_MARGIN, window)

    def live(self) -> bool:
        """Every watch has shown progress within twice its window."""
        deadline = self._clock() - 2 * self.watch_window()
        return all(self._progress.get(w, -float("inf")) >= deadline
                   for w in self._watches if w not in self._absent)

    def synced(self) -> bool:
        """Listed once, and live now: what readiness and the ledger depend on."""
        return (self.pods_synced and self.namespaces_synced
                and (self.claims is None or self.claims.ready()) and self.live())

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        return self.labels.get(namespace)

    def seen(self, uid: str) -> bool:
        """Whether this replica has seen the pod (running now, or ended recently) with
        all it costs (every claim template it names known)."""
        return (uid in self.pods or uid in self._ended) and uid not in self._waiting

    def holder(self, name: str) -> tuple[str, Charge | None] | None:
        """(uid, charge) of the pod this replica sees holding ``namespace/name``."""
        return self._pods.names.get(name)

    # -- events (on the event loop) -------------------------------------------------

    def pod_event(self, typ: str, pod: dict[str, Any]) -> None:
        self._progress[PODS] = self._clock()
        if self.hours is not None:
            self.hours.touch()
        if typ == PROGRESS:
            return
        self._pod(typ, pod)

    def _pod(self, typ: str, pod: dict[str, Any]) -> None:
        if typ == "RESET":
            self._relisting = _Pods()
            self.line.reset()
            if self.hours is not None:
                self.hours.relisting()
            return
        if typ == "SYNCED":
            self.line.synced()
            if self._relisting is not None:
                # The claims' charges live beside the pods' (one usage for the ledger):
                # carried into the relisted set.
                for claim, held in (self.claims.charges.items() if self.claims else ()):
                    self._relisting.put(claim, None, held)
                self._pods, self._relisting = self._relisting, None
                if self.hours is not None:
                    self.hours.relisted(self._pods.name_of)
                for gone in [u for u in self._waiting if u not in self._pods.name_of]:
                    self._wait(gone, None, ())  # deleted while the watch was away
            self.pods_synced = True
            return
        ident = ObjectId.of(pod)
        uid = ident.uid
        if not uid:
            return
        into = self._relisting or self._pods
        old = into.usage.charge(uid)
        if typ == "DELETED":
            if old is not None and old.gpus:
                self.freed[old.tenant] = self._clock()
            into.put(uid, None, None)
            self._wait(uid, None, ())
            self._note_node(uid, None)
            self._end(uid)
            self.line.gone(uid)
            if self.hours is not None:
                self.hours.gone(uid, pod)
            if self.on_seen is not None:
                self.on_seen(uid)
            return
        ns = ident.namespace
        charge, unknown = self.charges.charge(pod, ident, self.policy(), self.labels.get(ns),
                                              self.claim_lookup, self.node_products.get)
        self._note_node(uid, pod)
        if self.claims is not None:  # templates are watched: they will arrive
            self._wait(uid, pod, unknown)
        if charge is None and uid in into.usage:
            self._end(uid)  # reached a terminal phase
        if old is not None and old.gpus > (charge.gpus if charge is not None else 0.0):
            self.freed[old.tenant] = self._clock()
        into.put(uid, ident.key, charge)
        if self.hours is not None:
            self._held(uid, pod, ident, charge)
        self.line.seen(uid, pod, charge is not None, ident)
        if self.on_seen is not None and self.seen(uid):
            self.on_seen(uid)

    def _held(self, uid: str, pod: dict[str, Any], ident: ObjectId,
              charge: Charge | None) -> None:
        """Tell the GPU time the pod's charge. A pod first seen ended (listed after a
        restart) is charged as it ran, so the time it held since the last accounting is
        counted."""
        assert self.hours is not None
        status = pod.get("status")
        if (charge is None and uid not in self.hours.holds and isinstance(status, dict)
                and status.get("phase") in TERMINAL_PHASES):
            ran = {**pod, "status": {**status, "phase": "Running"}}
            charge, _ = self.charges.charge(ran, ident, self.policy(),
                                            self.labels.get(ident.namespace),
                                            self.claim_lookup, self.node_products.get)
        self.hours.pod(uid, pod, charge)

    def claim_event(self, kind: str) -> Callable[[str, dict[str, Any]], None]:
        """The event handler for one DRA kind's watch (CLAIM, TEMPLATE or SLICE)."""

        def handle(typ: str, obj: dict[str, Any]) -> None:
            self._progress[kind] = self._clock()
            if self.claims is None:
                return
            if typ == "ABSENT":
                # Not served by this API server: nothing can be asked through it, and a
                # watch that cannot exist must not make the replica not ready.
                self._absent.add(kind)
                typ = "SYNCED"
            else:
                self._absent.discard(kind)
            first_sync = typ == "SYNCED" and not self.claims.synced[kind]
            products = self.claims.products() if kind == SLICE else None
            for uid, charge in self.claims.event(kind, typ, obj):
                for into in (self._pods, self._relisting):
                    if into is not None:
                        into.put(uid, None, charge)
                if charge is None and typ == "DELETED":
                    self._end(uid)  # a reservation for it must not count again
            if kind == TEMPLATE and typ in ("ADDED", "MODIFIED"):
                ident = ObjectId.of(obj)
                key = (ident.namespace, ident.name)
                for uid in sorted(self._waiting_on.get(key, ())):
                    self._pod("MODIFIED", self._waiting[uid][0])  # charged in full now
            if (kind == podgroups.KIND and typ in ("ADDED", "MODIFIED") and self.on_relabel
                    and podgroups.shared_claims(obj)):
                # Pods of the group seen before it were charged their template claims
                # each; the group's claim is one, shared: count them again.
                ident = ObjectId.of(obj)
                ns = ident.namespace
                gang = podgroups.gang(ns, ident.name, obj,
                                      podgroups.parents(ns, obj, self.claim_lookup))
                if (self.line.running(gang.id)
                        or self.line.running(podgroups.group_id(ns, ident.name))):
                    self.on_relabel()
            if first_sync and kind == TEMPLATE and self.pods_synced and self.on_templates_synced:
                self.on_templates_synced()
            # A pod's claim template of part of a device costs what the slices say its
            # products' devices hold: when that changes, the pods are counted again.
            if (products is not None and self.on_relabel and self._any_pod()
                    and self.claims.products() != products):
                self.on_relabel()

        return handle

    def namespace_event(self, typ: str, ns: dict[str, Any]) -> None:
        self._progress[NAMESPACES] = self._clock()
        if typ == PROGRESS:
            return
        if typ == "RESET":
            self.labels = {}
            return
        if typ == "SYNCED":
            first = not self.namespaces_synced
            self.namespaces_synced = True
            # Pods seen before their namespace's labels were charged to no tenant by
            # selector: count them again now the labels are all in.
            if first and self.on_relabel and self._any_pod():
                self.on_relabel()
            return
        ident = ObjectId.of(ns)
        name = ident.name
        if not name:
            return
        before = self.labels.get(name)
        if typ == "DELETED":
            self.labels.pop(name, None)
        else:
            self.labels[name] = dict(ident.labels)
        if before != self.labels.get(name):
            self._recharge_claims()  # a claim's tenant by selector may have changed
        if self.namespaces_synced and before != self.labels.get(name) and self.on_relabel:
            self.on_relabel()  # tenants by selector may have changed: recount the pods

    def node_event(self, typ: str, node: dict[str, Any]) -> None:
        """A node seen (ADDED, MODIFIED, DELETED, RESET): its product label, for the pods
        bound to it. A pod seen bound to a node before the node is charged again when the
        node arrives, or when its product label changes."""
        if typ == "RESET":
            return  # the relist delivers each node again; a stale label is replaced then
        name = ObjectId.of(node).name
        if not name:
            return
        if typ == "DELETED":
            self.node_products.pop(name, None)
            return
        value = label_of(node, self.policy().product_label)
        before = self.node_products.get(name, ...)
        self.node_products[name] = value
        waiting = self._on_node.pop(name, set())
        if before is not ... and before != value and self.on_relabel and self._any_pod():
            self.on_relabel()  # the label changed under bound pods: count them again
        for uid in sorted(waiting):
            pod = self._bound.pop(uid, None)
            live = uid in self._pods.name_of or (
                self._relisting is not None and uid in self._relisting.name_of)
            if pod is not None and live:
                self._pod("MODIFIED", pod)

    def _note_node(self, uid: str, pod: dict[str, Any] | None) -> None:
        """Remember a bound pod whose node is not seen yet (``pod`` None: it is gone)."""
        old = self._bound.pop(uid, None)
        if old is not None:
            node = str((old.get("spec") or {}).get("nodeName") or "")
            waiting = self._on_node.get(node)
            if waiting is not None:
                waiting.discard(uid)
                if not waiting:
                    del self._on_node[node]
        if pod is None:
            return
        spec = pod.get("spec") or {}
        bound = spec.get("nodeName") if isinstance(spec, dict) else None
        if isinstance(bound, str) and bound and bound not in self.node_products:
            self._bound[uid] = pod
            self._on_node.setdefault(bound, set()).add(uid)

    def _recharge_claims(self) -> None:
        """Charge the claims again (their namespaces' labels changed)."""
        if self.claims is None:
            return
        for uid, charge in self.claims.recharge():
            for into in (self._pods, self._relisting):
                if into is not None:
                    into.put(uid, None, charge)

    def _any_pod(self) -> bool:
        """Whether a pod has been seen (listed or being listed again)."""
        return bool(self._pods.name_of) or bool(self._relisting and self._relisting.name_of)

    def _wait(self, uid: str, pod: dict[str, Any] | None, templates: Iterable[str]) -> None:
        """Note the claim templates ``pod`` names that are not known yet (none: it no
        longer waits; ``pod`` None: it is gone)."""
        old = self._waiting.pop(uid, None)
        for key in old[1] if old else ():
            waiting = self._waiting_on.get(key)
            if waiting is not None:
                waiting.discard(uid)
                if not waiting:
                    del self._waiting_on[key]
        if not templates or pod is None:
            return  # the common case: nothing to wait for
        ns = ObjectId.of(pod).namespace
        missing = frozenset((ns, t) for t in templates)
        if missing:
            self._waiting[uid] = (pod, missing)
            for key in missing:
                self._waiting_on.setdefault(key, set()).add(uid)

    def _end(self, uid: str) -> None:
        now = self._clock()
        # Moved to the end on every call, so the dict stays in the order of its times
        # (the clock does not go back) and the oldest are always first.
        self._ended.pop(uid, None)
        self._ended[uid] = now
        if len(self._ended) > 1024:
            # An ended pod's reservation lives until its admission + the TTL (up to an
            # hour): forgotten sooner, the pod would count again as a reservation for a
            # pod not seen yet, holding its GPUs until the entry expires. Twice the TTL
            # covers a writer's clock running ahead.
            keep = max(self._tombstone_ttl, 2 * self.policy().reservation_ttl)
            cutoff = now - keep
            # Only the expired head is read: a busy cluster ends thousands of pods within
            # the window, and reading them all on each end cost the event loop a scan of
            # every tombstone per pod (bench/core.py, "pod watch event").
            stale = list(itertools.takewhile(lambda k: self._ended[k] < cutoff, self._ended))
            for k in stale:
                del self._ended[k]

    # -- wiring ----------------------------------------------------------------------

    def deliverer(self, loop: asyncio.AbstractEventLoop,
                  handler: Callable[[str, dict[str, Any]], None]
                  ) -> Callable[[str, dict[str, Any]], None]:
        """A callback for a watch thread that applies events on ``loop``, in order.

        Events that arrive before the loop has applied the earlier ones join them: one
        wakeup applies what is waiting, :data:`EVENTS_PER_TURN` at a time with the
        loop's other work (reviews) between. Woken once per event, a replica watching a
        busy cluster spent as much CPU handing events and the interpreter between the
        threads as applying them (bench/README.md, "Pod watch events")."""
        waiting: deque[tuple[str, dict[str, Any]]] = deque()
        lock = threading.Lock()
        woken = False

        def apply_waiting() -> None:
            nonlocal woken
            with lock:
                turn = [waiting.popleft() for _ in range(min(len(waiting), EVENTS_PER_TURN))]
            for typ, obj in turn:
                apply_event(loop, handler, typ, obj)
            with lock:
                if not waiting:
                    woken = False
                    return
            loop.call_soon(apply_waiting)  # more arrived, or more than a turn's worth

        def deliver(typ: str, obj: dict[str, Any]) -> None:
            nonlocal woken
            with lock:
                waiting.append((typ, obj))
                if woken:
                    return
                woken = True
            loop.call_soon_threadsafe(apply_waiting)

        # The watch asks how long its windows may be (they follow the policy's TTL).
        deliver.window = self.watch_window  # type: ignore[attr-defined]
        return deliver
