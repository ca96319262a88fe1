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

Suite files are validated strictly, with errors that name file, line and field, like
the policy itself; see ``policies/tests/README.md`` for the format.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
import yaml
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from webhook.admission.offline import ClaimBook, through_both
from webhook.engine.charge import charge_of_pod
from webhook.k8s.objects import escape, parse_pointer
from webhook.k8s.review import AdmissionRequest, BadReview, parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import PolicyError, Problem, load_document, load_file, read_file
from webhook.policy.model import USER_ANNOTATION, Rule
from webhook.quota.store import MemoryStore

KIND = "GPUPolicyTest"
OUTCOMES = ("allowed", "denied", "warned", "audited", "skipped")
# ``allowed`` in a suite means "admitted": it also matches a pod admitted with audit-only
# findings or one no rule applied to. ``audited`` and ``skipped`` match only themselves.
_ADMITTED = frozenset({"allowed", "audited", "skipped"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel,
                              populate_by_name=True, frozen=True)


class Metadata(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=253)]


class Patched(_Strict):
    """One effect of the mutating webhook's patch on the object, by JSON Pointer."""

    path: Annotated[str, Field(pattern=r"^(/.*)?$")]
    """A JSON Pointer into the patched object, ``~1`` for ``/`` in a key
    (``/spec/containers/0/resources/requests/nvidia.com~1gpu``)."""
    value: Any = None
    """The value expected there (any YAML value); leave out to only require the path."""
    absent: bool = False
    """The path must not exist in the patched object."""

    @model_validator(mode="after")
    def _value_or_absent(self) -> Patched:
        if self.absent and "value" in self.model_fields_set:
            raise ValueError("give `value` or `absent: true`, not both")
        return self


def _listed(value: object) -> object:
    return [value] if isinstance(value, str | dict) else value


