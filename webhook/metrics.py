"""Prometheus metrics: what the webhook decides, how fast, and with which policy.

Labels stay low-cardinality (webhook, operation, kind, decision, rule, mode, tenant):
never pod names or users.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

ADMISSIONS = Counter(
    "gpu_webhook_admission_requests_total",
    "Admission reviews answered, by webhook, operation, kind and decision.",
    ["webhook", "operation", "kind", "decision"],
    registry=REGISTRY,
)
FINDINGS = Counter(
    "gpu_webhook_rule_findings_total",
    "Policy violations found, by webhook, rule, mode (enforce/warn/audit) and tenant.",
    ["webhook", "rule", "mode", "tenant"],
    registry=REGISTRY,
)
MUTATIONS = Counter(
    "gpu_webhook_mutations_total",
    "Changes made by the mutating webhook, by kind of change.",
    ["change"],
    registry=REGISTRY,
)
BAD_REVIEWS = Counter(
    "gpu_webhook_bad_reviews_total",
    "Requests refused before admission because the body was not a usable AdmissionReview.",
    ["webhook", "status"],
    registry=REGISTRY,
)
ERRORS = Counter(
    "gpu_webhook_errors_total",
    "Reviews the webhook failed to decide (answered as denials).",
    ["webhook"],
    registry=REGISTRY,
)
OVERLOAD = Counter(
    "gpu_webhook_overload_refusals_total",
    "Admission requests answered with an HTTP error because of load, by webhook and "
    "reason: inflight (429, --max-inflight reached), deadline (503, queued past the "
    "deadline), body-timeout (408, the body did not arrive in time).",
    ["webhook", "reason"],
    registry=REGISTRY,
)
INFLIGHT = Gauge(
    "gpu_webhook_inflight_requests",
    "Admission requests being handled now (bounded by --max-inflight).",
    registry=REGISTRY,
)
LATENCY = Histogram(
    "gpu_webhook_admission_duration_seconds",
    "Server-side time to decide a review, from full body to reply.",
    ["webhook"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    registry=REGISTRY,
)
POLICY_GENERATION = Gauge(
    "gpu_webhook_policy_generation",
    "Generation of the policy serving now (increments on each successful load).",
    registry=REGISTRY,
)
POLICY_RELOADS = Counter(
    "gpu_webhook_policy_reloads_total",
    "Policy loads, by result (success or failure).",
    ["result"],
    registry=REGISTRY,
)
POLICY_LAST_SUCCESS = Gauge(
    "gpu_webhook_policy_last_success_timestamp_seconds",
    "Unix time of the last successful policy load.",
    registry=REGISTRY,
)
