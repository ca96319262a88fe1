"""``gpu-webhook manifests --admission-mode``: the native admission policies compiled from
the policy, as objects. What they decide is proven through the real API server
(``tests/e2e/test_e2e_native_equivalence.py``); here: which objects a policy makes, for
which namespaces, in which mode, and that their messages are the webhook's words."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from webhook.admission.native import policies as native
from webhook.engine import messages
from webhook.policy.apiserver import webhooks as manifests
from webhook.policy.load import load_file, load_text

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "policies" / "multi-tenant.yaml"
GPU_WEBHOOK = str(Path(sys.executable).with_name("gpu-webhook"))


def policy(spec: str) -> Any:
    return load_text("apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\n"
                     "metadata: {name: p}\nspec:\n" + spec, "<test>")


def by_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_each_tenant_and_the_other_namespaces_get_policies_and_bindings() -> None:
    objs = by_name(native.render(load_file(str(POLICY))))
    for scope in ("research", "inference", "notebooks", "other-namespaces"):
        assert ("MutatingAdmissionPolicy", f"gpu-webhook.{scope}") in objs
        assert ("MutatingAdmissionPolicyBinding", f"gpu-webhook.{scope}") in objs
    # The notebooks tenant rolls out in warn mode: its findings are warnings.
    warn = objs[("ValidatingAdmissionPolicyBinding", "gpu-webhook.notebooks.warn")]
    assert warn["spec"]["validationActions"] == ["Warn"]
    assert ("ValidatingAdmissionPolicy", "gpu-webhook.notebooks") not in objs
    enforce = objs[("ValidatingAdmissionPolicyBinding", "gpu-webhook.research")]
    assert enforce["spec"]["validationActions"] == ["Deny"]


def test_bindings_select_the_namespaces_the_webhook_resolves_to_each_tenant() -> None:
    objs = by_name(native.render(load_file(str(POLICY)), manifests.Options(
        namespace="gpu-system", exempt_namespaces=("ops",))))

    def selector(scope: str) -> dict[str, Any]:
        sel: dict[str, Any] = objs[("MutatingAdmissionPolicyBinding", f"gpu-webhook.{scope}")][
            "spec"]["matchResources"]["namespaceSelector"]
        return sel

    assert selector("research") == {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In",
        "values": ["research", "research-dev"]}]}
    inference = selector("inference")
    assert inference["matchLabels"] == {"gpu.example.com/tenant": "inference"}
    # A named namespace is its tenant's even where a selector also matches it; the
    # webhook's own namespace, the policy's and the install's exempt ones are never sent.
    left_out = inference["matchExpressions"][0]
    assert left_out["operator"] == "NotIn"
    assert {"research", "research-dev", "notebooks", "kube-system", "gpu-system",
            "gpu-operator", "ops"} <= set(left_out["values"])
    # The namespaces of no tenant: every selector tenant's namespace is left out in CEL
    # (a label selector cannot say "not matched by that one").
    other = objs[("MutatingAdmissionPolicy", "gpu-webhook.other-namespaces")]
    here = next(v for v in other["spec"]["variables"] if v["name"] == "here")
    assert "gpu.example.com/tenant" in here["expression"]
    assert here["expression"].startswith("!(")


def test_a_later_selector_tenant_yields_to_an_earlier_one() -> None:
    p = policy("""
  tenants:
    - name: first
      namespaceSelector: {matchLabels: {team: a}}
    - name: second
      namespaceSelector:
        matchExpressions: [{key: tier, operator: Exists}]
""")
    objs = by_name(native.render(p))
    first = objs[("MutatingAdmissionPolicy", "gpu-webhook.first")]
    second = objs[("MutatingAdmissionPolicy", "gpu-webhook.second")]

    def here(o: dict[str, Any]) -> str:
        return str(next(v["expression"] for v in o["spec"]["variables"] if v["name"] == "here"))

    assert here(first) == "true"
    assert "'team'" in here(second) and here(second).startswith("!(")


def test_route_rules_a_tenant_allows_are_not_compiled() -> None:
    p = policy("""
  tenants:
    - name: open
      namespaces: [lab]
      gpuRoutes: {visibleDevices: allow, privileged: allow, deviceHostPaths: allow}
