"""The alerts of deploy/monitoring/prometheus-rule.yaml, run by Prometheus's own rule
engine: ``promtool test rules`` on synthetic series (dcgm-exporter's GPU activity, the
webhook's namespace -> tenant series, scrape health), not only parsed.

promtool is built from the Go module proxy by ``tools/promtool.sh`` (cached after the
first build; ``make test`` builds it before pytest). A missing promtool fails these
tests: an alert nobody ran is not known to fire.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from metricskit import ROOT

RULES = ROOT / "deploy" / "monitoring" / "prometheus-rule.yaml"
BUILD = ROOT / "tools" / "promtool.sh"


@pytest.fixture(scope="module")
def promtool() -> str:
    out = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"tools/promtool.sh could not build promtool:\n{out.stderr}"
    path = out.stdout.strip().splitlines()[-1]
    assert Path(path).is_file(), path
    return path


def rules() -> dict[str, Any]:
    """The PrometheusRule's groups as a plain rule file (what the Operator hands
    Prometheus), and each alert by name."""
    return {"groups": yaml.safe_load(RULES.read_text())["spec"]["groups"]}


def alert(name: str) -> dict[str, Any]:
    for g in rules()["groups"]:
        for r in g["rules"]:
            if r.get("alert") == name:
                return dict(r)
    raise AssertionError(f"no alert {name}")


def annotations(name: str, labels: dict[str, str], value: str = "") -> dict[str, str]:
    """The alert's annotations as Prometheus renders them for these labels (the only
    template parts used: ``$labels.x`` and ``$value | humanizePercentage``)."""
    out = {}
    for k, text in alert(name)["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        out[k] = text.replace("{{ $value | humanizePercentage }}", value).strip()
    return out


def expected(name: str, labels: dict[str, str], value: str = "") -> dict[str, Any]:
    severity = alert(name)["labels"]["severity"]
    return {"exp_labels": {**labels, "severity": severity},
            "exp_annotations": annotations(name, labels, value)}


def run(promtool: str, tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules()))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}))
    out = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def dcgm(metric: str, namespace: str, pod: str, gpu: str = "0") -> str:
    # dcgm-exporter's labels with the kubelet pod-resources mapping on.
    return (f'{metric}{{gpu="{gpu}",UUID="GPU-{pod}-{gpu}",Hostname="node-1",'
            f'namespace="{namespace}",pod="{pod}",container="main"}}')


def info(namespace: str, tenant: str, product: str, instance: str) -> str:
    return (f'gpu_webhook_namespace_tenant{{namespace="{namespace}",tenant="{tenant}",'
            f'product="{product}",job="gpu-webhook",instance="{instance}"}}')


def activity(namespace: str, pod: str, value: float) -> dict[str, Any]:
    return {"labels": f'namespace_pod:gpu_activity:max{{namespace="{namespace}",pod="{pod}"}}',
            "value": value}


def test_a_gpu_pod_idle_for_30_minutes_is_flagged_with_its_tenant(promtool: str,
                                                                 tmp_path: Path) -> None:
    series = [
        # Profiling metrics on: the graphics engine's active ratio (0..1).
        (dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "research", "idle-0"), "0.01x45"),
        (dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "research", "busy-0"), "0.9x45"),
        # Where both are exported, the profiling ratio wins over the coarse GPU_UTIL.
        (dcgm("DCGM_FI_DEV_GPU_UTIL", "research", "busy-0"), "1x45"),
        # Profiling off (e.g. L4s): GPU_UTIL in percent.
        (dcgm("DCGM_FI_DEV_GPU_UTIL", "serving", "l4-idle"), "2x45"),
        (dcgm("DCGM_FI_DEV_GPU_UTIL", "serving", "l4-busy"), "70x45"),
        # Idle, then busy after 20 minutes: never 30 minutes idle.
        (dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "research", "woke-up"), "0x20 0.8x25"),
        # A namespace of no tenant is charged to nobody: not flagged.
        (dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "sandbox", "stray"), "0x45"),
        # Two webhook replicas expose the same info series: counted once.
        (info("research", "research", "", "10.0.0.1:8443"), "1x45"),
        (info("research", "research", "", "10.0.0.2:8443"), "1x45"),
        (info("serving", "inference", "l4", "10.0.0.1:8443"), "1x45"),
    ]
    idle = {"alertname": "GPUPodIdle", "namespace": "research", "pod": "idle-0",
            "tenant": "research"}
    l4 = {"alertname": "GPUPodIdle", "namespace": "serving", "pod": "l4-idle",
          "tenant": "inference"}
    strip = ("alertname",)
    run(promtool, tmp_path, [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "alert_rule_test": [
            # Idle for 20 minutes: pending, not yet firing.
            {"eval_time": "20m", "alertname": "GPUPodIdle", "exp_alerts": []},
            {"eval_time": "35m", "alertname": "GPUPodIdle", "exp_alerts": [
                expected("GPUPodIdle", {k: v for k, v in idle.items() if k not in strip},
                         "1%"),
                expected("GPUPodIdle", {k: v for k, v in l4.items() if k not in strip},
                         "2%"),
            ]},
        ],
        "promql_expr_test": [{
            "expr": "namespace_pod:gpu_activity:max",
            "eval_time": "10m",
            "exp_samples": [
                activity("research", "busy-0", 0.9),
                activity("research", "idle-0", 0.01),
                activity("research", "woke-up", 0),
                activity("sandbox", "stray", 0),
                activity("serving", "l4-busy", 0.7),
                activity("serving", "l4-idle", 0.02),
            ],
        }],
    }])


def test_the_webhook_down_alerts(promtool: str, tmp_path: Path) -> None:
    a, b = "10.0.0.1:8443", "10.0.0.2:8443"
    down = expected("GPUWebhookDown", {})
    replica_b = expected("GPUWebhookReplicaDown",
                         {"job": "gpu-webhook", "instance": b})
    run(promtool, tmp_path, [
        {   # One of two replicas down: a warning for it, the webhook is not down.
            "interval": "1m",
            "input_series": [{"series": f'up{{job="gpu-webhook",instance="{a}"}}',
                              "values": "1x20"},
                             {"series": f'up{{job="gpu-webhook",instance="{b}"}}',
                              "values": "0x20"}],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "GPUWebhookReplicaDown", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "GPUWebhookReplicaDown",
                 "exp_alerts": [replica_b]},
                {"eval_time": "15m", "alertname": "GPUWebhookDown", "exp_alerts": []},
            ],
        },
        {   # Both down after 5 minutes: down once 3 minutes have passed.
            "interval": "1m",
            "input_series": [{"series": f'up{{job="gpu-webhook",instance="{i}"}}',
                              "values": "1x5 0x15"} for i in (a, b)],
            "alert_rule_test": [
                {"eval_time": "7m", "alertname": "GPUWebhookDown", "exp_alerts": []},
                {"eval_time": "10m", "alertname": "GPUWebhookDown", "exp_alerts": [down]},
            ],
        },
        {   # Never scraped at all (no target: the Service or ServiceMonitor is gone).
            "interval": "1m",
            "input_series": [{"series": 'up{job="other"}', "values": "1x10"}],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "GPUWebhookDown", "exp_alerts": [down]},
            ],
        },
    ])


def test_configurations_differing_from_the_policy_alert_after_five_minutes(
        promtool: str, tmp_path: Path) -> None:
    mutating = "MutatingWebhookConfiguration gpu-webhook"
    series = [  # the leader's gauge: drift written back at once, and drift that stays
        (f'gpu_webhook_configuration_drift{{configuration="{mutating}",'
         'instance="10.0.0.1:8443",job="gpu-webhook"}', "0x5 2x15"),
        ('gpu_webhook_configuration_drift{configuration="ValidatingWebhookConfiguration '
         'gpu-webhook",instance="10.0.0.1:8443",job="gpu-webhook"}', "0x5 1 0x14"),
    ]
    labels = {"configuration": mutating}
    fired = {"exp_labels": {**labels, "severity": alert(
        "GPUWebhookConfigurationDrift")["labels"]["severity"]},
        "exp_annotations": {k: re.sub(r"\{\{ \$labels\.configuration \}\}", mutating,
                                      v).strip()
                            for k, v in alert("GPUWebhookConfigurationDrift")[
                                "annotations"].items()}}
    run(promtool, tmp_path, [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "alert_rule_test": [
            {"eval_time": "8m", "alertname": "GPUWebhookConfigurationDrift",
             "exp_alerts": []},
            {"eval_time": "14m", "alertname": "GPUWebhookConfigurationDrift",
             "exp_alerts": [fired]},
        ],
    }])
