"""The native admission policies and the webhook, proven equal through the real
kube-apiserver.

``gpu-webhook manifests --admission-mode fallback`` prints the webhook configurations and
the policy's stateless rules compiled into MutatingAdmissionPolicies and
ValidatingAdmissionPolicies (``webhook.admission.native.policies``). Here each namespace of
``policies/native.yaml`` exists twice: ``eq-<scope>-native``, served by the admission
policies alone, and ``eq-<scope>-webhook``, served by the webhook alone. Hypothesis draws
pods (the suite's GPU resources and tolerations, with the routes to a GPU: the NVIDIA
runtime's variable, privilege, ``/dev`` mounts) and each is created as a dry run in both:
the verdict, the stored object and the facts of the message (each finding's words,
numbers and tag) must be the same, and so must the warnings of a tenant in warn mode.

A denial that core validation makes (a fractional count, a request that differs from its
limit) is compared by verdict only: core validation runs before any validating policy, so
native mode answers with the API server's words there (``KEPT`` says so).

A policy compiled wrong (one allowed resource too many) must be caught: hypothesis finds
a pod on which the two disagree.

The CI run draws ``NATIVE_EXAMPLES`` pods (400, about 5 s); the marked slow run 2,000.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import core_client, deployed, gpu_webhook, wait_until
from fuzz.fuzzkit import resources, tolerations
from hypothesis import HealthCheck, event, find, given, settings
from hypothesis import strategies as st
from kubernetes import client

pytestmark = pytest.mark.e2e

POLICY = Path(__file__).parent / "policies" / "native.yaml"
NAME = "gpu-webhook-eq"
EXECUTOR = "gpu-webhook.test/executor"
EXECUTORS = ("native", "webhook")
# Each scope of the policy: the labels its namespaces carry (alpha is named by the policy).
SCOPES: dict[str, dict[str, str]] = {
    "alpha": {},
    "beta": {"gpu.example.com/tenant": "beta", "gpu.example.com/tier": "gold"},
    "gamma": {"gpu.example.com/tier": "silver"},
    "pinned": {},
    "either": {},
    "free": {},
}
# Rules whose findings the validating policies report: the warnings compared are theirs.
# The webhook also tells of the changes it made (``NVIDIA_VISIBLE_DEVICES`` voided or
# removed), which no admission policy can; no tenant of warn mode refuses the variable.
VALIDATED = ("allowed-resources", "privileged-on-gpu-nodes", "device-host-paths",
             "non-gpu-tolerations")
EXAMPLES = int(os.environ.get("NATIVE_EXAMPLES", "400"))
# The compiled rules that refuse a pod (in enforce mode: tenants alpha and beta).
RULES_REFUSING = ("allowed-resources", "gpu-whole-number", "privileged-on-gpu-nodes",
                  "device-host-paths", "gpu-visible-devices", "max-gpus-per-container",
                  "tenant-required")


def namespace(scope: str, executor: str) -> str:
    return f"eq-{scope}-{executor}"


# ------------------------------------------------------------------ the pods drawn

visible = st.sampled_from([
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""},
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": " None "},
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"},
    {"name": "NVIDIA_VISIBLE_DEVICES",
     "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "HOME", "value": "/root"},
])
security = st.sampled_from([
    None, {"privileged": True}, {"privileged": False},
    {"capabilities": {"add": ["SYS_ADMIN"]}}, {"capabilities": {"add": ["cap_sys_admin"]}},
    {"capabilities": {"add": ["NET_ADMIN", "ALL"]}}, {"capabilities": {"add": ["NET_ADMIN"]}},
])
volumes = st.sampled_from([
    {"name": "dev", "hostPath": {"path": "/dev"}},
    {"name": "gpu0", "hostPath": {"path": "/dev/nvidia0"}},
    {"name": "root", "hostPath": {"path": "/"}},
    {"name": "devdir", "hostPath": {"path": "//dev/./"}},
    {"name": "data", "hostPath": {"path": "/data/dev"}},
    {"name": "scratch", "emptyDir": {}},
])
more_tolerations = st.one_of(tolerations, st.sampled_from([
    {"key": "gpu.example.com/dedicated", "operator": "Equal", "value": "ml"},
    {"key": "gpu.example.com/dedicated", "operator": "Exists", "effect": "NoExecute"},
    {"key": "gpu.example.com/dedicated", "operator": "Equal", "value": "web"},
]))


# Where a pod may run, naming no product or topology label (a pod that names them is
# left to the webhook, which weighs its own choice: KEPT): none, a nodeSelector, required
# terms of other labels (one, two ORed, one of node fields only), preferred terms.
_ARCH = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
_ZONE = {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["z9"]}
_NAME = {"key": "metadata.name", "operator": "In", "values": ["node-1"]}


def _required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


PLACEMENTS: list[dict[str, Any]] = [
    {},
    {"nodeSelector": {"kubernetes.io/os": "linux"}},
    _required({"matchExpressions": [_ARCH]}),
    _required({"matchExpressions": [_ARCH]}, {"matchExpressions": [_ZONE, _ARCH]}),
    _required({"matchFields": [_NAME]}),
    {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [_ZONE]}}]}}},
    {"affinity": {"podAffinity": {}}},
]
placements = st.sampled_from([{}, {}, *PLACEMENTS])  # most pods say nothing of it


@st.composite
def containers(draw: st.DrawFn, prefix: str, least: int) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(least, 2))):
        c: dict[str, Any] = {"name": f"{prefix}-{i}", "image": "cuda"}
        res = draw(resources())
        if res:
            c["resources"] = res
        env = draw(st.lists(visible, max_size=2))
        if env:
            c["env"] = env
        sc = draw(security)
        if sc is not None:
            c["securityContext"] = sc
        if prefix == "init" and draw(st.booleans()):
            c["restartPolicy"] = "Always"
        out.append(c)
    return out


@st.composite
def pods(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """(scope, pod): a pod for the namespaces of one scope."""
    spec: dict[str, Any] = {"containers": draw(containers("app", 1))}
    init = draw(containers("init", 0))
    if init:
        spec["initContainers"] = init
    tols = draw(st.lists(more_tolerations, max_size=3))
    if tols:
        spec["tolerations"] = tols
    vols = draw(st.lists(volumes, max_size=2, unique_by=lambda v: str(v["name"])))
    if vols:
        spec["volumes"] = vols
    spec.update(draw(placements))
    meta: dict[str, Any] = {"name": "p"}
    if draw(st.integers(0, 5)) == 0:
        meta["annotations"] = {"gpu-webhook.dev/mutated": draw(st.sampled_from(
            ["gpu-tolerations", "", "by-hand,gpu-requests"]))}
    return draw(st.sampled_from(list(SCOPES))), {"apiVersion": "v1", "kind": "Pod",
                                                  "metadata": meta, "spec": spec}


# ------------------------------------------------------------------ one dry run each

@dataclass(frozen=True)
class Outcome:
    allowed: bool
    stored: dict[str, Any] | None
    message: str
    warnings: frozenset[str]


def _warnings(headers: Any, ns: str) -> frozenset[str]:
    found: set[str] = set()
    for raw in headers.getlist("Warning") if headers is not None else []:
        text = re.sub(r'^299 - "(.*)"$', r"\1", raw).replace('\\"', '"')
        text = re.sub(r"^Validation failed for ValidatingAdmissionPolicy '[^']*' with "
                      r"binding '[^']*': ", "", text)
        found.update(f for f in findings(text, ns) if _rule(f) in VALIDATED)
    return frozenset(found)


def findings(message: str, ns: str) -> list[str]:
    """The findings of a denial or warning, the namespace written as ``NS``: the webhook
    joins them by line, an admission policy by a space (its message is one line)."""
    text = re.sub(r"^.*?denied (the )?request: ", "", message, flags=re.S)
    return [f.replace(ns, "NS") for f in re.split(r"(?<=\])\s+(?=pod )", text.strip()) if f]


def _rule(finding: str) -> str:
    m = re.search(r"\[rule ([^,\]]+)", finding)
    return m.group(1) if m else ""


def _stored(obj: dict[str, Any], ns: str) -> dict[str, Any]:
    meta = obj["metadata"]
    for k in ("uid", "creationTimestamp", "namespace", "resourceVersion", "managedFields"):
        meta.pop(k, None)
    stored: dict[str, Any] = json.loads(json.dumps(obj).replace(ns, "NS"))
    return stored


def create(api: client.CoreV1Api, ns: str, pod: dict[str, Any]) -> Outcome:
    """A dry-run create of ``pod`` in ``ns``, the JSON sent as drawn (the client's typed
    call would refuse a quantity written as a number before the API server sees it)."""
    resp = api.api_client.rest_client.request(
        "POST", f"{api.api_client.configuration.host}/api/v1/namespaces/{ns}/pods?dryRun=All",
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        body=pod)
    body = json.loads(resp.read())
    warnings = _warnings(resp.headers, ns)
    if 200 <= resp.status < 300:
        return Outcome(True, _stored(body, ns), "", warnings)
    return Outcome(False, None, str(body.get("message", body)), warnings)


def compare(api: client.CoreV1Api, scope: str, pod: dict[str, Any],
            seen: Counter[str] | None = None) -> str:
    """Assert that both executors give ``pod`` the same outcome; which (for statistics),
    counting in ``seen`` the rules of every finding both gave (``rule <name>``)."""
    native = create(api, namespace(scope, "native"), pod)
    hook = create(api, namespace(scope, "webhook"), pod)
    shown = f"pod in scope {scope}:\n{yaml.safe_dump(pod)}"
    assert native.allowed == hook.allowed, (
        f"native {'allowed' if native.allowed else 'denied'}, webhook "
        f"{'allowed' if hook.allowed else 'denied'}: {native.message or hook.message}\n{shown}")
    ours = [namespace(scope, e) for e in EXECUTORS]
    native_said = findings(native.message, ours[0])
    verdict = f"{scope}: " + ("allowed" if native.allowed else "refused by core validation"
                              if not all(_rule(f) for f in native_said) else "refused by us")
    if not native.allowed and not all(_rule(f) for f in native_said):
        # Core validation's denial, in its words, not ours (the module docstring); the
        # webhook's mutating warnings came before it, the validating policies' never do.
        return verdict
    assert native.warnings == hook.warnings, (
        f"warnings differ:\n native {sorted(native.warnings)}\n webhook "
        f"{sorted(hook.warnings)}\n{shown}")
    if native.allowed:
        if seen is not None and "nvidia.com/gpu.product" in json.dumps(native.stored):
            seen["pinned"] += 1  # a GPU pod given its tenant's product affinity
        assert native.stored == hook.stored, (
            f"stored objects differ:\n native {json.dumps(native.stored, sort_keys=True)}\n"
            f" webhook {json.dumps(hook.stored, sort_keys=True)}\n{shown}")
        return verdict
    hook_said = findings(hook.message, ours[1])
    assert sorted(native_said) == sorted(hook_said), (
        f"messages differ:\n native {native_said}\n webhook {hook_said}\n{shown}")
    if seen is not None:
        seen.update(f"rule {_rule(f)}" for f in native_said)
    return verdict


# ------------------------------------------------------------------ the installation

def _narrowed(docs: list[dict[str, Any]], executor: str) -> list[dict[str, Any]]:
    """The objects, each namespaceSelector also asking for ``executor``'s namespaces."""
    only = {"key": EXECUTOR, "operator": "In", "values": [executor]}
    for doc in docs:
        if doc["kind"].endswith("WebhookConfiguration"):
            for hook in doc["webhooks"]:
                if "namespaceSelector" in hook:
                    hook["namespaceSelector"].setdefault("matchExpressions", []).append(only)
        elif doc["kind"].endswith("Binding"):
            sel = doc["spec"]["matchResources"]["namespaceSelector"]
            sel.setdefault("matchExpressions", []).append(dict(only))
    return docs


