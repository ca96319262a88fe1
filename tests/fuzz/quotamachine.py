"""A hypothesis state machine over the in-memory usage store and quota admission:
random sequences of GPU pod admissions (dry runs and real), pods appearing and ending,
and time passing (reservations expiring), against ``policies/multi-tenant.yaml``.

After every step, for every tenant whose quota is enforced: no total is negative and
none is over its cap (tenant GPUs, per product, pods, per-namespace GPUs).

A pod appears only while its reservation lives: one that shows up after the TTL is the
documented "watch lags by more than the TTL" case of docs/quota.md, where the cap is
not guaranteed (the first long run found exactly that sequence).
"""

from __future__ import annotations

from typing import Any

import orjson
from fuzzkit import POLICY, POLICY_FILE, PRODUCT_LABEL, RACK_LABEL
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule
from kit import validating

from webhook.engine.charge import charge_of_pod
from webhook.k8s.review import parse_review, request_review
from webhook.policy.load import load_file
from webhook.policy.model import Mode
from webhook.quota.store import MemoryStore

SPEC = load_file(POLICY_FILE).spec
NAMESPACE_LABELS = {"inference-a": {"gpu.example.com/tenant": "inference"}}
PRODUCTS = {"a100": "NVIDIA-A100-SXM4-80GB", "h100": "NVIDIA-H100-80GB-HBM3",
            "l4": "NVIDIA-L4"}
EPS = 1e-9
Admitted = tuple[str, dict[str, Any], float]  # uid, pod, when it was admitted


def labels(namespace: str) -> dict[str, str] | None:
    return NAMESPACE_LABELS.get(namespace)


def gpu_pod(uid: str, namespace: str, resource: str, count: int, product: str,
            init: int) -> dict[str, Any]:
    """A pod as it reaches the validating webhook: request = limit, pinned."""
    res = {"limits": {resource: count}, "requests": {resource: count}}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "x", "resources": res}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": PRODUCT_LABEL, "operator": "In", "values": [PRODUCTS[product]]},
                {"key": RACK_LABEL, "operator": "In", "values": ["rack-a"]}]}]}}},
    }
    if init:
        spec["initContainers"] = [{"name": "warmup", "image": "x", "resources": {
            "limits": {resource: init}, "requests": {resource: init}}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p-{uid}", "namespace": namespace, "uid": uid},
            "spec": spec}


class QuotaMachine(RuleBasedStateMachine):
    admitted = Bundle("admitted")

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.store = MemoryStore(ttl=POLICY.reservation_ttl, clock=lambda: self.now)
        self.n = 0
        self.seen: set[str] = set()

    @rule(target=admitted,
          namespace=st.sampled_from(["research", "research-dev", "notebooks", "inference-a"]),
          resource=st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb",
                                    "nvidia.com/gpu.shared"]),
          count=st.integers(1, 9), product=st.sampled_from(["a100", "h100", "l4"]),
          init=st.sampled_from([0, 0, 0, 2, 12]), dry_run=st.booleans())
    def admit(self, namespace: str, resource: str, count: int, product: str, init: int,
              dry_run: bool) -> Admitted | None:
        self.n += 1
        uid = f"uid-{self.n}"
        pod = gpu_pod(uid, namespace, resource, count, product, init)
        req = parse_review(orjson.dumps(request_review(pod, dry_run=dry_run)))
        d = validating(req, POLICY, labels, self.store)
        event("quota denial" if any(f.rule.value == "quota" for f in d.findings)
              else f"admission {d.outcome}")
        if d.allowed and not dry_run:
            return (uid, pod, self.now)
        return None

    @rule(pod=admitted)
    def appears(self, pod: Admitted | None) -> None:
        """The admitted pod shows up in the cluster (watch event), within the TTL."""
        if pod is None or self.now - pod[2] >= POLICY.reservation_ttl:
            return
        uid, obj, _ = pod
        ns = obj["metadata"]["namespace"]
        self.store.pod_seen(uid, charge_of_pod(obj, POLICY, labels(ns)))
        self.seen.add(uid)

    @rule(pod=consumes(admitted))
    def ends(self, pod: Admitted | None) -> None:
        """The pod is deleted or finishes (or never appeared: a no-op)."""
        if pod is None:
            return
        self.store.pod_seen(pod[0], None)

    @rule(seconds=st.sampled_from([1.0, 10.0, 30.0, 61.0, 300.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def within_caps(self) -> None:
        view = self.store.view()
        for tenant in SPEC.tenants:
            if tenant.quota is None:
                continue
            total = view.tenant(tenant.name)
            assert total.gpus >= -EPS and total.pods >= 0, total
            assert all(v >= -EPS for v in total.resources.values()), total
            assert all(v >= -EPS for v in total.products.values()), total
            if POLICY.mode_for(_quota_rule(), POLICY.by_name[tenant.name]) is not Mode.ENFORCE:
                continue  # warn mode: over quota is allowed, with a warning
            q = tenant.quota
            if q.gpus is not None:
                assert total.gpus <= q.gpus + EPS, (tenant.name, total)
            if q.pods is not None:
                assert total.pods <= q.pods, (tenant.name, total)
            for product, cap in q.products.items():
                assert total.products.get(product, 0.0) <= cap + EPS, (tenant.name, total)
            for resource, cap in q.resources.items():
                assert total.resources.get(resource, 0.0) <= cap + EPS, (tenant.name, total)
            for ns, nq in q.namespaces.items():
                ns_total = view.namespace(ns)
                assert ns_total.gpus >= -EPS
                if nq.gpus is not None:
                    assert ns_total.gpus <= nq.gpus + EPS, (ns, ns_total)


def _quota_rule() -> Any:
    from webhook.policy.model import Rule

    return Rule.QUOTA
