"""``gpu-webhook manifests``: the webhook configurations it renders are valid Kubernetes
objects, and their CEL matchConditions send exactly the requests the policy acts on.

The expressions are evaluated here with a CEL implementation (``common-expression-language``)
on realistic objects; the e2e tests install the same configurations into a real
kube-apiserver.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from webhook.k8s.workloads import CRD_KINDS
from webhook.policy.apiserver import webhooks as manifests
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_file, load_text

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "policies" / "multi-tenant.yaml"
GPU_WEBHOOK = str(Path(sys.executable).with_name("gpu-webhook"))
# The oldest Kubernetes with matchConditions GA, and the newest schema at hand.
VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


def policy(spec: str = "") -> Any:
    return load_text("apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicy\n"
                     "metadata: {name: p}\nspec:\n" + spec, "<test>")


def render(**options: Any) -> list[dict[str, Any]]:
    return manifests.render(load_file(str(POLICY)), manifests.Options(**options))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPU_WEBHOOK, "manifests", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("options", [{}, {"url": "https://127.0.0.1:8443", "ca_bundle": b"x"}])
def test_rendered_objects_validate_against_the_kubernetes_schema(version, options):
    for obj in render(**options):
        kubernetes_validate.validate(obj, version, strict=True)


def test_cli_prints_both_configurations_as_yaml(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    done = cli("--policy", str(POLICY), "--ca-file", str(ca), "--namespace", "gpu-system",
               "--timeout-seconds", "3", "--validating-failure-policy", "Ignore")
    assert done.returncode == 0, done.stderr
    docs = list(yaml.safe_load_all(done.stdout))
    assert [d["kind"] for d in docs] == ["MutatingWebhookConfiguration",
                                         "ValidatingWebhookConfiguration"]
    mutating, validating = docs[0]["webhooks"][0], docs[1]["webhooks"][0]
    assert mutating["clientConfig"]["service"] == {
        "name": "gpu-webhook", "namespace": "gpu-system", "path": "/mutate", "port": 443}
    assert validating["clientConfig"]["service"]["path"] == "/validate"
    assert base64.b64decode(mutating["clientConfig"]["caBundle"]) == ca.read_bytes()
    assert (mutating["failurePolicy"], validating["failurePolicy"]) == ("Fail", "Ignore")
    assert mutating["timeoutSeconds"] == validating["timeoutSeconds"] == 3
    assert mutating["reinvocationPolicy"] == "IfNeeded"
    assert "reinvocationPolicy" not in validating
    for hook in (mutating, validating):
        assert hook["sideEffects"] == "NoneOnDryRun"
        assert hook["admissionReviewVersions"] == ["v1"]
        # Never the webhook's own namespace, kube-system or the policy's exempt ones.
        assert hook["namespaceSelector"]["matchExpressions"] == [{
            "key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["gpu-operator", "gpu-system", "kube-system"]}]


def test_rules_cover_pods_on_create_and_workloads_on_create_and_update():
    hook = render()[0]["webhooks"][0]
    got = {(g, r): tuple(rule["operations"]) for rule in hook["rules"]
           for g in rule["apiGroups"] for r in rule["resources"]}
    assert got == {
        ("", "pods"): ("CREATE",),
        **{("apps", r): ("CREATE", "UPDATE")
           for r in ("deployments", "replicasets", "statefulsets", "daemonsets")},
        **{("batch", r): ("CREATE", "UPDATE") for r in ("jobs", "cronjobs")},
        ("", "replicationcontrollers"): ("CREATE", "UPDATE"),
        **{(b.group, b.resource): ("CREATE", "UPDATE") for b in CRD_KINDS},
    }
    versions = {(g, r): tuple(rule["apiVersions"]) for rule in hook["rules"]
                for g in rule["apiGroups"] for r in rule["resources"]}
    assert versions[("kubeflow.org", "mpijobs")] == ("v1", "v2beta1")
    assert versions[("batch.volcano.sh", "jobs")] == ("v1alpha1",)


@pytest.mark.parametrize("failure", ["Fail", "Ignore"])
def test_scale_subresources_go_to_a_validating_webhook_of_their_own(failure):
    mutating, validating = render(validating_failure_policy=failure)
    main, scale = validating["webhooks"][:2]
    assert scale["name"] == "scale.gpu-webhook.dev"
    assert scale["rules"] == [{
        "apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["UPDATE"],
        "resources": ["deployments/scale", "statefulsets/scale", "replicasets/scale"],
        "scope": "Namespaced"}]
    # Sent scale-ups of workloads without GPUs too: a webhook that is down must not block
    # them, whatever the main webhook's choice (quota holds: pods are checked one by one).
    assert (main["failurePolicy"], scale["failurePolicy"]) == (failure, "Ignore")
    assert scale["sideEffects"] == "None"
    assert scale["clientConfig"] == main["clientConfig"]
    for key in ("namespaceSelector", "matchPolicy", "timeoutSeconds",
                "admissionReviewVersions"):
        assert scale[key] == main[key], key
    # Nothing to mutate in a Scale: the mutating webhook never sees one.
    assert [h["name"] for h in mutating["webhooks"] if "routes" not in h["name"]] == [
        "mutate.gpu-webhook.dev", "claims.mutate.gpu-webhook.dev"]
    for hook in (*mutating["webhooks"], main):
        # (The routes webhooks' one subresource is pods/ephemeralcontainers.)
        assert not any("/" in r and r != "pods/ephemeralcontainers"
                       for rule in hook["rules"] for r in rule["resources"])


@pytest.mark.parametrize("failure", ["Fail", "Ignore"])
def test_resizes_of_gpu_pods_go_to_a_webhook_where_cpu_per_gpu_is_capped(failure):
    # No resourcesPerGpu in the policy: a resize has nothing to be held to, and no
    # webhook is registered for it (no call, whatever the pod).
    assert not [h for o in render() for h in o["webhooks"] if "resize" in h["name"]]
    holding = load_file(str(ROOT / "policies" / "examples" / "holding.yaml"))
    validating = manifests.render(holding, manifests.Options(
        validating_failure_policy=failure))[1]
    main = validating["webhooks"][0]
    [resize] = [h for h in validating["webhooks"] if h["name"] == "resize.gpu-webhook.dev"]
    assert resize["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                                "operations": ["UPDATE"], "resources": ["pods/resize"],
                                "scope": "Namespaced"}]
    assert (resize["failurePolicy"], resize["sideEffects"]) == (failure, "None")
    assert resize["clientConfig"] == main["clientConfig"]
    assert resize["namespaceSelector"] == main["namespaceSelector"]
    gpu = wrap("Pod", pod_spec(container(limits={"nvidia.com/gpu": "1", "cpu": "64"})))
    plain = wrap("Pod", pod_spec(container(limits={"cpu": "64"})))
    assert sent(resize, gpu, old=gpu, sub_resource="resize")
    assert not sent(resize, plain, old=plain, sub_resource="resize")


def test_deletes_of_gang_kinds_go_to_a_release_webhook_that_never_blocks():
    validating = render(validating_failure_policy="Fail")[1]
    main = validating["webhooks"][0]
    [release] = [h for h in validating["webhooks"] if h["name"] == "release.gpu-webhook.dev"]
    got = {(g, r) for rule in release["rules"] for g in rule["apiGroups"]
           for r in rule["resources"]}
    assert got == {(b.group, b.resource) for b in CRD_KINDS if b.reserves} | {
        ("scheduling.k8s.io", "podgroups"), ("scheduling.k8s.io", "compositepodgroups")}
    assert ("batch.volcano.sh", "jobs") in got and ("ray.io", "rayclusters") not in got
    assert ("batch.volcano.sh", "cronjobs") not in got  # its Jobs are what is reserved
    assert {op for rule in release["rules"] for op in rule["operations"]} == {"DELETE"}
    # A delete is never the webhook's to block; a dry run's delete releases nothing.
    assert (release["failurePolicy"], release["sideEffects"]) == ("Ignore", "NoneOnDryRun")
    assert "matchConditions" not in release  # a DELETE carries no object to test
    assert release["clientConfig"] == main["clientConfig"]
    assert release["namespaceSelector"] == main["namespaceSelector"]


def test_url_client_config_for_a_webhook_outside_the_cluster():
    hook = render(url="https://127.0.0.1:9443")[1]["webhooks"][0]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:9443/validate"}


@pytest.mark.parametrize(("args", "message"), [
    (["--url", "http://127.0.0.1:8443"], "https://"),
    (["--timeout-seconds", "31"], "between 1 and 30"),
    (["--ca-file", "pyproject.toml"], "no PEM certificate"),
    (["--policy", "missing.yaml"], "missing.yaml"),
])
def test_bad_options_are_usage_errors(args, message):
    done = cli(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""


# --- what the CEL conditions let through ----------------------------------------------

def container(limits=None, requests=None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "app", "image": "busybox"}
    res = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    if res:
        c["resources"] = res
    return c


def pod_spec(*containers, init=(), tolerations=None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers) or [container()]}
    if init:
        spec["initContainers"] = list(init)
    if tolerations:
        spec["tolerations"] = tolerations
    return spec


def wrap(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    template = {"metadata": {}, "spec": spec}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "spec": spec}
    if kind == "CronJob":
        return {"kind": kind, "spec": {"schedule": "* * * * *",
                                       "jobTemplate": {"spec": {"template": template}}}}
    return {"kind": kind, "spec": {"template": template}}


def sent(hook: dict[str, Any], obj: dict[str, Any], *, user: str = "dev",
         groups: list[str] | None = None, old: dict[str, Any] | None = None,
         namespace: str = "research", sub_resource: str | None = None) -> bool:
    """Whether the API server would call this webhook: every matchCondition is true."""
    # Imported here, not at module level: a missing CEL library (a dev dependency) fails
    # the tests that evaluate conditions, and only those; it never skips the rest.
    import cel

    user_info: dict[str, Any] = {"username": user}
    if groups:
        user_info["groups"] = groups
    request: dict[str, Any] = {"kind": {"group": "", "version": "v1", "kind": obj["kind"]},
                               "userInfo": user_info, "namespace": namespace}
    if sub_resource:
        request["subResource"] = sub_resource
    context = {"object": obj, "oldObject": old, "request": request}
    results = [cel.evaluate(mc["expression"], context) for mc in hook["matchConditions"]]
    assert all(isinstance(r, bool) for r in results), results
    return all(results)


GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
KINDS = ["Pod", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("spec", "gpu"), [
    (pod_spec(container(limits={"nvidia.com/gpu": "1"})), True),
    (pod_spec(container(requests={"nvidia.com/gpu.shared": 1})), True),
    (pod_spec(container(limits={"nvidia.com/mig-1g.10gb": "1"})), True),  # pattern
    (pod_spec(container(limits={"cpu": "1"}), init=[container(limits={"nvidia.com/gpu": 1})]),
     True),
    (pod_spec(container(limits={"cpu": "1", "memory": "1Gi"})), False),
    (pod_spec(container()), False),
    (pod_spec(container(limits={"example.com/gpu": "1", "nvidia.com/gpux": "1"})), False),
])
def test_only_gpu_pods_and_templates_are_sent(kind, spec, gpu):
    mutating, validating = (o["webhooks"][0] for o in render())
    obj = wrap(kind, spec)
    assert sent(mutating, obj) is gpu
    assert sent(validating, obj) is gpu


def test_non_gpu_pods_tolerating_gpu_taints_go_where_the_policy_acts_on_them():
    obj = wrap("Pod", pod_spec(tolerations=GPU_TOLERATION))
    everything = wrap("Pod", pod_spec(tolerations=[{"operator": "Exists"}]))
    for choice, to_mutating, to_validating in [("strip", True, False), ("deny", False, True),
                                               ("allow", False, False)]:
        p = policy(f"  nonGpuPodsToleratingGpuTaints: {choice}\n")
        mutating, validating = (o["webhooks"][0] for o in manifests.render(p))
        assert (sent(mutating, obj), sent(validating, obj)) == (to_mutating, to_validating)
        # A key-less toleration tolerates every taint; the engine leaves it alone.
        assert not sent(mutating, everything) and not sent(validating, everything)


def test_routes_webhooks_take_every_tenant_pod_the_gpu_webhook_is_not_sent():
    # Pods without GPUs of tenants' namespaces get NVIDIA_VISIBLE_DEVICES=void and the
    # other route checks (engine.routes): one webhook for the namespaces named, one per
    # tenant selector; GPU pods (and pods tolerating the GPU taint, under strip) are the
    # GPU webhook's, which runs the same checks.
    hooks = {h["name"]: h for h in render()[0]["webhooks"]}
    named, selected = hooks["routes.gpu-webhook.dev"], hooks["routes-1.gpu-webhook.dev"]
    plain = wrap("Pod", pod_spec())
    gpu = wrap("Pod", pod_spec(container(limits={"nvidia.com/gpu": "1"})))
    tolerating = wrap("Pod", pod_spec(tolerations=GPU_TOLERATION))
    assert sent(named, plain, namespace="research")
    assert sent(named, plain, namespace="research-dev")
    assert not sent(named, plain, namespace="default")  # no tenant's
    assert not sent(named, gpu) and sent(hooks["mutate.gpu-webhook.dev"], gpu)
    assert not sent(named, tolerating) and sent(hooks["mutate.gpu-webhook.dev"], tolerating)
    # kubectl debug adds an ephemeral container to a running GPU pod: sent.
    assert sent(named, gpu, sub_resource="ephemeralcontainers", old=gpu)
    assert named["rules"][1]["resources"] == ["pods/ephemeralcontainers"]
    assert named["rules"][1]["operations"] == ["UPDATE"]
    # The tenant chosen by label: its selector, leaving out the excluded and named ones.
    assert selected["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
         "values": ["gpu-operator", "gpu-webhook", "kube-system", "notebooks", "research",
                    "research-dev"]},
        {"key": "gpu.example.com/tenant", "operator": "In", "values": ["inference"]}]}
    assert sent(selected, plain, namespace="serving")
    assert not sent(selected, gpu)
    for hook in (named, selected):
        assert hook["clientConfig"]["service"]["path"] == "/mutate"
        assert hook["reinvocationPolicy"] == "IfNeeded"
        assert hook["sideEffects"] == "None"


def test_tenants_chosen_by_one_label_share_a_routes_webhook_per_key():
    p = policy("  tenants:\n" + "".join(
        f"    - name: t{i}\n      namespaceSelector: {{matchLabels: {{team: t{i}}}}}\n"
        for i in range(12)) + "    - name: other\n      namespaceSelector:\n"
        "        matchExpressions: [{key: org, operator: In, values: [x]}]\n")
    routes = [h for h in manifests.render(p)[0]["webhooks"] if "routes" in h["name"]]
    assert [h["name"] for h in routes] == ["routes-1.gpu-webhook.dev",
                                           "routes-2.gpu-webhook.dev"]
    assert routes[0]["namespaceSelector"]["matchExpressions"][1] == {
        "key": "team", "operator": "In", "values": sorted(f"t{i}" for i in range(12))}
    assert routes[1]["namespaceSelector"]["matchExpressions"][1] == {
        "key": "org", "operator": "In", "values": ["x"]}


def test_no_routes_webhook_without_tenants():
    names = [h["name"] for h in manifests.render(policy("  mode: enforce\n"))[0]["webhooks"]]
    assert not [n for n in names if "routes" in n]


def test_exempt_users_groups_and_service_accounts_are_not_sent():
    p = policy("  exemptions:\n    users: [alice]\n    groups: [gpu-admins]\n"
               "    serviceAccounts: [gpu-operator/device-plugin]\n")
    hook = manifests.render(p)[0]["webhooks"][0]
    obj = wrap("Pod", pod_spec(container(limits={"nvidia.com/gpu": 1})))
    assert sent(hook, obj, user="bob", groups=["dev"])
    assert not sent(hook, obj, user="alice")
    assert not sent(hook, obj, user="bob", groups=["dev", "gpu-admins"])
    assert not sent(hook, obj, user="system:serviceaccount:gpu-operator:device-plugin")


@pytest.mark.parametrize(("pattern", "hits", "misses"), [
    ("example.com/*", ["example.com/a100"], ["example.org/a100"]),
    ("*.shared", ["nvidia.com/gpu.shared"], ["nvidia.com/gpu"]),
    ("amd.com/*-gpu*", ["amd.com/mi300-gpu", "amd.com/x-gpu-2"], ["amd.com/gpu", "amdxcom/-gpu"]),
    ("nvidia.com/gpu", ["nvidia.com/gpu"], ["nvidia.com/gpu2"]),
])
def test_patterns_match_as_the_policy_does(pattern, hits, misses):
    p = policy(f"  gpuResources:\n    names: []\n    patterns: ['{pattern}']\n")
    hook = manifests.render(p)[1]["webhooks"][0]
    compiled = compile_policy(p)
    for name in hits + misses:
        obj = wrap("Pod", pod_spec(container(limits={name: 1})))
        assert sent(hook, obj) is (name in hits) is compiled.is_gpu(name), name


def test_malformed_templates_are_not_sent_rather_than_failing_the_condition():
    hook = render()[0]["webhooks"][0]
    assert not sent(hook, {"kind": "Deployment", "spec": {}})
    assert not sent(hook, {"kind": "CronJob", "spec": {"jobTemplate": {}}})


def scale(replicas: int | None) -> dict[str, Any]:
    """A Scale object (autoscaling/v1) as the API server sends it: spec.replicas is
    omitted when 0."""
    return {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "x"},
            "spec": {} if replicas is None else {"replicas": replicas},
            "status": {"replicas": 1, "selector": "app=x"}}


@pytest.mark.parametrize(("old", "new", "expected"), [
    (1, 5, True),
    (None, 3, True),  # from 0
    (5, 5, False),
    (5, 2, False),
    (2, None, False),  # to 0
])
def test_only_scale_ups_are_sent_to_the_scale_webhook(old, new, expected):
    hook = render()[1]["webhooks"][1]
    assert sent(hook, scale(new), old=scale(old)) is expected
    p = policy("  exemptions:\n    users: [alice]\n")
    exempting = manifests.render(p)[1]["webhooks"][1]
    assert sent(exempting, scale(new), old=scale(old), user="bob") is expected
    assert not sent(exempting, scale(new), old=scale(old), user="alice")


def test_a_scale_object_makes_the_template_condition_false_not_an_error():
    for hook in (render()[0]["webhooks"][0], render()[1]["webhooks"][0]):
        assert not sent(hook, scale(5), old=scale(1))


# --- DRA: pods asking through claims, and the claims themselves ------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("claims", "expected"), [
    ([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}], True),
    ([{"name": "gpu", "resourceClaimName": "shared"}], True),
    ([], False),
])
def test_pods_asking_through_claims_are_sent(kind, claims, expected):
    mutating, validating = (o["webhooks"][0] for o in render())
    spec = pod_spec(container(limits={"cpu": "1"}))
    spec["resourceClaims"] = claims
    obj = wrap(kind, spec)
    assert sent(mutating, obj) is expected
    assert sent(validating, obj) is expected


def claim_object(kind: str, *requests: dict[str, Any]) -> dict[str, Any]:
    spec = {"devices": {"requests": list(requests)}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind,
            "spec": spec if kind == "ResourceClaim" else {"spec": spec}}


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
@pytest.mark.parametrize(("requests", "expected"), [
    ([{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}], True),
    ([{"name": "g", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 2}}], True),
    ([{"name": "n", "exactly": {"deviceClassName": "nic.example.com"}},
      {"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": "mig.nvidia.com"}]}],
     True),
    ([{"name": "n", "exactly": {"deviceClassName": "nic.example.com"}}], False),
    ([], False),
])
def test_only_claims_of_gpu_device_classes_are_sent(kind, requests, expected):
    mutating, validating = render()
    claims_hooks = [h for doc in (mutating, validating) for h in doc["webhooks"]
                    if h["name"].startswith("claims.")]
    assert [h["name"] for h in claims_hooks] == ["claims.mutate.gpu-webhook.dev",
                                                 "claims.validate.gpu-webhook.dev"]
    for hook in claims_hooks:
        assert hook["rules"] == [{
            "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
            "resources": ["resourceclaims", "resourceclaimtemplates"], "scope": "Namespaced"}]
        assert hook["matchPolicy"] == "Equivalent"  # v1beta1 requests arrive as v1
        assert sent(hook, claim_object(kind, *requests)) is expected
# --- training workloads -------------------------------------------------------------------

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "workloads"


def workload_fixtures() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for f in sorted(FIXTURES.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc["kind"] not in ("Service", "ClusterTrainingRuntime"):
                out.append((f.stem, doc))
    return out


def sent_as(hook: dict[str, Any], obj: dict[str, Any]) -> bool:
    import cel  # as in sent(): a missing CEL library fails these tests, not the module

    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    context = {"object": obj, "oldObject": None, "request": {
        "kind": {"group": group, "version": "v1", "kind": obj["kind"]},
        "userInfo": {"username": "dev"}}}
    results = [cel.evaluate(mc["expression"], context) for mc in hook["matchConditions"]]
    assert all(isinstance(r, bool) for r in results), results
    return all(results)


GPU_FIXTURES = {"volcano-job-mindspore-gpu", "pytorchjob-mnist-nccl", "lws-vllm-gpu",
                "rayjob-pytorch-text-classifier", "raycluster-verl"}


@pytest.mark.parametrize(("name", "obj"), workload_fixtures(),
                         ids=[n for n, _ in workload_fixtures()])
def test_training_workloads_are_sent_when_a_template_asks_for_gpus(name, obj):
    mutating, validating = (o["webhooks"][0] for o in render())
    assert sent_as(mutating, obj) is (name in GPU_FIXTURES)
    assert sent_as(validating, obj) is (name in GPU_FIXTURES)


def test_a_cpu_training_job_turns_gpu_in_any_role():
    mutating = render()[0]["webhooks"][0]
    limits = {"nvidia.com/gpu": 1}
    cases = {
        "jobset-pytorch-resnet": lambda o: o["spec"]["replicatedJobs"][0]["template"]["spec"][
            "template"]["spec"]["containers"][0].setdefault("resources", {}).update(
                limits=limits),
        "mpijob-tensorflow-mnist": lambda o: o["spec"]["mpiReplicaSpecs"]["Worker"][
            "template"]["spec"]["containers"][0]["resources"].update(limits=limits),
        "trainjob-volcano": lambda o: o["spec"]["trainer"]["resourcesPerNode"].update(
            limits=limits),
        # kind CronJob, told from a batch CronJob by its group
        "volcano-cronjob-example": lambda o: o["spec"]["jobTemplate"]["spec"]["tasks"][0][
            "template"]["spec"]["containers"][0].setdefault("resources", {}).update(
                limits=limits),
        "argo-workflow-dns-config": lambda o: o["spec"]["templates"][0]["container"][
            "resources"].update(limits=limits),
    }
    for name, obj in workload_fixtures():
        if name in cases:
            cases[name](obj)
            assert sent_as(mutating, obj), name


def test_a_volcano_job_is_not_mistaken_for_a_batch_job():
    # Both are kind Job: the group tells them apart (a batch Job's spec.template).
    mutating = render()[0]["webhooks"][0]
    obj = dict(workload_fixtures()[[n for n, _ in workload_fixtures()].index(
        "volcano-job-mindspore-gpu")][1])
    obj["spec"]["template"] = {"spec": pod_spec(container(limits={"cpu": "1"}))}
    assert sent_as(mutating, obj)


CONFIGURED = """
  workloadKinds:
    - group: example.com
      kind: TrainingRun
      resource: trainingruns
      versions: [v1, v1beta1]
      roles:
        - template: /spec/roles/*/template
          replicas: /spec/roles/*/replicas
        - template: /spec/launcher
      gang: all