@dataclass
class Executors:
    cp: ControlPlane
    api: client.CoreV1Api
    native: list[dict[str, Any]]

    def apply(self, docs: list[dict[str, Any]]) -> None:
        self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    def settle(self) -> None:
        """Wait until the API server runs what was applied (its policy and webhook
        caches follow by watch): probes of every rule agree in every scope."""
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"}, "spec": {
            "containers": [
                {"name": "gpu", "image": "cuda", "resources": {"limits": {
                    "nvidia.com/gpu.shared": "1"}}, "env": [
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
                {"name": "root", "image": "cuda", "securityContext": {"privileged": True}}],
            "volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}]}}

        last: list[str] = []

        def agree() -> bool:
            try:
                for scope in SCOPES:
                    compare(self.api, scope, probe)
                    compare(self.api, scope, {**probe, "spec": {
                        "containers": [{"name": "c", "image": "cuda"}],
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}})
            except AssertionError as exc:
                last[:] = [str(exc)]
                return False
            return True

        try:
            wait_until("the native policies and the webhook to be in effect", agree,
                       timeout=60, every=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the last difference: {last[0]}") from None


@pytest.fixture(scope="module")
def executors(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Executors]:
    cp = control_plane
    for scope, labels in SCOPES.items():
        for executor in EXECUTORS:
            cp.kubectl("apply", "-f", "-", input=yaml.safe_dump({
                "apiVersion": "v1", "kind": "Namespace", "metadata": {
                    "name": namespace(scope, executor),
                    "labels": {**labels, EXECUTOR: executor}}}))
    workdir = tmp_path_factory.mktemp("native-equivalence")
    with deployed(cp, workdir, policy=POLICY) as d, core_client(cp) as api:
        def render(mode: str) -> list[dict[str, Any]]:
            out = gpu_webhook("manifests", "--policy", str(POLICY), "--name", NAME,
                              "--url", d.url, "--ca-file", str(d.ca_file),
                              "--admission-mode", mode).stdout
            return [doc for doc in yaml.safe_load_all(out) if doc]

        hooks = _narrowed(render("webhook"), "webhook")
        native = _narrowed([doc for doc in render("fallback")
                            if "AdmissionPolicy" in doc["kind"]], "native")
        ex = Executors(cp, api, native)
        ex.apply(hooks + native)
        try:
            ex.settle()
            yield ex
        finally:
            for doc in hooks + native:
                cp.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"],
                           "--ignore-not-found", "--wait=false")


def test_the_native_policies_and_the_webhook_decide_alike(executors: Executors) -> None:
    """Derandomized (the same pods each run), and the pods drawn must reach every
    compiled rule's refusal in both executors: a generator that stopped reaching one
    would prove nothing about it."""
    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(pods())
    def same(drawn: tuple[str, dict[str, Any]]) -> None:
        verdict = compare(executors.api, *drawn, seen=seen)
        seen[verdict] += 1
        event(verdict)

    same()
    for scope in SCOPES:
        assert seen[f"{scope}: allowed"], f"no pod of scope {scope} allowed: {seen}"
    assert seen["pinned"], f"no GPU pod was pinned to its tenant's product: {seen}"
    reached = {rule for rule in RULES_REFUSING if seen[f"rule {rule}"]}
    assert reached == set(RULES_REFUSING), (
        f"the pods drawn never reached {sorted(set(RULES_REFUSING) - reached)}: {seen}")


def test_gpu_pods_are_pinned_alike_wherever_they_may_run(executors: Executors) -> None:
    """Every placement the fuzz draws, on a GPU pod (a whole GPU, and MIG slices beside a
    sidecar without GPUs) in each tenant the native policies pin (pinned: its default
    product and racks; either: its two products): the same stored object, the tenant's
    requirements ANDed into every required term. The fuzz reaches these pods rarely."""
    pinned = 0
    for scope in ("pinned", "either"):
        for where in PLACEMENTS:
            for containers_ in (
                    [{"name": "train", "image": "cuda",
                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                    [{"name": "train", "image": "cuda",
                      "resources": {"limits": {"nvidia.com/mig-1g.10gb": "2"}}},
                     {"name": "log", "image": "busybox"}]):
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                       "spec": {"containers": containers_, **json.loads(json.dumps(where))}}
                seen: Counter[str] = Counter()
                assert compare(executors.api, scope, pod, seen) == f"{scope}: allowed"
                pinned += seen["pinned"]
    assert pinned == 2 * 2 * len(PLACEMENTS)


@pytest.mark.slow
def test_the_native_policies_and_the_webhook_decide_alike_long(executors: Executors) -> None:
    @settings(max_examples=2000, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(pods())
    def same(drawn: tuple[str, dict[str, Any]]) -> None:
        event(compare(executors.api, *drawn))

    same()


def test_a_rule_compiled_wrong_is_found(executors: Executors) -> None:
    """Tenant alpha's allowed resources compiled with one name too many: the fuzzing
    finds a pod the native policies admit and the webhook refuses."""
    allowed = "['nvidia.com/gpu', 'nvidia.com/mig-1g.10gb']"
    wrong = json.loads(json.dumps(executors.native).replace(
        allowed, "['nvidia.com/gpu', 'nvidia.com/gpu.shared', 'nvidia.com/mig-1g.10gb']"))
    assert wrong != executors.native, "the compiled allowed list is no longer written so"
    shared = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {
            "nvidia.com/gpu.shared": "1"}}}]}}

    def differs(drawn: tuple[str, dict[str, Any]]) -> bool:
        try:
            compare(executors.api, *drawn)
        except AssertionError:
            return True
        return False

    executors.apply(wrong)
    try:
        wait_until("the wrong policy to be in effect", lambda: differs(("alpha", shared)),
                   timeout=60, every=0.5)
        found = find(pods(), differs, settings=settings(
            max_examples=400, deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))
        scope, _pod = found
        assert scope == "alpha", f"a difference outside the wrong rule's tenant: {found}"
    finally:
        executors.apply(executors.native)
        executors.settle()


