"""A pod that only borrowed GPUs can ever hold, in a waiting tenant of a cohort
(``overQuota: wait``): created marked as borrowed (its PriorityClass can only be set at
creation) and gated, admitted uncharged, refused only when its cohort could never lend
it; the leader's release of it is in ``tests/server/test_release.py``."""

from __future__ import annotations

from test_borrowing import POLICY, create, labels, pod

from webhook.engine.borrowed import BORROWED_LABEL, account
from webhook.engine.cost import Charge
from webhook.engine.waiting import is_gated
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_text
from webhook.quota.store import MemoryStore

LIMIT = "      cohort: {name: lab, borrowingLimit: 6}"
WAIT = POLICY.replace(LIMIT, LIMIT + "\n      overQuota: wait")


def waiting_policy() -> CompiledPolicy:
    assert WAIT != POLICY
    return compile_policy(load_text(WAIT))


def lender_busy(store: MemoryStore, gpus: float) -> None:
    store.pod_seen("lender", Charge("team-b", "team-b", "pod/lender", None,
                                    {"nvidia.com/gpu": gpus}, gpus))


def test_a_pod_bigger_than_its_own_quota_waits_marked_to_borrow() -> None:
    p, store = waiting_policy(), MemoryStore()
    lender_busy(store, 8)  # team-b uses its 8: the cohort lends nothing now
    m, v, final = create(store, p, pod("big", "team-a", 6))
    assert v is not None and v.allowed, v.message
    assert is_gated(final) and labels(final)[BORROWED_LABEL] == "true"
    assert final["spec"]["priorityClassName"] == "gpu-webhook-borrowed"
    assert final["spec"]["priority"] == -100
    (warning,) = [w for w in m.warnings if "borrow" in w]
    assert ("waits for GPUs to borrow from cohort lab: it asks 6 GPUs, more than tenant "
            "team-a's own quota of 4 can ever hold") in warning
    # Nothing is charged while it waits, to its own quota or its borrowed account.
    assert store.view().tenant("team-a").gpus == 0
    assert store.view().tenant(account("team-a")).gpus == 0


def test_a_pod_its_cohort_could_never_lend_is_refused_at_once() -> None:
    p, store = waiting_policy(), MemoryStore()
    lender_busy(store, 8)
    _, v, final = create(store, p, pod("huge", "team-a", 7))  # over borrowingLimit 6
    assert v is not None and not v.allowed
    assert not is_gated(final) and BORROWED_LABEL not in labels(final)


def test_a_pod_its_own_quota_can_hold_waits_unmarked_for_it() -> None:
    # Its own quota will hold it once its own pods end: it waits on that, at its own
    # priority (marked, it would be preemptible, and charged to borrowed GPUs only).
    p, store = waiting_policy(), MemoryStore()
    lender_busy(store, 8)
    store.pod_seen("own", Charge("team-a", "team-a", "pod/own", None,
                                 {"nvidia.com/gpu": 4}, 4))
    _, v, final = create(store, p, pod("next", "team-a", 2))
    assert v is not None and v.allowed
    assert is_gated(final) and BORROWED_LABEL not in labels(final)