""")
    objs = by_name(native.render(p))
    mutation = objs[("MutatingAdmissionPolicy", "gpu-webhook.open")]["spec"]["mutations"][0]
    assert "NVIDIA_VISIBLE_DEVICES" not in mutation["jsonPatch"]["expression"]
    vap = objs[("ValidatingAdmissionPolicy", "gpu-webhook.open")]
    names = {v["name"] for v in vap["spec"]["variables"]}
    assert "privileged_on_gpu_nodes" not in names and "device_host_paths" not in names
    assert "gpu_whole_number" in names


def test_pods_that_need_the_webhooks_lookups_are_left_to_it() -> None:
    objs = native.render(load_file(str(POLICY)))
    for o in objs:
        if o["kind"].endswith("AdmissionPolicy"):
            conditions = {c["name"]: c["expression"] for c in o["spec"]["matchConditions"]}
            assert "resourceClaims" in conditions["no-dra-claims"]
            # The policy's exempt service account is never touched, as by the webhook.
            assert "gpu-operator:nvidia-device-plugin" in conditions["not-exempt"]


@pytest.mark.parametrize("mode", ["fallback", "native"])
def test_routes_webhooks_fail_open_beside_the_native_policies(mode: str) -> None:
    configs = manifests.render(load_file(str(POLICY)), manifests.Options(
        admission_mode=mode))  # type: ignore[arg-type]
    mutating = configs[0]["webhooks"]
    routes = [h for h in mutating if h["name"].startswith("routes")]
    assert routes and all(h["failurePolicy"] == "Ignore" for h in routes)
    gpu = next(h for h in mutating if h["name"].startswith("mutate."))
    assert gpu["failurePolicy"] == "Fail"
    narrowed = [h for h in routes
                if any(c["name"] == "pods-needing-state" for c in h["matchConditions"])]
    assert bool(narrowed) == (mode == "native")
    # The install records the mode, so the leader renders what was installed.
    assert manifests.options_of(configs[0]).admission_mode == mode


def test_the_webhook_mode_renders_what_it_always_did() -> None:
    configs = manifests.render(load_file(str(POLICY)))
    routes = [h for h in configs[0]["webhooks"] if h["name"].startswith("routes")]
    assert all(h["failurePolicy"] == "Fail" for h in routes)
    assert "admissionMode" not in configs[0]["metadata"]["annotations"][
        manifests.INSTALL_ANNOTATION]


def test_a_tenant_default_priority_class_keeps_every_pod_sent_in_native_mode() -> None:
    p = policy("""
  tenants:
    - name: t
      namespaces: [t]
      priority: {defaultClass: low, allowedClasses: [low]}