"""


def configured_policy():
    text = (ROOT / "policies" / "multi-tenant.yaml").read_text().replace(
        "\n  tenants:\n", CONFIGURED + "  tenants:\n", 1)
    return load_text(text)


def test_configured_kinds_get_rules_and_conditions():
    hook = manifests.render(configured_policy())[0]["webhooks"][0]
    rules = [r for r in hook["rules"] if r["apiGroups"] == ["example.com"]]
    assert rules == [{"apiGroups": ["example.com"], "apiVersions": ["v1", "v1beta1"],
                      "operations": ["CREATE", "UPDATE"], "resources": ["trainingruns"],
                      "scope": "Namespaced"}]
    gpu = {"spec": pod_spec(container(limits={"nvidia.com/gpu": "1"}))}
    cpu = {"spec": pod_spec(container(limits={"cpu": "1"}))}
    for roles, launcher, expected in (
            ([{"template": cpu}, {"template": gpu}], None, True),  # a list of roles
            ({"a": {"template": cpu}, "b": {"template": gpu}}, None, True),  # a map
            ([{"template": cpu}], cpu, False),
            ([], gpu, True)):
        spec: dict[str, Any] = {"roles": roles}
        if launcher:
            spec["launcher"] = launcher
        obj = {"apiVersion": "example.com/v1", "kind": "TrainingRun", "spec": spec}
        assert sent_as(hook, obj) is expected, spec


def test_a_configured_kind_with_a_gang_has_its_deletes_sent_for_release():
    [release] = [h for h in manifests.render(configured_policy())[1]["webhooks"]
                 if h["name"] == "release.gpu-webhook.dev"]
    assert [r for r in release["rules"] if r["apiGroups"] == ["example.com"]] == [{
        "apiGroups": ["example.com"], "apiVersions": ["v1", "v1beta1"],
        "operations": ["DELETE"], "resources": ["trainingruns"], "scope": "Namespaced"}]


@pytest.mark.parametrize("failure", ["Fail", "Ignore"])
def test_gpupolicy_objects_go_to_the_policy_loader(failure):
    _, validating = render(validating_failure_policy=failure)
    hook = validating["webhooks"][-2]
    assert hook["name"] == "policies.gpu-webhook.dev"
    assert hook["rules"] == [{
        "apiGroups": ["gpu-webhook.dev"], "apiVersions": ["v1alpha1"],
        "operations": ["CREATE", "UPDATE"], "resources": ["gpupolicies"], "scope": "Cluster"}]
    assert hook["clientConfig"]["service"]["path"] == "/validate-policy"
    assert hook["failurePolicy"] == failure
    assert hook["sideEffects"] == "None"
    # The caBundle reaches it with the others: same configuration, same CA.
    assert render(url="https://127.0.0.1:9443")[1]["webhooks"][-2]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/validate-policy"}


def test_the_policy_configmap_goes_to_the_policy_loader_and_never_fails_closed():
    _, validating = render(namespace="gpu-system", validating_failure_policy="Fail")
    hook = validating["webhooks"][-1]
    assert hook["name"] == "policy-file.gpu-webhook.dev"
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                              "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"],
                              "scope": "Namespaced"}]
    assert hook["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["gpu-system"]}]}
    assert hook["clientConfig"]["service"]["path"] == "/validate-policy"
    # Only the policy's ConfigMap is sent, whoever edits it (no exemption condition).
    assert [c["name"] for c in hook["matchConditions"]] == ["the-policy-configmap"]
    for name, sent_there in (("gpu-webhook-policy", True), ("gpu-webhook-ledger-a", False)):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
        assert sent(hook, cm, namespace="gpu-system") is sent_there
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"


def test_time_sliced_resources_are_sent_as_the_policy_counts_them():
    # gpuResources.timeSlicing names GPU resources of its own: a pod asking only for one
    # must reach the webhooks, or it would go uncharged.
    p = policy("  gpuResources:\n    names: [nvidia.com/gpu]\n"
               "    timeSlicing: {nvidia.com/gpu.shared: 4}\n")
    compiled = compile_policy(p)
    for hook in (o["webhooks"][0] for o in manifests.render(p)[:2]):
        for name, gpu in [("nvidia.com/gpu.shared", True), ("nvidia.com/gpu", True),
                          ("nvidia.com/gpu.sharedx", False)]:
            obj = wrap("Pod", pod_spec(container(limits={name: 1})))
            assert sent(hook, obj) is gpu is compiled.is_gpu(name), name


@pytest.mark.parametrize("kind", KINDS)
def test_kai_fraction_pods_are_sent_when_the_policy_charges_them(kind):
    # A KAI-Scheduler fraction asks no GPU resource: only its annotation says it.
    on = policy("  gpuResources:\n    kai: {deviceMemory: 81920}\n")
    off = policy("  gpuResources:\n    names: [nvidia.com/gpu]\n")
    obj = wrap(kind, pod_spec(container(limits={"cpu": "1"})))
    holder = obj if kind == "Pod" else (
        obj["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob"
        else obj["spec"]["template"])
    holder.setdefault("metadata", {})["annotations"] = {"gpu-fraction": "0.5"}
    for p, expected in ((on, True), (off, False)):
        for hook in (o["webhooks"][0] for o in manifests.render(p)[:2]):
            assert sent(hook, obj) is expected, (kind, expected)
    plain = wrap(kind, pod_spec(container(limits={"cpu": "1"})))
    for hook in (o["webhooks"][0] for o in manifests.render(on)[:2]):
        assert not sent(hook, plain)
