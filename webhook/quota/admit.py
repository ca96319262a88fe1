"""Quota at admission time: the glue between the validating engine and a usage store.

Workloads and dry-run pods are checked against the usage this replica sees. A real pod
creation is checked *inside* the store's atomic reservation, so two pods that each fit
alone can never both be admitted when together they do not.
"""

from __future__ import annotations

from collections.abc import Callable

from webhook.engine import messages
from webhook.engine.decision import Ask, Checker, Decision
from webhook.engine.validate import OWNED, QuotaCheck
from webhook.k8s.review import AdmissionRequest
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Mode, Rule
from webhook.quota.check import UsageView, check_pod, check_workload
from webhook.quota.store import ReservationUnavailable, UsageStore
from webhook.quota.usage import Charge, owner_of
from webhook.server import metrics


def precheck(current: Callable[[], UsageStore | None]) -> QuotaCheck:
    """The engine's quota hook: everything but the atomic commit of a real pod.

    ``current`` returns the store in use at each call: `serve` swaps the cluster's ledger
    store in once the watches start, and dry runs and workload checks must read the same
    usage as the commits."""

    def run(check: Checker, req: AdmissionRequest, ask: Ask) -> None:
        tenant = check.tenant
        store = current()
        if store is None or tenant is None or (
                tenant.quota is None and not tenant.namespace_quota):
            return
        if not ask.is_pod:
            check_workload(check, tenant, ask, store.view())
        elif req.dry_run:
            # Checked, never reserved: a dry run must leave no trace.
            check_pod(check, tenant, ask, store.view())

    return run


def needs_commit(decision: Decision, req: AdmissionRequest, policy: CompiledPolicy) -> bool:
    ask = decision.ask
    if not decision.allowed or ask is None or not ask.is_pod or req.dry_run:
        return False
    tenant = policy.by_name.get(ask.tenant)
    return tenant is not None and (tenant.quota is not None or bool(tenant.namespace_quota))


async def commit(decision: Decision, req: AdmissionRequest, policy: CompiledPolicy,
                 store: UsageStore, budget: float) -> None:
    """Reserve the pod's quota atomically; turn the decision into a denial (or warning)
    when it does not fit or the shared state cannot be reached."""
    ask = decision.ask
    assert ask is not None and req.object is not None
    tenant = policy.by_name[ask.tenant]
    meta = req.object.get("metadata") or {}
    key = str(meta.get("uid") or f"{req.namespace}/{meta.get('name') or req.name}")
    charge = Charge(ask.tenant, ask.namespace, owner_of(req.object), ask.product,
                    dict(ask.resources), ask.gpus)
    outcome: list[Decision] = []

    def fits(view: UsageView) -> bool:
        # Re-run on every attempt of the compare-and-swap loop, against fresh state.
        trial = Decision(subject=decision.subject, tenant=decision.tenant)
        check = Checker(policy, tenant, decision.subject, OWNED, trial)
        check_pod(check, tenant, ask, view)
        outcome[:] = [trial]
        return trial.allowed

    try:
        await store.reserve(key, charge, fits, budget,
                            name=f"{req.namespace}/{meta.get('name') or req.name}")
    except ReservationUnavailable as exc:
        metrics.RESERVATIONS_UNAVAILABLE.inc()
        check = Checker(policy, tenant, decision.subject, OWNED, decision)
        text = messages.quota_unavailable(str(exc))
        check.report(Rule.QUOTA, text, at_most=Mode.WARN if policy.quota_fail_open else None)
        check.finish()
        return
    if outcome:
        trial = outcome[0]
        decision.findings.extend(trial.findings)
        decision.warnings.extend(trial.warnings)
        if not trial.allowed:
            decision.allowed = False
            decision.message = "\n".join(f.message for f in trial.findings
                                         if f.mode is Mode.ENFORCE)
