"""deploy/monitoring: the Grafana dashboard and the PrometheusRule parse, have the shape
their consumers expect, and query only metrics a running server exposes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from metricskit import ROOT, Server, pod_review

MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "dashboard.json"
RULES = MONITORING / "prometheus-rule.yaml"

# PromQL words that are not metric names: functions, operators, modifiers, keywords.
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (labels, functions and strings removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # range selectors
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\{?\w+\}?", "", e)  # Grafana variables
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue  # a function call or a keyword
        if re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def dashboard_exprs() -> list[str]:
    d: dict[str, Any] = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in d["templating"]["list"] if v.get("definition")]
    return exprs


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["spec"]["groups"] for r in g["rules"]]


def test_the_tenant_of_each_namespace_is_a_series_to_join_dcgm_on(server: Server) -> None:
    # multi-tenant.yaml names research and research-dev (tenant research, a100 or h100:
    # no single product) and notebooks (a100 only); inference goes by namespace label,
    # which a server without a cluster never sees.
    tenants = {dict(labels)["namespace"]: (dict(labels)["tenant"], dict(labels)["product"])
               for (name, labels), v in server.samples().items()
               if name == "gpu_webhook_namespace_tenant" and v == 1}
    assert tenants == {"research": ("research", ""), "research-dev": ("research", ""),
                       "notebooks": ("notebooks", "a100")}


def test_metric_name_extraction() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, webhook) '
                        '(rate(gpu_webhook_admission_duration_seconds_bucket{x="a{b}"}[5m]))) '
                        "> 0.1") == {"gpu_webhook_admission_duration_seconds_bucket"}
    assert metric_names("a_total / (b > 0) and c - time() < 14 * 86400") == {
        "a_total", "b", "c"}
    assert metric_names("label_values(gpu_webhook_quota_limit, tenant)") == {
        "gpu_webhook_quota_limit", "tenant"}  # label_values' label argument is a name too


def test_every_expression_uses_metrics_the_server_exposes(server: Server) -> None:
    # Give the labelled families a sample: a decision, a finding, a mutation, a bad review.
    server.post("/mutate", pod_review("ok", "research"))
    server.post("/mutate", pod_review("bad", "research", 2, request=1))
    server.client.post(server.url + "/validate", content=b"{}")
    exposed = server.metric_names()
    labels = {"tenant", "kind"}  # label arguments of Grafana's label_values()
    used: dict[str, set[str]] = {}
    for expr in dashboard_exprs() + rule_exprs():
        for name in metric_names(expr) - labels:
            used.setdefault(name, set()).add(expr)
    assert used, "no expressions found"
    # Series from elsewhere: NVIDIA's dcgm-exporter, Prometheus's own scrape health, and
    # the recording rules of prometheus-rule.yaml.
    external = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL", "up"}
    recorded = {r["record"] for g in yaml.safe_load(RULES.read_text())["spec"]["groups"]
                for r in g["rules"] if "record" in r}
    unknown = {n: sorted(e) for n, e in used.items()
               if n not in exposed | external | recorded}
    assert not unknown, f"expressions use metrics the server does not expose: {unknown}"
    # The must-haves are all on the dashboard.
    for needed in ("gpu_webhook_admission_requests_total", "gpu_webhook_rule_findings_total",
                   "gpu_webhook_admission_duration_seconds_bucket", "gpu_webhook_quota_used",
                   "gpu_webhook_quota_limit", "gpu_webhook_policy_reloads_total",
                   "gpu_webhook_certificate_expiry_timestamp_seconds"):
        assert any(needed in e for e in dashboard_exprs()), needed


def test_dashboard_shape() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["title"] and p["type"] in {"timeseries", "stat", "bargauge", "gauge", "table"}
        assert set(p["gridPos"]) == {"x", "y", "w", "h"}
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"])
        assert p["datasource"]["uid"] == "${datasource}"
    variables = {v["name"] for v in d["templating"]["list"]}
    for expr in dashboard_exprs():
        for var in re.findall(r"\$(\w+)", expr):
            assert var in variables or var.startswith("__"), var


_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def test_prometheus_rule_shape() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == "PrometheusRule"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(doc["spec"]) == {"groups"}
    alerts = []
    for g in doc["spec"]["groups"]:
        assert set(g) <= {"name", "interval", "rules", "limit", "partial_response_strategy"}
        assert g["name"] and g["rules"]
        for r in g["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations",
                              "keep_firing_for"}
            assert ("alert" in r) != ("record" in r)
            assert isinstance(r["expr"], str) and r["expr"].strip()
            if "for" in r:
                assert _DURATION.match(r["for"]), r["for"]
            if "alert" in r:
                assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", r["alert"])
                assert r["labels"]["severity"] in {"critical", "warning", "info"}
                assert r["annotations"]["summary"] and r["annotations"]["description"]
                alerts.append(r)
    exprs = {r["alert"]: r["expr"] for r in alerts}
    # The alerts, by what they watch.
    assert "decision=\"denied\"" in exprs["GPUWebhookHighDenyRate"]
    assert "histogram_quantile(0.99" in exprs["GPUWebhookLatencyHigh"]
    assert "> 0.1" in exprs["GPUWebhookLatencyHigh"]
    assert 'result="failure"' in exprs["GPUWebhookPolicyReloadFailed"]
    assert "14 * 86400" in exprs["GPUWebhookCertificateExpiringSoon"]
    assert "> 0.9" in exprs["GPUWebhookQuotaNearlyFull"]


@pytest.mark.parametrize("path", [DASHBOARD, RULES], ids=lambda p: p.name)
def test_files_parse(path: Any) -> None:
    text = path.read_text()
    assert (json.loads(text) if path.suffix == ".json" else yaml.safe_load(text))
