"""``gpu-webhook test``: the shipped suites pass, a failing suite reads well, a broken
suite is located like a broken policy."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
Run = Callable[..., subprocess.CompletedProcess[str]]  # the gpu_webhook fixture (conftest.py)

SUITES = Path(__file__).resolve().parent / "suites"


def usage_suite(tmp_path: Path, usage: str) -> Path:
    """A one-case suite against policies/multi-tenant.yaml whose one usage pod is
    ``usage`` (a YAML flow mapping), written to ``tmp_path/suite.yaml``."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicyTest\nmetadata: {name: s}\n"
        f"policy: {ROOT / 'policies' / 'multi-tenant.yaml'}\n"
        f"usage: [{usage}]\n"
        "cases:\n"
        "  - name: c\n"
        "    resource: {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {}}\n"
        "    expect: {outcome: allowed}\n")
    return suite


def test_the_shipped_policy_suites_pass(gpu_webhook: Run) -> None:
    r = gpu_webhook("test", "policies/tests")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout
    # Every example policy has a suite, and the multi-tenant one is covered thoroughly.
    examples = sorted(p.stem for p in (ROOT / "policies" / "examples").glob("*.yaml"))
    for name in examples:
        assert f"policies/examples/{name}.yaml (policy " in r.stdout, name
    multi = json.loads(gpu_webhook("test", "policies/tests/multi-tenant.yaml", "-o",
                                   "json").stdout)[0]
    assert len(multi["cases"]) >= 20
    got = {c["got"] for c in multi["cases"]}
    assert {"allowed", "denied", "warned", "skipped"} <= got
    assert any(c["reserved"] for c in multi["cases"])
    assert r.stdout.rstrip().endswith("0 failed")


def test_a_failing_suite_says_what_differed(gpu_webhook: Run) -> None:
    r = gpu_webhook("test", str(SUITES / "failing.yaml"))
    assert r.returncode == 1, r.stderr
    out = r.stdout
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.lstrip().startswith("CASE"))
    assert header.split() == ["CASE", "EXPECTED", "GOT", "RESULT"]
    assert any(ln.strip().startswith("passes - the last free A100 is reserved")
               and ln.endswith("PASS") for ln in lines)
    # The admitted pod reserved the last A100, so the next case saw it.
    assert ("- outcome: expected allowed, got denied: pod research/full: exceeded quota: "
            "tenant research "
            "would use 25 of its 24 a100 GPUs: 24 in use (job/pretrain 23, pod/ok 1)") in out
    assert "- phase: expected the validating webhook to deny, got mutating" in out
    assert "- rule: expected a quota finding, got gpu-requests-match-limits" in out
    assert ("- message: expected it to contain 'no such words', got 'pod research/mismatch, "
            'container "main": nvidia.com/gpu request 1 differs from limit 2.') in out
    assert ("- changes: expected [gpu-requests, gpu-tolerations], got [gpu-requests, "
            "gpu-tolerations, gpu-node-affinity] (unexpected gpu-node-affinity)") in out
    assert ("- patched /spec/containers/0/resources/requests/nvidia.com~1gpu: expected 2, "
            "got 1") in out
    assert ('- patched /spec/tolerations/3/key: expected "nvidia.com/gpu", got nothing '
            "there (/spec/tolerations has 1 items)") in out
    assert lines[-1] == "1 suite, 4 cases: 1 passed, 3 failed"
    # Names and differences in full: a long name on a line of its own, and the denial
    # to its end (its rule and tenant).
    assert "  expects allowed, but the case before took the last A100" in lines
    assert not any(ln.rstrip().endswith("...") for ln in lines)
    assert any(ln.startswith("      - outcome: expected allowed, got denied:")
               and ln.endswith("[rule quota, tenant research]") for ln in lines)


