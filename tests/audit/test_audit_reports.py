"""The audit's PolicyReports: running pods decided by the admission pipeline, and each
finding a result of the pod it concerns, in the shape of the ``wgpolicyk8s.io/v1alpha2``
PolicyReport CRD that Kyverno ships (the fixture under tests/e2e/crds): enforce- and
audit-mode findings ``fail``, warn-mode ones ``warn``, one report per namespace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kit import policy_yaml

from webhook.admission.audit import Finding, RuleFinding, audit, policy_reports, same_results
from webhook.policy.compiled import compile_policy
from webhook.policy.load import load_text

CRD = Path(__file__).parents[1] / "e2e" / "crds" / "wgpolicyk8s.io_policyreports.yaml"
POLICY = policy_yaml("audit-unit", """\
  gpuResources: {names: [nvidia.com/gpu]}
  tenants:
    - name: team
      namespaces: [team]
      maxGpusPerPod: 8
      quota: {gpus: 4}
    - name: trial
      namespaces: [trial]
      maxGpusPerPod: 1
      mode: warn
    - name: quiet
      namespaces: [quiet]
      maxGpusPerPod: 1
      mode: audit
""")


def pod(name: str, namespace: str, gpus: int, created: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "creationTimestamp": created},
            "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {
                "limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": "Running"}}


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    policy = compile_policy(load_text(POLICY, "audit-unit.yaml"))
    pods = [pod("b", "team", 2, "2026-01-01T00:00:02Z"),  # the newest of team: over the cap
            pod("a", "team", 3, "2026-01-01T00:00:01Z"),
            pod("w", "trial", 2, "2026-01-01T00:00:03Z"),
            pod("q", "quiet", 2, "2026-01-01T00:00:04Z"),
            pod("fine", "trial", 1, "2026-01-01T00:00:05Z")]
    return policy_reports(audit(policy, pods, [], lambda ns: None), policy.name, 1.5e9)


@pytest.mark.parametrize(("namespace", "pod_name", "rule", "result", "mode"), [
    ("team", "b", "quota", "fail", "enforce"),
    ("trial", "w", "max-gpus-per-pod", "warn", "warn"),
    ("quiet", "q", "max-gpus-per-pod", "fail", "audit"),
])
def test_each_finding_is_a_result_of_its_pod(reports: dict[str, dict[str, Any]],
                                             namespace: str, pod_name: str, rule: str,
                                             result: str, mode: str) -> None:
    [r] = reports[namespace]["results"]
    assert (r["rule"], r["result"], r["properties"]) == (rule, result, {"mode": mode})
    assert r["resources"] == [{"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                               "name": pod_name, "uid": f"uid-{pod_name}"}]
    assert (r["source"], r["policy"], r["timestamp"]) == (
        "gpu-webhook", "audit-unit", {"seconds": 1500000000, "nanos": 0})
    assert reports[namespace]["summary"][result] == 1


def test_the_newest_pod_over_the_cap_is_the_one_reported(
        reports: dict[str, dict[str, Any]]) -> None:
    [r] = reports["team"]["results"]
    assert r["message"].startswith("pod team/b: exceeded quota: tenant team would use 5 of "
                                   "its 4 GPUs")


def test_one_report_per_namespace_with_findings(reports: dict[str, dict[str, Any]]) -> None:
    assert sorted(reports) == ["quiet", "team", "trial"]
    for ns, rep in reports.items():
        assert (rep["apiVersion"], rep["kind"]) == ("wgpolicyk8s.io/v1alpha2", "PolicyReport")
        assert rep["metadata"] == {"name": "gpu-webhook", "namespace": ns, "labels": {
            "app.kubernetes.io/managed-by": "gpu-webhook"}}


def test_reports_have_only_fields_the_crd_declares(reports: dict[str, dict[str, Any]]) -> None:
    # The API server prunes undeclared fields: a result field the CRD does not name
    # would never reach Policy Reporter.
    [crd] = [d for d in yaml.safe_load_all(CRD.read_text()) if d]
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    result = schema["results"]["items"]
    for rep in reports.values():
        assert set(rep) - {"apiVersion", "kind", "metadata"} <= set(schema)
        assert set(rep["summary"]) <= set(schema["summary"]["properties"])
        for r in rep["results"]:
            assert set(r) <= set(result["properties"])
            assert set(result.get("required", [])) <= set(r)
            assert r["result"] in result["properties"]["result"]["enum"]
            ref = result["properties"]["resources"]["items"]["properties"]
            assert all(set(x) <= set(ref) for x in r["resources"])
            assert all(isinstance(v, str) for v in r["properties"].values())


def test_a_mutation_alone_is_no_result_and_timestamps_do_not_make_a_change() -> None:
    ref = {"apiVersion": "v1", "kind": "Pod", "namespace": "n", "name": "p", "uid": "u"}
    changed = Finding("pod n/p", "changed", "would change: tolerations", ref, ())
    assert policy_reports([changed], "p", 1.0) == {}
    found = Finding("pod n/p", "refused", "no", ref, (RuleFinding("quota", "enforce", "no"),))
    a = policy_reports([found], "p", 1.0)["n"]["results"]
    b = policy_reports([found], "p", 2.0)["n"]["results"]
    assert a != b and same_results(a, b)
