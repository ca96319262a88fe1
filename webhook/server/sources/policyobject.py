"""The policy served from a GPUPolicy object: ``gpu-webhook serve --policy-object NAME``.

Which object: the one named by ``--policy-object``. GPUPolicy is cluster-scoped, so a
name is one object; any other GPUPolicy in the cluster is not served (it is still
checked at ``kubectl apply`` by the validating webhook, so it can be staged and reviewed
before the flag, or the object's content, is switched to it).

Start: the replica reads the object. When its spec loads, that is served. When it does
not (an edit made while the validating webhook was absent or failing open), the replica
serves ``status.lastAccepted``, the spec a replica last accepted, and says so in its log
and in the object's status; with neither (no such object, no API server, nothing ever
accepted) it does not start, with one line saying why.

Running: a watch of that one object loads each new ``metadata.generation``; a spec the
loader refuses leaves the served policy as it is (the last good one), as the file route
does. A deleted object leaves it too: deleting the policy never opens the webhook up.

Status (the status subresource, written by every replica with a resourceVersion
precondition; a write that fails is logged and retried, and never touches admission):

- ``conditions``: ``Accepted`` (the current generation loads, or the loader's located
  errors) and ``Active`` (every replica serves the current generation), each with
  ``observedGeneration``;
- ``replicas[]``: each replica by pod name, the generation it serves, and when it last
  reported (every ``--policy-report-seconds``; an entry not refreshed for three periods
  is dropped, and a replica that stops cleanly removes its own);
- ``tenants``: the tenants of the policy served (the ``Tenants`` printer column);
- ``lastAccepted``: the generation and spec last accepted.

:func:`desired_status` computes the status from what is there and what this replica
knows, without I/O; it changes nothing when nothing changed, so the replicas, each
woken by the others' writes, settle at once.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import socket
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from webhook.libs import kube, logs
from webhook.policy.compiled import compile_policy
from webhook.policy.load import PolicyError
from webhook.policy.model import API_VERSION, KIND
from webhook.policy.review import load_object
from webhook.server.settings import Settings
from webhook.server.sources.reload import Active, PolicySource, resolve

MAX_MESSAGE = 32768  # the CRD's maxLength of a condition message
STALE_PERIODS = 3  # report periods without a refresh before a replica's entry is dropped


class ObjectUnavailable(PolicyError):
    """The replica cannot start on its GPUPolicy: there is none, the API server does not
    answer, or neither its spec nor a last accepted spec loads."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.source, self.problems = "GPUPolicy", []


def policy_source(settings: Settings) -> PolicySource:
    """The policy source ``serve`` runs with: the GPUPolicy named by --policy-object, or
    the --policy file (the embedded example when neither is given)."""
    if settings.policy_object:
        return ObjectSource(settings.policy_object, settings.kubeconfig, replica_name(),
                            settings.policy_report_seconds)
    return PolicySource(resolve(settings.policy))


