"""A hypothesis state machine over the in-memory usage store and quota admission:
random sequences of GPU pod admissions (dry runs and real), pods appearing and ending,
and time passing (reservations expiring), against ``policies/multi-tenant.yaml``.

The machine keeps its own model of what is held: the pods it saw appear (until they
end) and the reservations of the pods it admitted (until their pod appears or ends, or
the TTL passes). From the model alone it knows, before each admission, whether the pod
fits under every cap of its tenant (tenant GPUs, per product, pods, per resource,
per-namespace), so both bounds are checked: a pod that fits is never refused on quota
(a store that refuses everything, or counts what it no longer holds, fails here), and
one that does not is never admitted where quota is enforced. After every step the
store's usage is the model's, for every tenant and namespace; for every tenant whose
quota is enforced no total is negative and none is over its cap.

A pod appears only while its reservation lives: one that shows up after the TTL is the
documented "watch lags by more than the TTL" case of docs/quota.md, where the cap is
not guaranteed (the first long run found exactly that sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from fuzzkit import POLICY, POLICY_FILE, PRODUCT_LABEL, RACK_LABEL
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule
from kit import validating

from webhook.engine.charge import Charge, charge_of_pod
from webhook.k8s.review import parse_review, request_review
from webhook.policy.load import load_file
from webhook.policy.model import Mode, QuotaLimits, Rule
from webhook.quota.store import MemoryStore
from webhook.quota.usage import Totals

SPEC = load_file(POLICY_FILE).spec
NAMESPACE_LABELS = {"inference-a": {"gpu.example.com/tenant": "inference"}}
PRODUCTS = {"a100": "NVIDIA-A100-SXM4-80GB", "h100": "NVIDIA-H100-80GB-HBM3",
            "l4": "NVIDIA-L4"}
EPS = 1e-9
Admitted = tuple[str, dict[str, Any], float]  # uid, pod, when it was admitted
TENANTS = {t.name: t for t in SPEC.tenants}


@dataclass
class Held:
    """What the model knows one pod holds: its charge, and, until the pod is seen, the
    time its reservation was made (it counts until that time + the TTL)."""

    charge: Charge
    reserved_at: float | None


@dataclass
class Sum:
    """What the model's pods hold in one scope (a tenant or a namespace)."""

    gpus: float = 0.0
    pods: int = 0
    products: dict[str, float] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=dict)

    def add(self, c: Charge) -> None:
        self.gpus += c.gpus
        self.pods += c.pods
        if c.product is not None:
            self.products[c.product] = self.products.get(c.product, 0.0) + c.gpus
        for r, n in c.resources.items():
            self.resources[r] = self.resources.get(r, 0.0) + n

    def fits(self, c: Charge, cap: QuotaLimits | None) -> bool:
        """Whether ``c`` on top of this usage stays within ``cap`` (None: no cap)."""
        if cap is None:
            return True
        if cap.gpus is not None and self.gpus + c.gpus > cap.gpus + EPS:
            return False
        if cap.pods is not None and self.pods + c.pods > cap.pods:
            return False
        if (c.product is not None and c.product in cap.products
                and self.products.get(c.product, 0.0) + c.gpus > cap.products[c.product] + EPS):
            return False
        return all(self.resources.get(r, 0.0) + n <= cap.resources[r] + EPS
                   for r, n in c.resources.items() if r in cap.resources)


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
        self.held: dict[str, Held] = {}  # the model: uid -> what it holds

    def _usage(self, tenant: str | None = None, namespace: str | None = None) -> Sum:
        out = Sum()
        for h in self.held.values():
            if h.reserved_at is not None and self.now - h.reserved_at >= POLICY.reservation_ttl:
                continue  # never seen within the TTL: the reservation is gone
            if (tenant is None or h.charge.tenant == tenant) and (
                    namespace is None or h.charge.namespace == namespace):
                out.add(h.charge)
        return out

    def _fits(self, c: Charge) -> bool:
        quota = TENANTS[c.tenant].quota
        if quota is None:
            return True
        return (self._usage(tenant=c.tenant).fits(c, quota)
                and self._usage(namespace=c.namespace).fits(c, quota.namespaces.get(
                    c.namespace)))

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
        charge = charge_of_pod(pod, POLICY, labels(namespace))
        assert charge is not None  # every namespace drawn is a tenant's
        fits = self._fits(charge)
        req = parse_review(orjson.dumps(request_review(pod, dry_run=dry_run)))
        d = validating(req, POLICY, labels, self.store)
        on_quota = [f for f in d.findings if f.rule is Rule.QUOTA]
        event("quota denial" if on_quota else f"admission {d.outcome}")
        event("fits under every cap" if fits else "over a cap")
        if fits:
            # What fits is admitted: no quota finding (a pod refused, or warned, for a
            # cap it does not cross), whatever the other rules say of the pod.
            assert not on_quota, (charge, self._usage(tenant=charge.tenant), d.message)
        elif self._enforced(charge.tenant):
            assert not d.allowed, (charge, self._usage(tenant=charge.tenant))
        if not d.allowed or dry_run:
            return None
        if fits:
            # Reserved. Over a cap in warn mode it is admitted, warned, and reserves nothing.
            self.held[uid] = Held(charge, self.now)
        return (uid, pod, self.now)

    def _enforced(self, tenant: str) -> bool:
        return POLICY.mode_for(Rule.QUOTA, POLICY.by_name[tenant]) is Mode.ENFORCE

    @rule(pod=admitted)
    def appears(self, pod: Admitted | None) -> None:
        """The admitted pod shows up in the cluster (watch event), within the TTL."""
        if pod is None or self.now - pod[2] >= POLICY.reservation_ttl:
            return
        uid, obj, _ = pod
        ns = obj["metadata"]["namespace"]
        charge = charge_of_pod(obj, POLICY, labels(ns))
        assert charge is not None
        self.store.pod_seen(uid, charge)
        self.held[uid] = Held(charge, None)  # counted as itself from now on

    @rule(pod=consumes(admitted))
    def ends(self, pod: Admitted | None) -> None:
        """The pod is deleted or finishes (or never appeared: a no-op)."""
        if pod is None:
            return
        self.store.pod_seen(pod[0], None)
        self.held.pop(pod[0], None)

    @rule(seconds=st.sampled_from([1.0, 10.0, 30.0, 61.0, 300.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def usage_is_what_the_model_holds(self) -> None:
        """The store counts exactly the pods seen and the reservations still live: none
        lost (room given twice) and none kept past its pod or its TTL (room never
        given back)."""
        view = self.store.view()
        for name in TENANTS:
            self._same(view.tenant(name), self._usage(tenant=name), name)
        for ns in ("research", "research-dev", "notebooks", "inference-a"):
            self._same(view.namespace(ns), self._usage(namespace=ns), ns)

    @staticmethod
    def _same(total: Totals, model: Sum, scope: str) -> None:
        assert abs(total.gpus - model.gpus) <= EPS and total.pods == model.pods, (
            scope, total, model)
        for key in {*total.products, *model.products}:
            assert abs(total.products.get(key, 0.0) - model.products.get(key, 0.0)) <= EPS, (
                scope, total, model)
        for key in {*total.resources, *model.resources}:
            assert abs(total.resources.get(key, 0.0) - model.resources.get(key, 0.0)) <= EPS, (
                scope, total, model)

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
            if not self._enforced(tenant.name):
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