class Expect(_Strict):
    """What the webhook should do with a case's object."""

    outcome: Literal["allowed", "denied", "warned", "audited", "skipped"]
    phase: Literal["mutating", "validating"] | None = None
    """For a denial: which webhook denies it."""
    rule: list[Rule] = Field(default_factory=list)
    """Rules that must be among the findings (one name or a list)."""
    message_contains: list[str] = Field(default_factory=list)
    warning_contains: list[str] = Field(default_factory=list)
    changes: list[str] | None = None
    """The mutating webhook's changes, exactly (any order); [] for none."""
    patched: list[Patched] = Field(default_factory=list)

    @field_validator("rule", "message_contains", "warning_contains", "patched",
                     mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return _listed(value)  # `rule: quota` reads better than `rule: [quota]`


class Case(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    resource: dict[str, Any] | None = None
    """The object, inline: a Pod, Deployment, Job, ... manifest."""
    resource_file: str | None = None
    """Or a file holding it (one document), relative to the suite file."""
    namespace: str | None = None
    """When the manifest does not say (default: ``default``)."""
    operation: Literal["CREATE", "UPDATE"] = "CREATE"
    old_resource: dict[str, Any] | None = None
    """For UPDATE: the object before the change (a Deployment scaled from 2 to 5)."""
    user: str = "developer"
    groups: list[str] = Field(default_factory=lambda: ["system:authenticated"])
    dry_run: bool = False
    at: AwareDatetime | None = None
    """The time the case is decided at, with its offset (``2026-03-02T09:00:00+01:00``):
    it chooses the quota windows of a ``quotaSchedule`` (default: now)."""
    expect: Expect

    @model_validator(mode="after")
    def _one_resource(self) -> Case:
        if (self.resource is None) == (self.resource_file is None):
            raise ValueError("give the object as `resource` (inline) or `resourceFile`, "
                             "exactly one of them")
        if self.old_resource is not None and self.operation != "UPDATE":
            raise ValueError("`oldResource` is only for operation UPDATE")
        return self


class RunningPod(_Strict):
    """A GPU pod already running: a full Pod manifest, or the compact form
    ``{namespace, name, gpus, resource, product, owner, spot}``."""

    api_version: str | None = None
    kind: Literal["Pod"] | None = None
    metadata: dict[str, Any] | None = None
    spec: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    namespace: str | None = None
    name: str | None = None
    gpus: Annotated[float, Field(gt=0, le=1_000_000)] | None = None
    """Devices of ``resource`` the pod holds (weights apply for quota)."""
    resource: str = "nvidia.com/gpu"
    product: str | None = None
    """Product short name (or node label value) the pod is pinned to."""
    owner: str | None = None
    """``job/pretrain``, ``deployment/web``: named in quota messages."""
    user: str | None = None
    """The user it is charged to (``userQuota``): who created it or its workload."""
    spot: bool = False
    """The pod runs on spot nodes (pinned there by a nodeSelector on the policy's spot
    label), so it holds spot GPUs."""

    @model_validator(mode="after")
    def _one_form(self) -> RunningPod:
        manifest = self.kind is not None or self.spec is not None
        compact = self.namespace is not None or self.gpus is not None
        if manifest and compact:
            raise ValueError("a running pod is either a Pod manifest (apiVersion, kind, "
                             "metadata, spec) or compact (namespace, name, gpus, resource, "
                             "product, owner, spot), not both")
        if manifest and (self.kind is None or self.spec is None or self.metadata is None):
            raise ValueError("a Pod manifest needs kind: Pod, metadata and spec")
        if not manifest and (self.namespace is None or self.gpus is None):
            raise ValueError("a compact running pod needs namespace and gpus")
        return self


class Suite(_Strict):
    api_version: Literal["gpu-webhook.dev/v1alpha1"]
    kind: Literal["GPUPolicyTest"]
    metadata: Metadata
    policy: str
    """The policy file, relative to this suite file."""
    namespaces: dict[str, dict[str, str]] = Field(default_factory=dict)
    """Labels of namespaces, for tenants chosen by namespaceSelector."""
    usage: list[RunningPod] = Field(default_factory=list)
    cases: list[Case] = Field(min_length=1)


# -- running ----------------------------------------------------------------------------


@dataclass
class Got:
    """What the webhook did with one case's object."""

    outcome: str
    phase: str | None = None
    rules: list[str] = field(default_factory=list)
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    patched: dict[str, Any] | None = None
    reserved: bool = False
    tenant: str | None = None


@dataclass
class CaseResult:
    name: str
    expected: str
    got: Got
    differences: list[str]

    @property
    def passed(self) -> bool:
        return not self.differences


@dataclass
class SuiteResult:
    path: str
    name: str
    policy: str
    cases: list[CaseResult] = field(default_factory=list)
    error: str | None = None  # the suite could not run at all

    @property
    def failed(self) -> int:
        return sum(not c.passed for c in self.cases)


def load_suite(path: Path) -> Suite:
    return load_document(read_file(path), str(path), Suite, KIND)


def discover(target: Path) -> list[Path]:
    """Suite files: ``target`` itself, or the YAML files under it whose ``kind`` is
    GPUPolicyTest (other YAML there, such as manifests the suites refer to, is skipped;
    a file whose kind cannot be read is returned so that its error is reported)."""
    if target.is_file():
        return [target]
    found = []
    for p in sorted([*target.rglob("*.yaml"), *target.rglob("*.yml")]):
        try:
            docs = [d for d in yaml.safe_load_all(p.read_text("utf-8")) if d is not None]
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            found.append(p)
            continue
        if any(isinstance(d, dict) and d.get("kind") == KIND for d in docs):
            found.append(p)
    return found


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
        out = through_both(self._request(i, case, obj), self.policy, self.labels,
                           self.store, self.claims,
                           case.at.timestamp() if case.at is not None else None)
        m, v = out.mutating, out.validating
        got = Got(outcome="", changes=list(m.mutations), rules=out.rules(),
                  warnings=out.warnings,
                  tenant=next((d.tenant for d in out.decisions if d.tenant), None))
        if v is None:
            got.outcome, got.phase, got.message = "denied", "mutating", m.message
            return _compare(case, got)
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
        return _compare(case, got)


_MISSING = object()


def resolve(doc: Any, pointer: str) -> Any:
    """The value at a JSON Pointer, or ``_MISSING``."""
    try:
        tokens = parse_pointer(pointer)
    except ValueError:
        return _MISSING
    node = doc
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _MISSING
    return node


def _compare(case: Case, got: Got) -> CaseResult:
    e = case.expect
    diff: list[str] = []
    ok = got.outcome in _ADMITTED if e.outcome == "allowed" else got.outcome == e.outcome
    if not ok:
        why = f": {_first(got.message)}" if got.message else ""
        if got.warnings and e.outcome != "warned":
            why = f": warning {_first(got.warnings[0])}"
        diff.append(f"outcome: expected {e.outcome}, got {got.outcome}{why}")
    if e.phase is not None and got.phase != e.phase:
        diff.append(f"phase: expected the {e.phase} webhook to deny, got "
                    f"{got.phase or 'no denial'}")
    for rule in e.rule:
        if rule.value not in got.rules:
            diff.append(f"rule: expected a {rule.value} finding, got "
                        f"{', '.join(got.rules) or 'no findings'}")
    for text in e.message_contains:
        if text not in got.message:
            diff.append(f"message: expected it to contain {text!r}, got "
                        f"{_quote(got.message) if got.message else 'no message'}")
    for text in e.warning_contains:
        if not any(text in w for w in got.warnings):
            shown = "; ".join(_quote(w) for w in got.warnings) or "no warnings"
            diff.append(f"warnings: expected one containing {text!r}, got {shown}")
    if e.changes is not None and sorted(e.changes) != sorted(got.changes):
        missing = [c for c in e.changes if c not in got.changes]
        extra = [c for c in got.changes if c not in e.changes]
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"unexpected {', '.join(extra)}"] if extra else []
        diff.append(f"changes: expected [{', '.join(e.changes)}], got "
                    f"[{', '.join(got.changes)}] ({'; '.join(parts)})")
    for p in e.patched:
        if got.patched is None:
            diff.append(f"patched {p.path}: no patched object (the request was denied by "
                        f"the {got.phase} webhook)")
            continue
        at = resolve(got.patched, p.path)
        if p.absent:
            if at is not _MISSING:
                diff.append(f"patched {p.path}: expected absent, got {_json(at)}")
        elif at is _MISSING:
            diff.append(f"patched {p.path}: expected {_json(p.value) if 'value' in p.model_fields_set else 'a value'}, "  # noqa: E501
                        f"got nothing there{_nearest(got.patched, p.path)}")
        elif "value" in p.model_fields_set and at != p.value:
            diff.append(f"patched {p.path}: expected {_json(p.value)}, got {_json(at)}")
    return CaseResult(case.name, _expected(e), got, diff)


def _nearest(doc: Any, pointer: str) -> str:
    """Where the pointer stops matching, to make a wrong index or key easy to spot."""
    parts = pointer[1:].split("/")
    for n in range(len(parts) - 1, 0, -1):
        parent = "/" + "/".join(parts[:n])
        node = resolve(doc, parent)
        if node is not _MISSING:
            if isinstance(node, dict):
                keys = ", ".join(escape(k) for k in list(node)[:8])
                return f" ({parent} has keys: {keys})"
            if isinstance(node, list):
                return f" ({parent} has {len(node)} items)"
            return f" ({parent} is {_json(node)})"
    return ""


def _expected(e: Expect) -> str:
    out: str = e.outcome
    if e.rule:
        out += f" [{', '.join(r.value for r in e.rule)}]"
    return out


def _first(text: str) -> str:
    # The whole first line: the end of a message (its fix, its rule) is what tells two
    # denials apart, so it is never cut.
    line = text.splitlines()[0] if text else ""
    return line + (" (+ more lines)" if "\n" in text.strip() else "")


def _quote(text: str) -> str:
    # The whole first line: a substring that is not there is easiest to spot in full.
    line = text.splitlines()[0] if text else ""
    return repr(line) + (" (+ more lines)" if "\n" in text else "")


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


# -- output -----------------------------------------------------------------------------


def got_label(c: CaseResult) -> str:
    out = c.got.outcome
    if c.got.rules and c.got.outcome != "allowed":
        out += f" [{', '.join(c.got.rules)}]"
    return out


def render_text(results: list[SuiteResult]) -> str:
    lines: list[str] = []
    for s in results:
        if s.error is not None:
            lines.append(f"{s.path}: ERROR, the suite cannot run:")
            lines.extend(f"  {line}" for line in s.error.splitlines())
            lines.append("")
            continue
        lines.append(f"{s.path}: {s.name}, {s.policy}")
        width = min(48, max(len(c.name) for c in s.cases) if s.cases else 4)
        exp_w = max([8, *(len(c.expected) for c in s.cases)])
        got_w = max([3, *(len(got_label(c)) for c in s.cases)])
        lines.append(f"  {'CASE':<{width}}  {'EXPECTED':<{exp_w}}  {'GOT':<{got_w}}  RESULT")
        for c in s.cases:
            name = c.name
            if len(name) > width:  # in full on a line of its own, never cut
                lines.append(f"  {name}")
                name = ""
            lines.append(f"  {name:<{width}}  {c.expected:<{exp_w}}  "
                         f"{got_label(c):<{got_w}}  {'PASS' if c.passed else 'FAIL'}")
            for d in c.differences:
                lines.append(f"      - {d}")
        lines.append("")
    lines.append(summary(results))
    return "\n".join(lines)


def summary(results: list[SuiteResult]) -> str:
    cases = sum(len(s.cases) for s in results)
    failed = sum(s.failed for s in results)
    broken = sum(s.error is not None for s in results)
    text = (f"{len(results)} suite{'s' if len(results) != 1 else ''}, {cases} cases: "
            f"{cases - failed} passed, {failed} failed")
    if broken:
        text += f"; {broken} suite{'s' if broken != 1 else ''} could not run"
    return text


def as_json(results: list[SuiteResult]) -> list[dict[str, Any]]:
    return [{
        "suite": s.path, "name": s.name, "policy": s.policy, "error": s.error,
        "passed": s.error is None and not s.failed,
        "cases": [{
            "name": c.name, "expected": c.expected, "got": c.got.outcome,
            "phase": c.got.phase, "rules": c.got.rules, "tenant": c.got.tenant,
            "message": c.got.message,
            "warnings": c.got.warnings, "changes": c.got.changes, "reserved": c.got.reserved,
            "result": "PASS" if c.passed else "FAIL", "differences": c.differences,
        } for c in s.cases],
    } for s in results]