""")
    configs = manifests.render(p, manifests.Options(admission_mode="native"))
    routes = [h for h in configs[0]["webhooks"] if h["name"].startswith("routes")]
    assert routes and not any(c["name"] == "pods-needing-state"
                              for h in routes for c in h["matchConditions"])


def test_native_objects_validate_against_the_kubernetes_schema() -> None:
    for obj in native.render(load_file(str(POLICY))):
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize(("text", "args"), [
    (lambda r, t: messages.resource_not_allowed(r, t, ["b", "a"]),
     ("x.com/gpu", "it's \"t\"")),
    (messages.privileged, ("securityContext.privileged: true", "it asks for GPUs")),
    (messages.device_host_path, ("dev", "/dev", "it tolerates every taint")),
    (messages.bad_quantity, ("nvidia.com/gpu", "limit", "'1e16' is far more")),
])
def test_messages_are_the_webhooks_words(text: Any, args: tuple[str, ...]) -> None:
    import cel

    names = [f"a{i}" for i in range(len(args))]
    expr = native.words(text, *names)
    assert cel.evaluate(expr, dict(zip(names, args, strict=True))) == text(*args)


def test_cli_prints_the_native_policies_only_when_asked() -> None:
    def kinds(*args: str) -> list[str]:
        done = subprocess.run([GPU_WEBHOOK, "manifests", "--policy", str(POLICY), *args],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        return [d["kind"] for d in yaml.safe_load_all(done.stdout) if d]

    assert kinds() == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    both = kinds("--admission-mode", "fallback")
    assert both[:2] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    assert {"MutatingAdmissionPolicy", "ValidatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding"} == set(both[2:])


def test_docs_say_where_every_rule_runs() -> None:
    """docs/security.md's section names every compiled rule and every one kept in the
    webhook, so the table cannot fall behind the compiler."""
    text = (ROOT / "docs" / "security.md").read_text()
    section = text.split("## The rules that run in the API server itself")[1].split("\n## ")[0]
    missing = [r for r in [*native.COMPILED, *native.KEPT] if f"`{r}`" not in section
               and r not in section]
    assert not missing, f"docs/security.md does not say where these run: {missing}"


def test_drift_of_the_native_objects_names_what_is_missing_extra_or_changed() -> None:
    from webhook.policy.apiserver.drift import compare_native

    want = native.render(load_file(str(POLICY)))
    # What the API server holds: the same, with the fields it fills in by default.
    live = yaml.safe_load(yaml.safe_dump(want))
    for o in live:
        o["metadata"]["resourceVersion"] = "7"
        if "Binding" not in o["kind"]:
            o["spec"]["matchConstraints"]["matchPolicy"] = "Equivalent"
            o["spec"]["matchConstraints"]["namespaceSelector"] = {}
    assert not compare_native("gpu-webhook", want, live)

    live = [o for o in live if o["metadata"]["name"] != "gpu-webhook.inference"]
    extra = {**live[0], "metadata": {**live[0]["metadata"], "name": "gpu-webhook.gone"}}
    live[0] = {**live[0], "spec": {**live[0]["spec"], "failurePolicy": "Ignore"}}
    drift = compare_native("gpu-webhook", want, [*live, extra])
    assert "MutatingAdmissionPolicy/gpu-webhook.inference" in drift.missing
    assert drift.extra == (f"{extra['kind']}/gpu-webhook.gone",)
    assert drift.changed == ((f"{live[0]['kind']}/{live[0]['metadata']['name']}",
                              ("failurePolicy",)),)
    assert drift.describe().startswith("admission policies gpu-webhook.*: missing ")


def test_the_leader_wants_native_objects_only_in_the_modes_that_use_them() -> None:
    p = load_file(str(POLICY))
    for mode, some in (("webhook", False), ("fallback", True), ("native", True)):
        mutating = manifests.render(p, manifests.Options(
            admission_mode=mode))[0]  # type: ignore[arg-type]
        assert bool(native.wanted(p, mutating)) is some
    assert native.wanted(p, None) == []


def test_failure_policy_leaves_the_routes_open_beside_the_native_policies() -> None:
    from webhook.policy.apiserver.drift import failure_policy_ops

    for mode, routes_set in (("webhook", True), ("fallback", False)):
        mutating = manifests.render(load_file(str(POLICY)), manifests.Options(
            admission_mode=mode, mutating_failure_policy="Ignore"))[0]  # type: ignore[arg-type]
        _, changed = failure_policy_ops(mutating, "Fail")
        assert any(n.startswith("routes") for n in changed) is routes_set, changed
        assert "mutate.gpu-webhook.dev" in changed


def test_the_documented_static_install_writes_what_the_api_server_loads(
        tmp_path: Path) -> None:
    """docs/security.md's command for manifest-based admission control, run as written
    (the policy and the directory swapped for the test's); the e2e test starts an API
    server on such files (tests/e2e/test_e2e_native_static.py)."""
    import re
    import shlex

    from webhook.admission.native import static

    text = (ROOT / "docs" / "security.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)\n```", text, flags=re.S)
                 if "--static-dir" in b)
    line = next(x for x in block.replace("\\\n", " ").splitlines()
                if x.startswith("gpu-webhook"))
    words = [str(POLICY) if w == "policy.yaml" else str(tmp_path / "admission")
             if w == "./admission" else w for w in shlex.split(line)]
    done = subprocess.run([GPU_WEBHOOK, *words[1:]], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "--feature-gates=ManifestBasedAdmissionControlConfig=true" in block
    config = yaml.safe_load((tmp_path / "admission" / static.CONFIGURATION).read_text())
    dirs = {p["name"]: p["configuration"]["staticManifestsDir"] for p in config["plugins"]}
    assert dirs["MutatingAdmissionPolicy"] == "/etc/kubernetes/gpu-webhook/mutating-policies"
    assert set(dirs) == {"MutatingAdmissionWebhook", "ValidatingAdmissionWebhook",
                         "MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"}
    for _plugin, directory, kinds, _ in static.PLUGINS:
        docs = list(yaml.safe_load_all(
            (tmp_path / "admission" / directory / "gpu-webhook.yaml").read_text()))
        assert docs and all(d["kind"] in kinds for d in docs)
        assert all(d["metadata"]["name"].endswith(".static.k8s.io") for d in docs)
        assert all(d["spec"]["policyName"].endswith(".static.k8s.io")
                   for d in docs if "Binding" in d["kind"])


MIXED = """
  nonGpuPodsToleratingGpuTaints: strip
  tenants:
    - name: plain
      namespaces: [plain-a, plain-b]
      allowedResources: [nvidia.com/gpu, nvidia.com/mig-1g.10gb]
      maxGpusPerPod: 4
      quota: {gpus: 8}
    - name: pinned
      namespaces: [pinned]
      topology: {nodeLabel: rack, values: [a]}
    - name: waiting
      namespaces: [waiting]
      overQuota: wait
      quota: {gpus: 2}
    - name: selected
      namespaceSelector: {matchLabels: {team: x}}
"""


def test_only_tenants_the_native_policies_mutate_whole_skip_the_mutating_call() -> None:
    from webhook.policy.apiserver.rules import natively_mutated

    p = policy(MIXED)
    assert natively_mutated(p) == ["plain-a", "plain-b"]
    hook = next(h for h in manifests.render(p, manifests.Options(admission_mode="native"))[0][
        "webhooks"] if h["name"] == "mutate.gpu-webhook.dev")
    condition = next(c for c in hook["matchConditions"]
                     if c["name"] == "pods-needing-the-webhook")
    assert "['plain-a', 'plain-b']" in condition["expression"]
    assert "resourceClaims" in condition["expression"]
    fallback = next(h for h in manifests.render(p, manifests.Options(
        admission_mode="fallback"))[0]["webhooks"] if h["name"] == "mutate.gpu-webhook.dev")
    assert all(c["name"] != "pods-needing-the-webhook" for c in fallback["matchConditions"])
    # Products named in the policy: a pod's own affinity offering several is narrowed.
    assert natively_mutated(policy(MIXED.replace(
        "  tenants:", "  products: {aliases: {a100: NVIDIA-A100-SXM4-80GB}}\n  tenants:"))) == []


def test_the_webhook_changes_nothing_more_in_those_namespaces() -> None:
    """Pods drawn as developers write them, through the mutating webhook in a namespace
    the native policies mutate whole: every change it makes is one they make too."""
    import orjson
    from fuzz.fuzzkit import pod_templates
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from webhook.engine.mutate import mutate
    from webhook.k8s.review import parse_review, request_review
    from webhook.policy.compiled import compile_policy

    compiled = compile_policy(policy(MIXED))
    made_natively = {c for c in native.COMPILED if not c.startswith(("allowed", "privileged",
                                                                      "device", "non-gpu",
                                                                      "gpu-whole"))}

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(pod_templates(), st.sampled_from(["plain-a", "plain-b"]))
    def only_native_changes(template: dict[str, Any], ns: str) -> None:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {**template["metadata"], "namespace": ns}, "spec": template["spec"]}
        req = parse_review(orjson.dumps(request_review(pod, uid="u")))
        decision = mutate(req, compiled)
        assert set(decision.mutations) <= made_natively, decision.mutations

    only_native_changes()


def test_manifests_says_which_rules_still_need_the_webhook() -> None:
    done = subprocess.run([GPU_WEBHOOK, "manifests", "--policy", str(POLICY),
                           "--admission-mode", "fallback"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    said = done.stderr.splitlines()
    assert ("gpu-webhook manifests: stays in the webhook: allowed-products (research, "
            "inference, notebooks): a pod that names a product itself (request label or "
            "annotation, nodeSelector, its own node affinity): its choice weighed against "
            "the allowed ones, not compiled yet; and every GPU pod where spot placement or "
            "GPU capabilities add terms" in said), said
    assert any(line.startswith("gpu-webhook manifests: stays in the webhook: quota "
                               "(research, inference, notebooks): usage across pods")
               for line in said), said
    assert not any("tenant-required" in line for line in said), said  # compiled
    # Nothing of it in the manifests themselves, and nothing said in mode webhook.
    assert "stays in the webhook" not in done.stdout
    plain = subprocess.run([GPU_WEBHOOK, "manifests", "--policy", str(POLICY)],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "stays in the webhook" not in plain.stderr