def _pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer"},
            "spec": {"containers": list(containers), **spec}}


# One pod per validating rule the native policies compile, in the scope whose policy has
# it: (golden file, scope, pod).
GOLDEN_CASES = {
    "allowed-resources": ("alpha", _pod({"name": "main", "image": "cuda", "resources": {
        "limits": {"nvidia.com/gpu.shared": "1"}}})),
    "gpu-whole-number": ("alpha", _pod({"name": "main", "image": "cuda", "resources": {
        "limits": {"nvidia.com/gpu": "1e17"}}})),
    "privileged-on-gpu-nodes": ("alpha", _pod({"name": "main", "image": "cuda", "resources": {
        "limits": {"nvidia.com/gpu": "1"}}, "securityContext": {"privileged": True}})),
    "device-host-paths": ("alpha", _pod(
        {"name": "main", "image": "cuda"}, tolerations=[{"operator": "Exists"}],
        volumes=[{"name": "dev", "hostPath": {"path": "/dev"}}])),
    "gpu-visible-devices": ("beta", _pod({"name": "main", "image": "cuda", "env": [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]})),
    "max-gpus-per-container": ("alpha", _pod({"name": "main", "image": "cuda", "resources": {
        "limits": {"nvidia.com/mig-1g.10gb": "24"}}})),
    "tenant-required": ("free", _pod({"name": "main", "image": "cuda", "resources": {
        "limits": {"nvidia.com/gpu": "1"}}})),
}


@pytest.mark.parametrize("rule", sorted(GOLDEN_CASES))
def test_both_executors_give_the_golden_message(executors: Executors, rule: str,
                                                golden: Any) -> None:
    """The same words from the API server's policy and from the webhook, pinned in
    ``tests/golden/native/<rule>.txt`` (the namespace written as NS)."""
    scope, pod = GOLDEN_CASES[rule]
    said = {}
    for executor in EXECUTORS:
        ns = namespace(scope, executor)
        out = create(executors.api, ns, pod)
        assert not out.allowed, f"{executor} allowed it"
        said[executor] = findings(out.message, ns)
    assert said["native"] == said["webhook"]
    assert all(f"[rule {rule}," in f for f in said["native"])
    golden(f"native/{rule}.txt", "\n".join(said["native"]))