def test_json_output_carries_the_differences(gpu_webhook: Run) -> None:
    r = gpu_webhook("test", str(SUITES / "failing.yaml"), "-o", "json")
    assert r.returncode == 1
    (suite,) = json.loads(r.stdout)
    assert suite["passed"] is False
    assert [c["result"] for c in suite["cases"]] == ["PASS", "FAIL", "FAIL", "FAIL"]
    assert suite["cases"][1]["rules"] == ["quota"]
    assert suite["cases"][1]["tenant"] == "research"
    assert suite["cases"][1]["name"] == "expects allowed, but the case before took the last A100"
    assert suite["cases"][1]["differences"][0].endswith("[rule quota, tenant research]")
    assert suite["cases"][2]["differences"][0].startswith("phase: expected")


def test_a_broken_suite_names_file_line_and_field(gpu_webhook: Run, tmp_path: Path) -> None:
    suite = tmp_path / "broken.yaml"
    suite.write_text(
        "apiVersion: gpu-webhook.dev/v1alpha1\n"
        "kind: GPUPolicyTest\n"
        "metadata: {name: broken}\n"
        f"policy: {ROOT / 'policies' / 'multi-tenant.yaml'}\n"
        "usage:\n"
        "  - {namespace: research, gpus: 2, prodcut: a100}\n"
        "cases:\n"
        "  - name: typo in expect\n"
        "    resource: {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {}}\n"
        "    expect: {outcome: alowed}\n")
    r = gpu_webhook("test", str(tmp_path))
    assert r.returncode == 2
    assert f"{suite}:6: usage[0].prodcut: unknown field 'prodcut'" in r.stdout
    assert f"{suite}:10: cases[0].expect.outcome: must be 'allowed'" in r.stdout
    assert "1 suite could not run" in r.stdout


def test_a_usage_pod_outside_every_tenant_is_an_error(gpu_webhook: Run, tmp_path: Path
                                                      ) -> None:
    suite = usage_suite(tmp_path, "{namespace: nobody, gpus: 1}")
    r = gpu_webhook("test", str(suite))
    assert r.returncode == 2
    assert "usage[0]: this pod holds no GPU quota under policy shared-gpu-cluster" in r.stdout


def test_a_directory_without_suites_is_a_usage_error(gpu_webhook: Run, tmp_path: Path
                                                     ) -> None:
    (tmp_path / "pod.yaml").write_text("apiVersion: v1\nkind: Pod\n")
    r = gpu_webhook("test", str(tmp_path))
    assert r.returncode == 2
    assert "no policy test suites (kind GPUPolicyTest)" in r.stderr


def test_a_spot_usage_pod_under_a_policy_without_spot_is_an_error(gpu_webhook: Run,
                                                                   tmp_path: Path) -> None:
    suite = usage_suite(tmp_path, "{namespace: research, gpus: 1, spot: true}")
    r = gpu_webhook("test", str(suite))
    assert r.returncode == 2
    assert "usage[0].spot: policy shared-gpu-cluster has no spot capacity (spec.spot)" \
        in r.stdout


def test_a_key_written_twice_in_a_suite_is_an_error(gpu_webhook: Run, tmp_path: Path) -> None:
    # YAML keeps the last of two keys: the first expectation would silently never be
    # checked, and a case written to catch a regression would pass whatever happens.
    suite = tmp_path / "twice.yaml"
    suite.write_text(
        "apiVersion: gpu-webhook.dev/v1alpha1\nkind: GPUPolicyTest\nmetadata: {name: s}\n"
        f"policy: {ROOT / 'policies' / 'multi-tenant.yaml'}\n"
        "cases:\n"
        "  - name: c\n"
        "    resource: {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {}}\n"
        "    expect: {outcome: denied}\n"
        "    expect: {outcome: allowed}\n")
    r = gpu_webhook("test", str(suite))
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"{suite}:9: cases[0].expect: duplicate key 'expect' (first at line 8)"
            in r.stdout), r.stdout
    assert "1 suite could not run" in r.stdout
