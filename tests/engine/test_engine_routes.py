"""No GPU without a charge: the routes to a GPU that skip the GPU request
(``webhook.engine.routes``), in a tenant's namespaces of the example policy.

Every mutation here goes through ``mutate_checked``: the patch applies, the result is a
valid pod, and a second run patches nothing.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
import pytest
from enginekit import (
    GPU,
    GPU_TOLERATION,
    K8S_VERSION,
    VOID_ENTRY,
    claim,
    claims_of,
    container,
    device_request,
    example_policy,
    example_variant,
    gpus,
    mutate_checked,
    neutralized_only,
    pod,
    review,
)

from webhook.admission.webhooks import mutating
from webhook.engine.routes.sights import Sights
from webhook.k8s.review import parse_review, request_review
from webhook.policy.model import Rule

VAR = "NVIDIA_VISIBLE_DEVICES"
RESEARCH = "    - name: research\n      namespaces: [research, research-dev]\n"


def research(extra: str) -> Any:
    """The example policy with ``extra`` (YAML at the tenant's indent) for research."""
    return example_variant((RESEARCH, RESEARCH + extra))


def env(c: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = c.get("env", [])
    return out


def rules(d: Any) -> list[Rule]:
    return [f.rule for f in d.findings]


# --- NVIDIA_VISIBLE_DEVICES ----------------------------------------------------------------


def test_a_cuda_container_asking_no_gpu_gets_the_variable_void() -> None:
    # CUDA images set ENV NVIDIA_VISIBLE_DEVICES=all: without the entry, NVIDIA's runtime
    # would hand the container every GPU of its node.
    m = mutate_checked(pod(container("cuda")))
    assert m.decision.allowed
    assert env(m.patched["spec"]["containers"][0]) == [VOID_ENTRY]
    assert m.decision.mutations == ["gpu-visible-devices"]
    assert m.patched["metadata"]["annotations"] == {
        "gpu-webhook.dev/mutated": "gpu-visible-devices"}


@pytest.mark.parametrize("entry", [
    {"name": VAR, "value": "all"},
    {"name": VAR, "value": "0,1"},
    {"name": VAR, "value": "GPU-5f8a3a4e-0000-0000-0000-000000000000"},
    {"name": VAR, "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "devices"}}},
])
def test_a_container_asking_no_gpu_cannot_name_gpus_by_the_variable(entry: dict[str, Any]
                                                                    ) -> None:
    before = [{"name": "A", "value": "1"}, entry, {"name": "B", "value": "2"}]
    m = mutate_checked(pod(container("job", env=before)))
    assert env(m.patched["spec"]["containers"][0]) == [before[0], VOID_ENTRY, before[2]]
    assert [op["op"] for op in m.decision.patch if "/env" in op["path"]] == ["replace"]


def test_an_env_from_config_map_is_overridden_by_an_explicit_entry() -> None:
    # The kubelet writes env after envFrom: an explicit entry wins over a ConfigMap's key.
    c = container("app", envFrom=[{"configMapRef": {"name": "settings"}}],
                  env=[{"name": "MODE", "value": "serve"}])
    m = mutate_checked(pod(c))
    assert env(m.patched["spec"]["containers"][0]) == [{"name": "MODE", "value": "serve"},
                                                        VOID_ENTRY]
    assert m.decision.patch[0]["path"] == "/spec/containers/0/env/-"


def test_a_gpu_container_cannot_widen_what_it_gets() -> None:
    # Its own entry would come after the device plugin's in the container's environment,
    # and NVIDIA's runtime reads the last: it is removed, the plugin's value stands.
    c = container("train", limits=gpus(1), env=[{"name": VAR, "value": "all"},
                                                {"name": "EPOCHS", "value": "3"}])
    m = mutate_checked(pod(c, container("logs")))
    train, logs = m.patched["spec"]["containers"]
    assert env(train) == [{"name": "EPOCHS", "value": "3"}]
    assert env(logs) == [VOID_ENTRY]  # its sidecar is given no GPU


def test_init_containers_are_checked_as_containers() -> None:
    m = mutate_checked(pod(container(limits=gpus(1)),
                           init=[container("fetch", env=[{"name": VAR, "value": "all"}])]))
    assert env(m.patched["spec"]["initContainers"][0]) == [VOID_ENTRY]


def test_deny_refuses_a_container_that_sets_the_variable_and_neutralizes_the_rest() -> None:
    policy = research("      gpuRoutes: {visibleDevices: deny}\n")
    m = mutate_checked(pod(container("job", env=[{"name": VAR, "value": "all"}])), policy)
    assert not m.decision.allowed and rules(m.decision) == [Rule.VISIBLE_DEVICES]
    assert 'container "job": sets NVIDIA_VISIBLE_DEVICES ("all")' in m.decision.message
    charged = mutate_checked(pod(container(limits=gpus(1), env=[{"name": VAR,
                                                                 "value": "0,1,2,3"}])),
                             policy)
    assert not charged.decision.allowed
    assert "would replace the one the device plugin gives" in charged.decision.message
    # A container that does not set it still gets void: its image's default is unseen.
    plain = mutate_checked(pod(container("cuda"), container("off", env=[
        {"name": VAR, "value": "void"}])), policy)
    assert plain.decision.allowed
    assert [env(c) for c in plain.patched["spec"]["containers"]] == [[VOID_ENTRY]] * 2


def test_allow_leaves_the_variable_to_the_tenant() -> None:
    policy = research("      gpuRoutes: {visibleDevices: allow}\n")
    m = mutate_checked(pod(container("cuda", env=[{"name": VAR, "value": "all"}])), policy)
    assert m.decision.allowed and m.decision.patch == []
    # Other tenants keep the policy's default.
    other = mutate_checked(pod(container("cuda"), namespace="notebooks"), policy)
    assert neutralized_only(other.decision.patch)


def test_the_policy_default_can_be_allow_with_one_tenant_neutralizing() -> None:
    policy = example_variant(
        ("nonGpuPodsToleratingGpuTaints: strip",
         "nonGpuPodsToleratingGpuTaints: strip\n  gpuRoutes: {visibleDevices: allow}"),
        (RESEARCH, RESEARCH + "      gpuRoutes: {visibleDevices: neutralize}\n"))
    assert neutralized_only(mutate_checked(pod(container("a")), policy).decision.patch)
    assert mutate_checked(pod(container("a"), namespace="notebooks"),
                          policy).decision.patch == []


def test_a_container_naming_a_gpu_claim_is_charged_and_its_neighbour_is_not() -> None:
    template = claim(kind="ResourceClaimTemplate", name="one-gpu")
    p = pod(container("train", resources={"claims": [{"name": "gpu"}]},
                      env=[{"name": VAR, "value": "all"}]),
            container("watch"),
            resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
    m = mutate_checked(p, claims=claims_of(template))
    train, watch = m.patched["spec"]["containers"]
    assert env(train) == []  # the DRA driver's CDI spec sets the variable for its devices
    assert env(watch) == [VOID_ENTRY]


@pytest.mark.parametrize("namespace", ["gpu-operator", "sandbox"])
def test_exempt_and_unassigned_namespaces_are_not_governed(namespace: str) -> None:
    m = mutate_checked(pod(container("cuda"), namespace=namespace))
    assert m.decision.patch == []


# --- spec.nodeName -----------------------------------------------------------------------

CPU_NODE = "cpu-1"
GPU_NODE = "a100-node-3"
NODES = Sights(node_gpus={CPU_NODE: False, GPU_NODE: True}.get)


def test_node_name_of_a_gpu_node_is_refused() -> None:
    # The scheduler is skipped; the kubelet checks only NoExecute taints.
    m = mutate_checked(pod(container("x"), nodeName=GPU_NODE), sights=NODES)
    assert not m.decision.allowed and rules(m.decision) == [Rule.NODE_NAME]
    assert f'node "{GPU_NODE}" carries GPUs' in m.decision.message
    assert "kubernetes.io/hostname" in m.decision.message


def test_node_name_of_an_unknown_node_is_refused_and_of_a_cpu_node_passes() -> None:
    unknown = mutate_checked(pod(container("x"), nodeName="new-node"), sights=NODES)
    assert not unknown.decision.allowed
    cpu = mutate_checked(pod(container("x"), nodeName=CPU_NODE), sights=NODES)
    assert cpu.decision.allowed and neutralized_only(cpu.decision.patch)


def test_node_name_allowed_by_the_tenant_and_from_the_kubelet() -> None:
    allowed = research("      gpuRoutes: {nodeName: allow}\n")
    assert mutate_checked(pod(container("x"), nodeName=GPU_NODE), allowed,
                          sights=NODES).decision.allowed
    # A mirror pod: the kubelet's own identity, which NodeRestriction binds to its node.
    mirror = mutate_checked(pod(container("x"), nodeName=GPU_NODE), sights=NODES,
                            username=f"system:node:{GPU_NODE}")
    assert mirror.decision.allowed


# --- privilege and /dev -------------------------------------------------------------------


@pytest.mark.parametrize(("security", "shown"), [
    ({"privileged": True}, "securityContext.privileged: true"),
    ({"capabilities": {"add": ["SYS_ADMIN"]}}, "capabilities.add: SYS_ADMIN"),
    ({"capabilities": {"add": ["CAP_SYS_ADMIN"]}}, "capabilities.add: CAP_SYS_ADMIN"),
])
def test_a_privileged_gpu_pod_is_refused(security: dict[str, Any], shown: str) -> None:
    m = mutate_checked(pod(container(limits=gpus(1), securityContext=security)))
    assert not m.decision.allowed and rules(m.decision) == [Rule.PRIVILEGED]
    assert shown in m.decision.message and "(it asks for GPUs)" in m.decision.message


@pytest.mark.parametrize(("tolerations", "reach"), [
    ([{"operator": "Exists"}], "it tolerates every taint"),
    # Stripped first (nonGpuPodsToleratingGpuTaints: strip): then it cannot reach them.
    ([GPU_TOLERATION], None),
    (None, None),
])
def test_a_privileged_pod_without_gpus_is_refused_where_it_can_reach_gpu_nodes(
        tolerations: list[dict[str, Any]] | None, reach: str | None) -> None:
    spec: dict[str, Any] = {"tolerations": tolerations} if tolerations else {}
    m = mutate_checked(pod(container("agent", securityContext={"privileged": True}), **spec))
    assert m.decision.allowed is (reach is None)
    if reach:
        assert f"({reach})" in m.decision.message


def test_a_privileged_init_container_is_refused() -> None:
    m = mutate_checked(pod(container(limits=gpus(1)), init=[
        container("setup", securityContext={"privileged": True})]))
    assert 'init container "setup": is privileged' in m.decision.message


@pytest.mark.parametrize(("path", "refused"), [
    ("/dev", True), ("/dev/", True), ("/dev/nvidia0", True), ("/dev/nvidia-caps", True),
    ("/", True), ("//dev//nvidiactl", True), ("/dev/null", True),
    ("/var/log", False), ("/devices", False), ("/data/dev", False),
])
def test_host_paths_of_dev_are_refused_on_gpu_pods(path: str, refused: bool) -> None:
    m = mutate_checked(pod(container(limits=gpus(1)), volumes=[
        {"name": "host", "hostPath": {"path": path}}]))
    assert m.decision.allowed is not refused
    if refused:
        assert rules(m.decision) == [Rule.DEVICE_HOST_PATHS]


def test_privileged_and_host_paths_allowed_by_the_tenant() -> None:
    policy = research("      gpuRoutes: {privileged: allow, deviceHostPaths: allow}\n")
    m = mutate_checked(pod(container(limits=gpus(1), securityContext={"privileged": True}),
                           volumes=[{"name": "dev", "hostPath": {"path": "/dev"}}]), policy)
    assert m.decision.allowed


def test_a_workload_template_is_checked_at_apply_and_changed_in_its_pods() -> None:
    # The refusals answer at kubectl apply; the variable is set in each pod when it is
    # created (the routes webhooks see every pod of a tenant).
    from enginekit import deployment
    root = mutate_checked(deployment(pod(container("x", limits=gpus(1),
                                                   securityContext={"privileged": True}))))
    assert not root.decision.allowed and rules(root.decision) == [Rule.PRIVILEGED]
    assert "deployment research/trainer, pod template" in root.decision.message
    bound = mutate_checked(deployment(pod(container("x", limits=gpus(1)), nodeName="n1")))
    assert rules(bound.decision) == [Rule.NODE_NAME]
    plain = mutate_checked(deployment(pod(container("x", limits=gpus(1)), container("y"))))
    assert plain.decision.allowed and "gpu-visible-devices" not in plain.decision.mutations


# --- ephemeral containers (kubectl debug) --------------------------------------------------


def running_gpu_pod() -> dict[str, Any]:
    p = pod(container(limits=gpus(1), requests=gpus(1)), nodeName=GPU_NODE)
    p["metadata"]["uid"] = "6b1c3d0e-0000-4000-8000-000000000001"
    return p


def debug(p: dict[str, Any], *added: dict[str, Any], sights: Sights = NODES,
          policy: Any = None) -> tuple[Any, dict[str, Any]]:
    """The pods/ephemeralcontainers UPDATE kubectl debug sends: the pod with ``added``
    appended to its ephemeral containers. The decision and the patched pod."""
    new = copy.deepcopy(p)
    new["spec"].setdefault("ephemeralContainers", []).extend(copy.deepcopy(list(added)))
    payload = request_review(copy.deepcopy(new), operation="UPDATE")
    payload["request"]["subResource"] = "ephemeralcontainers"
    payload["request"]["oldObject"] = copy.deepcopy(p)
    d = mutating(parse_review(orjson.dumps(payload)), policy or example_policy(),
                 sights=sights)
    patched = jsonpatch.apply_patch(new, d.patch) if d.patch else new
    kubernetes_validate.validate(patched, K8S_VERSION, strict=True)
    again = dict(payload["request"], object=copy.deepcopy(patched))
    redo = mutating(parse_review(orjson.dumps({**payload, "request": again})),
                    policy or example_policy(), sights=sights)
    assert redo.patch == [], "not idempotent"
    return d, patched


def test_kubectl_debug_on_a_gpu_pod_gets_a_neutralized_ephemeral_container() -> None:
    d, patched = debug(running_gpu_pod(), {"name": "debugger-x1", "image": "nvidia/cuda",
                                           "env": [{"name": VAR, "value": "all"}]})
    assert d.allowed
    assert patched["spec"]["ephemeralContainers"][0]["env"] == [VOID_ENTRY]
    assert [op["path"] for op in d.patch] == ["/spec/ephemeralContainers/0/env/0"]


def test_only_the_ephemeral_containers_added_are_changed() -> None:
    # The API server refuses any change to an ephemeral container already there.
    p = running_gpu_pod()
    p["spec"]["ephemeralContainers"] = [{"name": "old", "image": "busybox"}]
    d, patched = debug(p, {"name": "new", "image": "busybox"})
    assert d.allowed
    assert patched["spec"]["ephemeralContainers"][0] == {"name": "old", "image": "busybox"}
    assert patched["spec"]["ephemeralContainers"][1]["env"] == [VOID_ENTRY]


def test_a_privileged_ephemeral_container_on_a_gpu_node_is_refused() -> None:
    d, _ = debug(running_gpu_pod(), {"name": "sysadmin", "image": "busybox",
                                     "securityContext": {"privileged": True}})
    assert not d.allowed and rules(d) == [Rule.PRIVILEGED]
    assert 'ephemeral container "sysadmin": is privileged' in d.message
    p = running_gpu_pod()
    p["spec"]["nodeName"] = CPU_NODE
    ok, _ = debug(p, {"name": "sysadmin", "image": "busybox",
                      "securityContext": {"privileged": True}})
    assert ok.allowed


def test_ephemeral_containers_outside_tenants_are_not_touched() -> None:
    p = running_gpu_pod()
    p["metadata"]["namespace"] = "gpu-operator"
    d, _ = debug(p, {"name": "dbg", "image": "busybox"})
    assert d.patch == [] and d.skipped == "exempt"


# --- PriorityClasses -----------------------------------------------------------------------

PRIORITY = research("      priority: {allowedClasses: [research-high, research-low], "
                    "defaultClass: research-low, ceiling: 1000}\n")
CLASSES = Sights(priority_class={"research-high": (1000, "PreemptLowerPriority"),
                                 "research-low": (0, "PreemptLowerPriority"),
                                 "urgent": (100000, "PreemptLowerPriority")}.get)


def test_a_class_above_the_ceiling_is_refused() -> None:
    # With no class list, the policy's ceiling (default 0) holds: the API server's
    # Priority plugin has written the class's value into spec.priority already.
    m = mutate_checked(pod(priorityClassName="urgent", priority=100000))
    assert not m.decision.allowed and rules(m.decision) == [Rule.PRIORITY_CLASS]
    assert "above tenant research's ceiling of 0" in m.decision.message
    # Offline (no spec.priority), the PriorityClass watch's value.
    w = mutate_checked(pod(priorityClassName="urgent"), sights=CLASSES)
    assert not w.decision.allowed
    assert mutate_checked(pod(priorityClassName="urgent")).decision.allowed  # unknown


def test_a_class_the_tenant_does_not_list_is_refused() -> None:
    m = mutate_checked(pod(priorityClassName="urgent", priority=0), PRIORITY)
    assert not m.decision.allowed
    assert "Use one of: research-high, research-low" in m.decision.message
    assert mutate_checked(pod(priorityClassName="research-high", priority=1000),
                          PRIORITY).decision.allowed


def test_a_pod_naming_no_class_gets_the_tenants_default() -> None:
    # Resolved by the Priority plugin before the webhooks (priority 0): the resolved
    # fields go, so the plugin, run again after the change, resolves the new name.
    m = mutate_checked(pod(priority=0, preemptionPolicy="PreemptLowerPriority"), PRIORITY)
    spec = m.patched["spec"]
    assert spec["priorityClassName"] == "research-low"
    assert "priority" not in spec and "preemptionPolicy" not in spec
    assert "priority-class-default" in m.decision.mutations


# --- DRA device taints --------------------------------------------------------------------


@pytest.mark.parametrize("toleration", [
    {"operator": "Exists"},
    {"key": "gpu.nvidia.com/xid", "operator": "Exists", "effect": "NoSchedule"},
])
def test_a_gpu_claim_tolerating_device_taints_is_refused(toleration: dict[str, Any]) -> None:
    d = mutating(review(claim(device_request(tolerations=[toleration]))), example_policy())
    assert not d.allowed and rules(d) == [Rule.DEVICE_TAINT_TOLERATIONS]


def test_first_available_subrequests_are_checked_like_requests() -> None:
    request = {"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com"},
        {"name": "any", "deviceClassName": "gpu.nvidia.com",
         "tolerations": [{"operator": "Exists"}]}]}
    d = mutating(review(claim(request, kind="ResourceClaimTemplate")), example_policy())
    assert not d.allowed
    assert 'device request "gpu/any": tolerates device taints' in d.message


def test_device_taint_tolerations_allowed_by_the_tenant_or_on_other_classes() -> None:
    allowed = research("      gpuRoutes: {deviceTaintTolerations: allow}\n")
    tolerating = claim(device_request(tolerations=[{"operator": "Exists"}]))
    assert mutating(review(tolerating), allowed).allowed
    nic = claim(device_request("nic.example.com", tolerations=[{"operator": "Exists"}]))
    assert mutating(review(nic), example_policy()).allowed
    plain = claim(device_request())
    assert mutating(review(plain), example_policy()).allowed


def test_gpu_claims_keep_their_other_rules() -> None:
    # The taint check is added to the claim's own decision, not in place of it.
    d = mutating(review(claim(device_request("mig.nvidia.com",
                                             tolerations=[{"operator": "Exists"}]))),
                 example_policy())
    assert rules(d) == [Rule.ALLOWED_DEVICE_CLASSES, Rule.DEVICE_TAINT_TOLERATIONS]


def test_gpu_requests_are_unchanged_by_the_routes() -> None:
    m = mutate_checked(pod(container(limits=gpus(2))))
    assert m.patched["spec"]["containers"][0]["resources"]["requests"] == {GPU: 2}
    assert "env" not in m.patched["spec"]["containers"][0]


def test_an_unquoted_off_is_refused_with_the_word_to_write() -> None:
    from webhook.policy.load import PolicyError
    with pytest.raises(PolicyError, match="write `allow`"):
        research("      gpuRoutes: {visibleDevices: off}\n")


# --- the validating webhook's re-check -----------------------------------------------------


def test_the_validating_webhook_refuses_what_the_mutating_one_would_have() -> None:
    # As if the mutating webhook were bypassed (failurePolicy Ignore, a replica down):
    # the final GPU pod is refused before any quota is reserved for it.
    from enginekit import validated
    root = validated(pod(container(limits=gpus(1), requests=gpus(1),
                                   securityContext={"privileged": True})))
    # (Unpinned too: the product and topology rules say so beside it.)
    assert not root.allowed and Rule.PRIVILEGED in rules(root)
    widened = validated(pod(container(limits=gpus(1), requests=gpus(1),
                                      env=[{"name": VAR, "value": "all"}])))
    assert Rule.VISIBLE_DEVICES in rules(widened)
    sidecar = validated(pod(container(limits=gpus(1), requests=gpus(1)),
                            container("side", env=[{"name": VAR, "value": "0,1"}])))
    assert Rule.VISIBLE_DEVICES in rules(sidecar)
    plain = validated(pod(container(limits=gpus(1), requests=gpus(1))))
    assert Rule.VISIBLE_DEVICES not in rules(plain) and Rule.PRIVILEGED not in rules(plain)
    # What the mutating webhook leaves is admitted.
    m = mutate_checked(pod(container(limits=gpus(1)), container("side", env=[
        {"name": VAR, "value": "0,1"}])))
    assert validated(m.patched).allowed


def test_the_validating_webhook_re_checks_to_enforce_only() -> None:
    # A warn-mode tenant (notebooks) is told once, by the mutating webhook.
    from enginekit import validated
    p = pod(container(limits=gpus(1, "nvidia.com/mig-1g.10gb"),
                      securityContext={"privileged": True}), namespace="notebooks")
    assert mutate_checked(p).decision.warnings
    v = validated(p)
    assert v.allowed and not [f for f in v.findings if f.rule is Rule.PRIVILEGED]


def test_deny_and_the_validating_re_check_agree_on_a_gpu_containers_void() -> None:
    from enginekit import validated
    policy = research("      gpuRoutes: {visibleDevices: deny}\n")
    p = pod(container(limits=gpus(1), env=[VOID_ENTRY]))
    m = mutate_checked(p, policy)
    assert m.decision.allowed
    assert Rule.VISIBLE_DEVICES not in rules(validated(m.patched, policy))


def test_admin_claims_in_exempt_namespaces_keep_working() -> None:
    admin = claim(device_request(adminAccess=True, tolerations=[{"operator": "Exists"}]),
                  namespace="gpu-operator")
    d = mutating(review(admin), example_policy())
    assert d.allowed and d.findings == []


def test_a_rewritten_variable_is_told_to_the_developer() -> None:
    # A value that showed GPUs, made void or removed: kubectl shows why as a warning.
    m = mutate_checked(pod(container("job", env=[{"name": VAR, "value": "all"}]),
                           container("train", limits=gpus(1),
                                     env=[{"name": VAR, "value": "0"}])))
    assert m.decision.allowed
    voided, removed = m.decision.warnings
    assert 'container "job": set NVIDIA_VISIBLE_DEVICES ("all") but is given no GPU: it is ' \
        'now "void"' in voided
    assert 'container "train": set NVIDIA_VISIBLE_DEVICES ("0") itself: the entry is removed' \
        in removed
    # A harmless value made void is not worth a word.
    quiet = mutate_checked(pod(container("job", env=[{"name": VAR, "value": "none"}])))
    assert quiet.decision.warnings == []
