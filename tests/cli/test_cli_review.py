"""``gpu-webhook review -f MANIFEST``: what the webhook would do, offline.

Run as a developer or platform engineer would, on manifest files: the decision, the
messages, the changes and the patched object; exit 0 when allowed, 1 when denied and 2
when the input cannot be used (with a message, never a traceback).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from clikit import TRAINER

Run = Callable[..., subprocess.CompletedProcess[str]]  # the gpu_webhook fixture

ROOT = Path(__file__).resolve().parents[2]

MISMATCH = """\
apiVersion: v1
kind: Pod
metadata: {name: half, namespace: research}
spec:
  containers:
    - name: main
      image: pytorch:2
      resources:
        requests: {nvidia.com/gpu: 1}
        limits: {nvidia.com/gpu: 2}
"""

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: serving}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: server
          image: triton:24
          resources: {limits: {nvidia.com/gpu: 1}}
"""

CPU_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: research}
spec:
  containers: [{name: web, image: nginx}]
"""


def _write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return name


def _json(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    out = orjson.loads(done.stdout)
    assert isinstance(out, list)
    return out


def test_allowed_pod_prints_changes_and_patched_object(gpu_webhook: Run,
                                                        tmp_path: Path) -> None:
    done = gpu_webhook("review", "-f", _write(tmp_path, "pod.yaml", TRAINER))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "Pod research/trainer: ALLOWED"
    assert "  changes: gpu-requests, gpu-tolerations, gpu-node-affinity" in lines
    start = lines.index("  patched object:")
    body = "\n".join(line[4:] for line in lines[start + 1:] if line.startswith("    "))
    patched = yaml.safe_load(body)
    assert patched["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": 2}
    assert patched["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    [term] = patched["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {e["key"]: e["values"] for e in term["matchExpressions"]} == {
        "nvidia.com/gpu.product": ["NVIDIA-A100-SXM4-80GB"],
        "topology.example.com/gpu-rack": ["rack-a", "rack-b"],
    }


def test_review_names_the_policy_it_decided_by(gpu_webhook: Run, tmp_path: Path) -> None:
    manifest = _write(tmp_path, "pod.yaml", TRAINER)
    done = gpu_webhook("review", "-f", manifest)
    assert ("gpu-webhook review: policy shared-gpu-cluster (the embedded example policy: "
            "give --policy FILE for the one your cluster serves)") in done.stderr
    policy = str(Path(__file__).resolve().parents[2] / "policies" / "multi-tenant.yaml")
    done = gpu_webhook("review", "-f", manifest, "--policy", policy, "-o", "json")
    assert f"gpu-webhook review: policy shared-gpu-cluster ({policy})" in done.stderr
    assert _json(done)[0]["decision"] == "allowed"  # stdout stays the document alone


def test_denied_pod_exits_1_with_the_message(gpu_webhook: Run, tmp_path: Path) -> None:
    done = gpu_webhook("review", "-f", _write(tmp_path, "pod.yaml", MISMATCH))
    assert done.returncode == 1
    assert done.stdout.startswith(
        "Pod research/half: DENIED (by the mutating webhook)\n"
        '  denied: pod research/half, container "main": nvidia.com/gpu request 1 differs '
        "from limit 2.")
    assert "[rule gpu-requests-match-limits, tenant research]" in done.stdout
    assert "patched object" not in done.stdout


def test_denied_by_the_validating_webhook(gpu_webhook: Run, tmp_path: Path) -> None:
    big = TRAINER.replace("nvidia.com/gpu: 2", "nvidia.com/gpu: 9")
    done = gpu_webhook("review", "-f", _write(tmp_path, "pod.yaml", big))
    assert done.returncode == 1
    assert "DENIED (by the validating webhook)" in done.stdout
    assert "allows at most 8 GPUs per container" in done.stdout
    # Denied: nothing is stored, so no changes are shown as if they were made.
    assert "changes:" not in done.stdout
    assert "patched object" not in done.stdout


def test_an_object_the_webhooks_leave_alone_is_said_to_be_skipped(gpu_webhook: Run,
                                                                   tmp_path: Path) -> None:
    service = ("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: research}\n"
               "spec: {ports: [{port: 80}]}\n")
    done = gpu_webhook("review", "-f", _write(tmp_path, "svc.yaml", service))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        "Service research/web: SKIPPED (the webhooks do not review this kind of object)")
    assert "ALLOWED" not in done.stdout


def test_deployment_template_is_reviewed(gpu_webhook: Run, tmp_path: Path) -> None:
    f = _write(tmp_path, "deploy.yaml", DEPLOYMENT.replace("serving", "research"))
    done = gpu_webhook("review", "-f", f, "-o", "json")
    assert done.returncode == 0, done.stdout
    [r] = _json(done)
    assert (r["kind"], r["namespace"], r["name"], r["decision"]) == (
        "Deployment", "research", "web", "allowed")
    assert all(op["path"].startswith("/spec/template/") for op in r["patch"])
    tpl = r["object"]["spec"]["template"]
    assert tpl["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": 1}
    assert r["object"]["spec"]["replicas"] == 3


def test_multi_document_file_reviews_each(gpu_webhook: Run, tmp_path: Path) -> None:
    service = "apiVersion: v1\nkind: Service\nmetadata: {name: svc}\nspec: {ports: [{port: 80}]}\n"
    text = "---\n".join([TRAINER, MISMATCH, CPU_POD, service]) + "---\n"
    done = gpu_webhook("review", "-f", _write(tmp_path, "all.yaml", text))
    assert done.returncode == 1  # one document is denied
    heads = [line for line in done.stdout.splitlines() if line and not line.startswith(" ")]
    assert heads == [
        "Pod research/trainer: ALLOWED",
        "Pod research/half: DENIED (by the mutating webhook)",
        "Pod research/web: ALLOWED",
        "Service default/svc: SKIPPED (the webhooks do not review this kind of object)",
    ]


@pytest.mark.parametrize(("labels", "decision", "message"), [
    ("gpu.example.com/tenant=inference", "allowed", None),
    ("gpu.example.com/tenant=inference,team=ml", "allowed", None),
    ("gpu.example.com/tenant=other", "denied", "belongs to no GPU tenant"),
    ("", "denied", "belongs to no GPU tenant"),
    (None, "denied", "the webhook does not know its labels, so the tenants chosen by "
                     "namespace labels (inference) cannot match it"),
], ids=["inference", "inference-plus-other-labels", "other-tenant-label", "no-labels",
        "labels-unknown"])
def test_namespace_labels_select_the_selector_tenant(gpu_webhook: Run, tmp_path: Path,
                                                     labels: str | None, decision: str,
                                                     message: str | None) -> None:
    f = _write(tmp_path, "deploy.yaml", DEPLOYMENT)
    given = ["--namespace-labels", labels] if labels is not None else []
    done = gpu_webhook("review", "-f", f, *given, "-o", "json")
    [r] = _json(done)
    assert r["decision"] == decision, r
    assert done.returncode == (0 if decision == "allowed" else 1)
    if message:
        assert message in r["message"]
    else:
        # The inference tenant pins its pods to L4 nodes.
        terms = r["object"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == ["NVIDIA-L4"]


def test_namespace_flag_places_a_manifest_without_one(gpu_webhook: Run,
                                                      tmp_path: Path) -> None:
    text = TRAINER.replace("  namespace: research\n", "")
    f = _write(tmp_path, "pod.yaml", text)
    assert gpu_webhook("review", "-f", f).returncode == 1  # "default" has no tenant
    done = gpu_webhook("review", "-f", f, "--namespace", "research")
    assert done.returncode == 0
    assert done.stdout.startswith("Pod research/trainer: ALLOWED")


def test_json_output_is_parseable(gpu_webhook: Run, tmp_path: Path) -> None:
    f = _write(tmp_path, "all.yaml", TRAINER + "---\n" + MISMATCH)
    done = gpu_webhook("review", "-f", f, "-o", "json")
    allowed, denied = _json(done)
    assert allowed["decision"] == "allowed"
    assert allowed["changes"] == ["gpu-requests", "gpu-tolerations", "gpu-node-affinity"]
    assert isinstance(allowed["patch"], list) and allowed["patch"]
    assert denied["decision"] == "denied"
    assert denied["phase"] == "mutating"
    assert "differs from limit 2" in denied["message"]
    # The rule and tenant, as `test -o json` has them.
    assert denied["rules"] == ["gpu-requests-match-limits"]
    assert denied["tenant"] == allowed["tenant"] == "research"
    assert "patch" not in denied and "object" not in denied


def test_stdin_manifest(gpu_webhook: Run) -> None:
    done = gpu_webhook("review", "-f", "-", stdin=TRAINER)
    assert done.returncode == 0
    assert done.stdout.startswith("Pod research/trainer: ALLOWED")


def test_policy_flag(gpu_webhook: Run, tmp_path: Path) -> None:
    example = (ROOT / "policies" / "multi-tenant.yaml").read_text()
    policy = _write(tmp_path, "policy.yaml", example.replace(
        "namespaces: [research, research-dev]", "namespaces: [research-dev]"))
    done = gpu_webhook("review", "-f", _write(tmp_path, "pod.yaml", TRAINER),
                       "--policy", policy)
    assert done.returncode == 1
    # No --namespace-labels: the labels are unknown, so the selector tenant is not tried.
    assert ('namespace "research" is in no tenant\'s namespaces, and the webhook does not '
            "know its labels") in done.stdout


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (["-f", "missing.yaml"], None, "cannot read missing.yaml: [Errno 2] No such file"),
    (["-f", "."], None, "cannot read ."),
    (["-f", "broken.yaml"], None, "cannot read broken.yaml"),
    (["-f", "-"], "- just\n- a list\n", "each document must be a Kubernetes object"),
    (["-f", "-"], "apiVersion: v1\nmetadata: {name: x}\n",
     "each document must be a Kubernetes object"),
    (["-f", "-", "--namespace-labels", "team"], TRAINER, "--namespace-labels takes k=v"),
    (["-f", "-", "--policy", "nope.yaml"], TRAINER, "nope.yaml: cannot read the file"),
], ids=["missing-file", "directory", "yaml-syntax", "not-an-object", "no-kind",
        "bad-labels", "missing-policy"])
def test_unusable_input_exits_2_without_traceback(gpu_webhook: Run, tmp_path: Path,
                                                  args: list[str], stdin: str | None,
                                                  message: str) -> None:
    _write(tmp_path, "broken.yaml", "metadata: [\n")
    done = gpu_webhook("review", *args, stdin=stdin)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_output_piped_into_head_exits_quietly(console_script: str, tmp_path: Path) -> None:
    # Many documents, so the output outgrows the pipe buffer after head has gone.
    manifest = "---\n".join(TRAINER.replace("name: trainer", f"name: t{i}")
                            for i in range(400))
    _write(tmp_path, "many.yaml", manifest)
    done = subprocess.run(
        f"'{console_script}' review -f many.yaml | head -n 3; exit ${{PIPESTATUS[0]}}",
        shell=True, executable="/bin/bash", capture_output=True, text=True, cwd=tmp_path,
        timeout=120)
    assert done.stdout.splitlines() == [
        "Pod research/t0: ALLOWED",
        "  changes: gpu-requests, gpu-tolerations, gpu-node-affinity",
        "  patched object:",
    ]
    assert "Traceback" not in done.stderr
    assert "BrokenPipeError" not in done.stderr
    assert done.returncode == 141  # 128 + SIGPIPE, as a shell reports for any such command


DRA_FILE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-gpus, namespace: research}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com, count: 2}
---
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: research}
spec:
  containers:
  - {name: trainer, image: pytorch/pytorch, resources: {claims: [{name: gpu}]}}
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: two-gpus}
  tolerations:
  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
"""