def replica_name() -> str:
    """The pod's name (POD_NAME, from the Downward API), else host and process id."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class View:
    """What this replica knows of the object, for its status."""

    replica: str
    served_uid: str  # the object whose generation is served ("" for none)
    served_generation: int
    tenants: int
    judged_uid: str  # the object of the latest generation this replica loaded (or tried)
    judged_generation: int
    error: str | None  # why that generation was refused; None: accepted
    accepted_spec: dict[str, Any] | None  # the spec of judged_generation when accepted


class ObjectSource(PolicySource):
    """The active policy, from one GPUPolicy object; see the module docstring."""

    def __init__(self, name: str, kubeconfig: str | None, replica: str,
                 report_seconds: float) -> None:
        super().__init__(None)
        self.name = name
        self.kubeconfig = kubeconfig
        self.replica = replica
        self.report_seconds = report_seconds
        self.policies: kube.GPUPolicies | None = None
        self.view = View(replica, "", 0, 0, "", 0, None, None)
        self._judged: tuple[str, int] = ("", 0)  # (uid, generation) last loaded or refused
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self._watcher: kube.Watcher | None = None

    # -- the first load (before the server listens) -------------------------------------

    def load(self) -> Active:
        what = f"GPUPolicy {self.name}"
        try:
            self.policies = kube.GPUPolicies(kube.connect(self.kubeconfig), self.name)
            obj = self.policies.read()
        except kube.NotFound:
            raise ObjectUnavailable(
                f"{what} does not exist (--policy-object): create it, e.g. `kubectl apply "
                f"-f` a policy file whose metadata.name is {self.name} (the GPUPolicy CRD "
                "must be installed)") from None
        except kube.KubeError as exc:
            raise ObjectUnavailable(f"cannot read {what}: {exc}") from None
        if self._consider(obj):
            assert self.active is not None
            return self.active
        refused = self.view.error
        last = (obj.get("status") or {}).get("lastAccepted") or {}
        if isinstance(last.get("spec"), dict):
            generation = int(last.get("generation") or 0)
            try:
                compiled = compile_policy(load_object(self._document(obj, last["spec"])))
            except PolicyError as exc:
                raise ObjectUnavailable(
                    f"{what} is refused, and so is its last accepted generation "
                    f"{generation}:\n{refused}\n{exc}") from None
            meta = obj.get("metadata") or {}
            self.view = View(self.replica, str(meta.get("uid") or ""), generation,
                             len(compiled.tenants), self.view.judged_uid,
                             self.view.judged_generation, refused, None)
            logs.event("serving the last accepted generation of the GPUPolicy: its current "
                       "spec is refused", logging.WARNING, policy=self.name,
                       generation=meta.get("generation"), serving_generation=generation,
                       error=refused)
            active = self._install(compiled, f"{what} (generation {generation}, "
                                             "the last accepted)")
            self.last_error = refused
            return active
        raise ObjectUnavailable(f"{what} is refused, and no accepted generation of it is "
                                f"recorded in its status:\n{refused}")

    def _document(self, obj: dict[str, Any], spec: Any) -> dict[str, Any]:
        return {"apiVersion": obj.get("apiVersion", API_VERSION), "kind": KIND,
                "metadata": {"name": self.name}, "spec": spec}

    def _consider(self, obj: dict[str, Any]) -> bool:
        """Load the object's generation if not done yet; True if it is now served."""
        meta = obj.get("metadata") or {}
        key = (str(meta.get("uid") or ""), int(meta.get("generation") or 0))
        if key == self._judged:
            return False  # a status write, or the same generation listed again
        self._judged = key
        try:
            compiled = compile_policy(load_object(obj))
        except PolicyError as exc:
            served = self.active.generation if self.active else 0
            message = (f"generation {key[1]} refused; serving "
                       + (f"generation {self.view.served_generation}" if served
                          else "nothing yet") + f":\n{exc}")
            self.view = View(self.replica, self.view.served_uid,
                             self.view.served_generation, self.view.tenants, key[0], key[1],
                             str(exc), None)
            self._fail(message)
            self._dirty.set()
            return False
        self.view = View(self.replica, key[0], key[1], len(compiled.tenants), key[0], key[1],
                         None, copy.deepcopy(obj.get("spec") or {}))
        self.last_error = None  # before the new generation is visible (see reload.py)
        self._install(compiled, f"GPUPolicy {self.name} (generation {key[1]})")
        self._dirty.set()
        return True

    # -- running ------------------------------------------------------------------------

    def reload_if_changed(self) -> bool:
        return False  # the watch delivers changes; there is no file to look at

    def _event(self, typ: str, obj: dict[str, Any]) -> None:
        """Called from the watch thread."""
        if typ in ("ADDED", "MODIFIED"):
            if (obj.get("metadata") or {}).get("name") != self.name:
                return
            if self._consider(obj):
                for callback in self.on_change:
                    callback()
            self._dirty.set()  # another replica's write may call for ours
        elif typ == "DELETED":
            self._judged = ("", 0)
            self._fail(f"GPUPolicy {self.name} was deleted; keeping the policy served "
                       f"(generation {self.view.served_generation})")
        elif typ == "ABSENT":
            self._fail(f"the API server serves no GPUPolicy resource (is the CRD "
                       f"installed?); keeping GPUPolicy {self.name} as last read")

    async def watch(self, interval: float = 2.0) -> None:
        """Run the watch and the status reports until cancelled (at shutdown), then take
        this replica's entry out of the status."""
        assert self.policies is not None, "load() first"
        self._watcher = self.policies.watcher(self._event)
        self._watcher.start()
        reporter = threading.Thread(target=self._report_loop, name="policy-status",
                                    daemon=True)
        reporter.start()
        try:
            await asyncio.Event().wait()
        finally:
            self._stopping.set()
            self._dirty.set()
            self._watcher.stop()
            try:
                self._report(refresh=False, leaving=True)
            except kube.KubeError as exc:
                logs.event("could not remove this replica from the GPUPolicy status",
                           logging.WARNING, error=str(exc))

    def _report_loop(self) -> None:
        backoff = 1.0
        while not self._stopping.is_set():
            refresh = not self._dirty.wait(self.report_seconds)
            self._dirty.clear()
            if self._stopping.is_set():
                return
            try:
                self._report(refresh)
                backoff = 1.0
            except kube.KubeError as exc:
                logs.event("cannot write the GPUPolicy status; retrying", logging.WARNING,
                           policy=self.name, error=exc.detail or str(exc), retry_in=backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                self._dirty.set()

    def _report(self, refresh: bool, leaving: bool = False) -> None:
        assert self.policies is not None
        for _ in range(8):  # replicas write at the same moments: retry on a conflict
            try:
                obj = self.policies.read()
            except kube.NotFound:
                return
            status = desired_status(obj, self.view, datetime.now(UTC),
                                    STALE_PERIODS * self.report_seconds, refresh, leaving)
            if status == obj.get("status"):
                return
            obj["status"] = status
            try:
                self.policies.replace_status(obj)
                return
            except kube.Conflict:
                continue
        raise kube.Conflict(f"update the status of gpupolicy {self.name}",
                            "it kept changing between the read and the write")


def _time(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: Any) -> datetime | None:
    try:
        return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def desired_status(obj: dict[str, Any], view: View, now: datetime, stale_after: float,
                   refresh: bool, leaving: bool = False) -> dict[str, Any]:
    """The object's status once this replica has reported ``view`` (pure)."""
    old = obj.get("status") or {}
    status: dict[str, Any] = copy.deepcopy(old)
    meta = obj.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    uid = str(meta.get("uid") or "")
    served = view.served_generation if view.served_uid == uid else 0
    judged = view.judged_uid == uid and view.judged_generation == generation

    replicas = _replicas(old, view, served, now, stale_after, refresh, leaving)
    status["replicas"] = [replicas[n] for n in sorted(replicas)]
    if not status["replicas"]:
        del status["replicas"]

    conditions = {c.get("type"): c for c in old.get("conditions") or ()}
    if judged:
        if view.error is None:
            accepted = ("True", "Loaded", f"generation {generation} loads")
        else:
            accepted = ("False", "Invalid", view.error[:MAX_MESSAGE])
        conditions["Accepted"] = _condition(conditions.get("Accepted"), "Accepted",
                                            generation, *accepted, now)
    gens = {n: int(e.get("servedGeneration") or 0) for n, e in replicas.items()}
    conditions["Active"] = _condition(conditions.get("Active"), "Active", generation,
                                      *_active(gens, generation, conditions), now)
    status["conditions"] = [conditions[t] for t in ("Accepted", "Active") if t in conditions]

    if not leaving and served and served >= max(gens.values(), default=0):
        status["tenants"] = view.tenants
    last = old.get("lastAccepted") or {}
    if (judged and view.error is None and view.accepted_spec is not None
            and served == generation and generation > int(last.get("generation") or 0)):
        status["lastAccepted"] = {"generation": generation,
                                  "spec": copy.deepcopy(view.accepted_spec)}
    return status


def _replicas(old: dict[str, Any], view: View, served: int, now: datetime,
              stale_after: float, refresh: bool, leaving: bool) -> dict[str, dict[str, Any]]:
    """The replicas reporting, by name: the others' entries that are not stale, and this
    replica's own (its report time kept when nothing changed, unless ``refresh``)."""
    replicas: dict[str, dict[str, Any]] = {}
    for entry in old.get("replicas") or ():
        seen = _parse_time(entry.get("lastReportTime"))
        if seen is not None and (now - seen) > timedelta(seconds=stale_after):
            continue  # a replica gone without a clean stop
        replicas[str(entry.get("name"))] = dict(entry)
    mine = replicas.pop(view.replica, None)
    if not leaving:
        same = mine is not None and mine.get("servedGeneration") == served
        replicas[view.replica] = {
            "name": view.replica, "servedGeneration": served,
            "lastReportTime": (mine or {}).get("lastReportTime") if same and not refresh
            else _time(now)}
    return replicas


def _active(gens: dict[str, int], generation: int, conditions: dict[Any, dict[str, Any]]
            ) -> tuple[str, str, str]:
    """The Active condition's status, reason and message, from what each replica serves."""
    if not gens:
        return ("Unknown", "NoReplicas", "no webhook replica reports serving it")
    listing = ", ".join(f"{n}={g}" for n, g in sorted(gens.items()))
    if all(g == generation for g in gens.values()):
        return ("True", "Served", f"{len(gens)} replica(s) serve generation "
                                  f"{generation}: {', '.join(sorted(gens))}")
    if (conditions.get("Accepted") or {}).get("status") == "False" and (
            conditions["Accepted"].get("observedGeneration") == generation):
        return ("False", "ServingLastAccepted",
                f"generation {generation} is refused (see Accepted); the replicas "
                f"keep the last accepted: {listing}")
    return ("False", "Updating", f"not every replica serves generation "
                                 f"{generation} yet: {listing}")


def _condition(old: dict[str, Any] | None, kind: str, generation: int, status: str,
               reason: str, message: str, now: datetime) -> dict[str, Any]:
    new = {"type": kind, "status": status, "observedGeneration": generation,
           "reason": reason, "message": message}
    if old is not None and all(old.get(k) == v for k, v in new.items()):
        return old
    transition = old.get("lastTransitionTime") if old and old.get("status") == status \
        else _time(now)
    return {**new, "lastTransitionTime": transition}
