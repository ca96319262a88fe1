"""Policy test suites: ``gpu-webhook test DIR`` runs manifests through a policy and
compares what the webhook would do with what the suite expects.

A suite is a YAML file (``kind: GPUPolicyTest``) naming a policy (relative to the suite
file), the labels of namespaces (for ``namespaceSelector`` tenants), the GPU pods already
running (a usage snapshot, as full Pod manifests or in a compact form) and the cases.
Each case runs as the API server would call the webhook, with the same code ``review``
uses: mutate -> apply the patch -> validate, with quota checked against an in-memory
usage store loaded with the snapshot.

Cases run in file order against one store per suite: a Pod CREATE that is admitted (not
a dry run) reserves its quota, as it would in the server, so later cases see it. That is
how a suite shows "the fifth pod no longer fits". Reservations never expire during a
run (the store's clock is frozen), so results do not depend on how fast a machine is.

This module runs a suite; the suite files' model, validation and discovery are
``webhook.tools.policysuite``, the comparison with what a case expects and the results'
text and JSON are ``webhook.tools.policyresults``.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml

from webhook.admission.offline import ClaimBook, through_both
from webhook.engine.charge import charge_of_pod
from webhook.k8s.review import AdmissionRequest, BadReview, parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import PolicyError, Problem, load_file
from webhook.policy.model import USER_ANNOTATION
from webhook.quota.budget import spending_of
from webhook.quota.store import MemoryStore
from webhook.tools.policyresults import CaseResult, Got, SuiteResult, compare
from webhook.tools.policysuite import Case, RunningPod, Suite, load_suite


def run_path(path: Path) -> SuiteResult:
    """Load and run one suite file; load errors end up in ``SuiteResult.error``."""
    try:
        suite = load_suite(path)
    except PolicyError as exc:
        return SuiteResult(str(path), path.stem, "", error=str(exc))
    policy_path = Path(os.path.normpath(path.parent / suite.policy))
    try:
        compiled = compile_policy(load_file(policy_path))
        runner = _Runner(path, suite, compiled)
    except PolicyError as exc:
        return SuiteResult(str(path), suite.metadata.name, str(policy_path), error=str(exc))
    result = SuiteResult(str(path), suite.metadata.name,
                         f"{policy_path} (policy {compiled.name})")
    for i, case in enumerate(suite.cases):
        try:
            result.cases.append(runner.run(i, case))
        except PolicyError as exc:
            result.error = str(exc)
            break
    return result


class _Runner:
    def __init__(self, path: Path, suite: Suite, policy: CompiledPolicy) -> None:
        self.path = path
        self.suite = suite
        self.policy = policy
        self.store = MemoryStore(ttl=policy.reservation_ttl, clock=lambda: 0.0)
        self.claims = ClaimBook()  # the claims and templates the suite's cases admitted
        self.problems: list[Problem] = []
        for i, pod in enumerate(suite.usage):
            self._load_running(i, pod)
        if self.problems:
            raise PolicyError(str(path), self.problems)

    def labels(self, namespace: str) -> Mapping[str, str] | None:
        return self.suite.namespaces.get(namespace)

    def _load_running(self, i: int, pod: RunningPod) -> None:
        where = f"usage[{i}]"
        if pod.kind is not None:
            manifest: dict[str, Any] = pod.model_dump(by_alias=True, exclude_none=True,
                                                      include={"api_version", "kind",
                                                               "metadata", "spec", "status"})
            meta = manifest["metadata"]
            key = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}#{i}")
        else:
            assert pod.namespace is not None and pod.gpus is not None
            manifest = self._compact_pod(i, pod, where)
            if not manifest:
                return
            key = f"{pod.namespace}/{manifest['metadata']['name']}#{i}"
        ns = str(manifest["metadata"].get("namespace") or "")
        charge = charge_of_pod(manifest, self.policy, self.labels(ns), self.claims)
        if charge is None:
            self.problems.append(Problem(where, None, (
                f"this pod holds no GPU quota under policy {self.policy.name}: it needs a "
                "namespace of a tenant (see `namespaces` for selector labels), a GPU resource "
                "and a non-terminal phase")))
            return
        self.store.pod_seen(key, charge)

    def _compact_pod(self, i: int, pod: RunningPod, where: str) -> dict[str, Any]:
        if not self.policy.is_gpu(pod.resource):
            self.problems.append(Problem(f"{where}.resource", None, (
                f"{pod.resource!r} is not a GPU resource of policy {self.policy.name}")))
            return {}
        gpus: float | int = int(pod.gpus) if pod.gpus and pod.gpus.is_integer() else 0
        if not gpus:
            self.problems.append(Problem(f"{where}.gpus", None,
                                         "a pod holds a whole number of devices"))
            return {}
        name = pod.name or f"running-{i}"
        spec: dict[str, Any] = {"containers": [{
            "name": "main", "image": "running",
            "resources": {"limits": {pod.resource: str(gpus)},
                          "requests": {pod.resource: str(gpus)}}}]}
        if pod.product is not None:
            short = self.policy.product_name(pod.product)
            if short is None:
                self.problems.append(Problem(f"{where}.product", None, (
                    f"product {pod.product!r} is not defined in policy {self.policy.name} "
                    f"(defined: {', '.join(sorted(self.policy.product_value)) or 'none'})")))
                return {}
            spec["nodeSelector"] = {self.policy.product_label: self.policy.product_value[short]}
        if pod.spot:
            if self.policy.spot is None:
                self.problems.append(Problem(f"{where}.spot", None, (
                    f"policy {self.policy.name} has no spot capacity (spec.spot)")))
                return {}
            spec.setdefault("nodeSelector", {})[self.policy.spot.label] = \
                self.policy.spot.values[0]
        meta: dict[str, Any] = {"name": name, "namespace": pod.namespace}
        if pod.user is not None:
            meta["annotations"] = {USER_ANNOTATION: pod.user}
        if pod.owner and "/" in pod.owner:
            kind, _, owner = pod.owner.partition("/")
            meta["ownerReferences"] = [{"kind": kind.capitalize(), "name": owner,
                                        "controller": True}]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    def _object(self, i: int, case: Case) -> dict[str, Any]:
        if case.resource is not None:
            return copy.deepcopy(case.resource)
        assert case.resource_file is not None
        where = f"cases[{i}].resourceFile"
        path = self.path.parent / case.resource_file
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text("utf-8")) if d is not None]
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise PolicyError(str(self.path), [Problem(where, None,
                                                       f"cannot read {path}: {exc}")]) from None
        if len(docs) != 1 or not isinstance(docs[0], dict):
            raise PolicyError(str(self.path), [Problem(where, None, (
                f"{path} must hold exactly one Kubernetes object (found {len(docs)} "
                "documents)"))])
        obj: dict[str, Any] = docs[0]
        return obj

    def _request(self, i: int, case: Case, obj: dict[str, Any]) -> AdmissionRequest:
        review: Any = request_review(obj, uid=f"{self.suite.metadata.name}-{i}",
                                     operation=case.operation, namespace=case.namespace,
                                     username=case.user, groups=case.groups,
                                     dry_run=case.dry_run)
        if case.old_resource is not None:
            review["request"]["oldObject"] = copy.deepcopy(case.old_resource)
        try:
            return parse_review(orjson.dumps(review))
        except BadReview as exc:
            raise PolicyError(str(self.path), [Problem(f"cases[{i}].resource", None,
                                                       str(exc))]) from None

    def run(self, i: int, case: Case) -> CaseResult:
        obj = self._object(i, case)
        if not isinstance(obj.get("kind"), str):
            raise PolicyError(str(self.path), [Problem(
                f"cases[{i}].resource", None, "a Kubernetes object with apiVersion and kind")])
        at = case.at.timestamp() if case.at is not None else time.time()
        out = through_both(self._request(i, case, obj), self.policy, self.labels,
                           self.store, self.claims, at, spending_of(
                               self.policy,
                               {u.tenant: u.gpu_hours for u in self.suite.gpu_time
                                if u.user is None},
                               {(u.tenant, u.user): u.gpu_hours for u in self.suite.gpu_time
                                if u.user is not None}, at))
        m, v = out.mutating, out.validating
        got = Got(outcome="", changes=list(m.mutations), rules=out.rules(),
                  warnings=out.warnings,
                  tenant=next((d.tenant for d in out.decisions if d.tenant), None))
        if v is None:
            got.outcome, got.phase, got.message = "denied", "mutating", m.message
            return compare(case, got)
        got.patched = copy.deepcopy(out.patched)
        got.reserved = out.reserved
        if not v.allowed:
            got.outcome, got.phase, got.message = "denied", "validating", v.message
        elif got.warnings:
            got.outcome = "warned"
        elif m.findings or v.findings:
            got.outcome = "audited"
        elif m.skipped and v.skipped:
            got.outcome = "skipped"
        else:
            got.outcome = "allowed"
        return compare(case, got)