def test_review_decides_a_pod_on_the_claim_template_before_it_in_the_file(
        gpu_webhook: Run, tmp_path: Path) -> None:
    path = tmp_path / "dra.yaml"
    path.write_text(DRA_FILE)
    done = gpu_webhook("review", "-f", str(path), "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    template, pod = orjson.loads(done.stdout)
    assert template["changes"] == ["gpu-device-selector"]
    selectors = template["object"]["spec"]["spec"]["devices"]["requests"][0]["exactly"][
        "selectors"]
    assert "NVIDIA-A100-SXM4-80GB" in selectors[0]["cel"]["expression"]
    # The DRA pod keeps its GPU toleration (the example policy strips it from non-GPU pods)
    # and is pinned to the tenant's racks.
    assert pod["decision"] == "allowed"
    assert pod["object"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "gpu-node-affinity" in pod["changes"]


def test_review_refuses_a_pod_whose_template_it_has_not_seen(
        gpu_webhook: Run, tmp_path: Path) -> None:
    path = tmp_path / "dra.yaml"
    path.write_text(DRA_FILE.split("---\n")[1])
    done = gpu_webhook("review", "-f", str(path))
    assert done.returncode == 1
    assert "ResourceClaimTemplate two-gpus, which the webhook has not seen" in done.stdout


def test_spot_placement_is_reviewed_with_the_spot_example(gpu_webhook: Run,
                                                          tmp_path: Path) -> None:
    policy = str(ROOT / "policies" / "examples" / "spot.yaml")
    tolerant = TRAINER.replace("  namespace: research\n", "  namespace: research\n"
                               "  labels: {gpu-webhook.dev/fault-tolerant: \"true\"}\n")
    done = gpu_webhook("review", "-f", _write(tmp_path, "ft.yaml", tolerant),
                       "--policy", policy, "-o", "json")
    assert done.returncode == 0, done.stdout
    [r] = _json(done)
    assert r["changes"][-2:] == ["spot-tolerations", "spot-node-affinity"]
    [term] = r["object"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]
    # Another tenant's pod asking for spot nodes is refused, saying why.
    asks = TRAINER.replace("namespace: research", "namespace: serving").replace(
        "spec:\n", "spec:\n  nodeSelector: {karpenter.sh/capacity-type: spot}\n", 1)
    done = gpu_webhook("review", "-f", _write(tmp_path, "asks.yaml", asks), "--policy", policy)
    assert done.returncode == 1
    assert "tenant serving may not use spot capacity" in done.stdout
    assert "[rule spot-placement, tenant serving]" in done.stdout


def test_a_pod_beyond_its_tenants_quota_is_reviewed_as_borrowed(gpu_webhook: Run,
                                                                tmp_path: Path) -> None:
    # policies/examples/cohorts.yaml: vision holds 8 GPUs of its own; the file's first
    # pod takes them, the second runs on GPUs borrowed from cohort research.
    pods = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": name, "namespace": "vision"},
             "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {
                 "limits": {"nvidia.com/gpu": n}}}]}} for name, n in (("own", 8), ("more", 2))]
    f = _write(tmp_path, "pods.yaml", yaml.safe_dump_all(pods))
    done = gpu_webhook("review", "-f", f, "--policy",
                       str(ROOT / "policies" / "examples" / "cohorts.yaml"), "-o", "json")
    own, more = _json(done)
    assert own["changes"] == ["gpu-requests", "gpu-tolerations"]
    assert more["decision"] == "allowed"
    assert "borrowed" in more["changes"]
    assert any("borrowed from cohort research" in w for w in more["warnings"])
    spec = more["object"]["spec"]
    assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == (
        "gpu-webhook-borrowed", -100, "Never")
    assert more["object"]["metadata"]["labels"] == {"gpu-webhook.dev/borrowed": "true"}
