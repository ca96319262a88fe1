"""The borrowing arithmetic (``webhook.quota.cohort``): lending limits, borrowing limits,
never a tenant's own idle quota, never over the cohort's total, and what reclaiming
leaves overdrawn. Table cases for the rules, then hypothesis over random cohorts and
random sequences of borrowing, checked against an independent max-flow assignment of
borrowed GPUs to lenders."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.quota.cohort import Member, fits, overdrawn, room


def m(name: str, quota: float, used: float = 0, borrowed: float = 0, *,
      borrowing: float | None = None, lending: float | None = None) -> Member:
    return Member(name, quota, used, borrowed, borrowing, lending)


@pytest.mark.parametrize(("cohort", "borrower", "free", "bound"), [
    # a is full (8 of 8); b leaves 6 idle and lends them all.
    ([m("a", 8, 8), m("b", 8, 2)], "a", 6, "lenders"),
    # b's lending limit keeps 2 of its 6 idle GPUs its own.
    ([m("a", 8, 8), m("b", 8, 2, lending=4)], "a", 4, "lenders"),
    # a's borrowing limit binds before b's idle GPUs run out.
    ([m("a", 8, 8, borrowing=3), m("b", 8, 2)], "a", 3, "borrowingLimit"),
    # what a has borrowed already counts against both.
    ([m("a", 8, 8, 2, borrowing=3), m("b", 8, 2)], "a", 1, "borrowingLimit"),
    ([m("a", 8, 8, 5), m("b", 8, 2)], "a", 1, "lenders"),
    # a's own idle quota is never what it borrows: it has 3 idle itself, b lends 0.
    ([m("a", 8, 5), m("b", 8, 8)], "a", 0, "lenders"),
    # c borrowed 4 of b's 6 idle: a may have only the 2 left, though others_lend says 6.
    ([m("a", 8, 8), m("b", 8, 2), m("c", 4, 4, 4)], "a", 2, "cohort"),
    # lendingLimit 0: b only borrows; a tenant without quota left lends nothing.
    ([m("a", 8, 8), m("b", 8, 0, lending=0)], "a", 0, "lenders"),
    # borrowingLimit 0: a only lends.
    ([m("a", 8, 8, borrowing=0), m("b", 8, 0)], "a", 0, "borrowingLimit"),
])
def test_room(cohort: list[Member], borrower: str, free: float, bound: str) -> None:
    r = room(cohort, borrower)
    assert r.free == free
    assert r.bound == bound


def test_fits_is_room_with_a_little_float_slack() -> None:
    cohort = [m("a", 1, 1), m("b", 1, 0.625)]
    assert fits(cohort, "a", 0.375)  # three MIG slices of 0.125
    assert not fits(cohort, "a", 0.5)


def test_reclaim_the_lender_takes_its_gpus_back_and_the_cohort_is_overdrawn() -> None:
    # a borrowed 6 of b's idle GPUs; then b runs 5 of its own (its quota is its own, so
    # nothing here stops it): only 3 are lendable now, 3 borrowed GPUs are overdrawn, and
    # nobody may borrow more until the scheduler has preempted them.
    before = [m("a", 8, 8, 6), m("b", 8, 2)]
    assert overdrawn(before) == 0
    after = [m("a", 8, 8, 6), m("b", 8, 5)]
    assert overdrawn(after) == 3
    assert room(after, "a").free == 0
    # b's own room is 3 of its quota, whatever a borrowed: the arithmetic of its own
    # admissions (webhook.quota.check) never sees a's borrowed account.
    assert after[1].idle == 3
    # Once 3 borrowed GPUs are preempted the cohort is whole again.
    assert overdrawn([m("a", 8, 8, 3), m("b", 8, 5)]) == 0


# --------------------------------------------------------------------------- properties

def _max_flow(members: list[Member]) -> float:
    """Borrowed GPUs that can be assigned to lenders, each lending at most its
    lendable and none to itself: Edmonds-Karp on integers (the strategies use whole
    GPUs), written apart from the module under test."""
    n = len(members)
    src, sink = 2 * n, 2 * n + 1
    size = 2 * n + 2
    cap = [[0.0] * size for _ in range(size)]
    for i, b in enumerate(members):
        cap[src][i] = b.borrowed
        for j in range(n):
            if i != j:
                cap[i][n + j] = math.inf
    for j, lender in enumerate(members):
        cap[n + j][sink] = lender.lendable
    flow = 0.0
    while True:
        parent = [-1] * size
        parent[src] = src
        queue = [src]
        while queue and parent[sink] == -1:
            u = queue.pop(0)
            for v in range(size):
                if parent[v] == -1 and cap[u][v] > 1e-9:
                    parent[v] = u
                    queue.append(v)
        if parent[sink] == -1:
            return flow
        push, v = math.inf, sink
        while v != src:
            push, v = min(push, cap[parent[v]][v]), parent[v]
        v = sink
        while v != src:
            u = parent[v]
            cap[u][v] -= push
            cap[v][u] += push
            v = u
        flow += push


limits = st.none() | st.integers(0, 12).map(float)


@st.composite
def cohorts(draw: st.DrawFn) -> list[Member]:
    out = []
    for i in range(draw(st.integers(2, 4))):
        quota = float(draw(st.integers(0, 12)))
        used = float(draw(st.integers(0, int(quota))))
        out.append(Member(f"t{i}", quota, used, 0.0, draw(limits), draw(limits)))
    return out


@st.composite
def cohort_and_member(draw: st.DrawFn) -> tuple[list[Member], int]:
    """A cohort (:func:`cohorts`) and the index of one of its members."""
    cohort = draw(cohorts())
    return cohort, draw(st.integers(0, len(cohort) - 1))


@settings(max_examples=300, deadline=None)
@given(cohorts(), st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6)), max_size=12))
def test_borrowing_in_any_order_keeps_every_promise(
        cohort: list[Member], asks: list[tuple[int, int]]) -> None:
    members = list(cohort)
    for who, gpus in asks:
        if who >= len(members):
            continue
        name = members[who].name
        if fits(members, name, gpus):
            members[who] = replace(members[who], borrowed=members[who].borrowed + gpus)
        # Never over the cohort's total quota.
        assert (sum(x.used + x.borrowed for x in members)
                <= sum(x.quota for x in members) + 1e-9)
        for x in members:
            # Within each borrower's limit.
            assert x.borrowing_limit is None or x.borrowed <= x.borrowing_limit + 1e-9
        # Every borrowed GPU has a lender within its lending limit, not itself.
        assert _max_flow(members) == pytest.approx(sum(x.borrowed for x in members))
        assert overdrawn(members) == 0


@settings(max_examples=200, deadline=None)
@given(cohort_and_member(), st.integers(1, 12))
def test_what_room_allows_is_exactly_what_can_be_assigned(
        picked: tuple[list[Member], int], gpus: int) -> None:
    # room() is not only safe but complete: when it refuses, no assignment exists.
    cohort, who = picked
    after = list(cohort)
    after[who] = replace(after[who], borrowed=after[who].borrowed + gpus)
    limit = after[who].borrowing_limit
    assignable = (_max_flow(after) == pytest.approx(sum(x.borrowed for x in after))
                  and (limit is None or after[who].borrowed <= limit))
    assert fits(cohort, cohort[who].name, gpus) == assignable


@settings(max_examples=200, deadline=None)
@given(cohort_and_member(), st.integers(0, 12))
def test_a_lenders_own_use_growing_only_ever_overdraws_never_refuses_it(
        picked: tuple[list[Member], int], more: int) -> None:
    # Reclaim order: the lender's own pods first. Its idle quota, the room its own
    # admissions are checked against, does not depend on anything borrowed.
    cohort, who = picked
    borrowed = [replace(x, borrowed=0.0) for x in cohort]
    for i, x in enumerate(borrowed):
        if i != who and fits(borrowed, x.name, 1):
            borrowed[i] = replace(x, borrowed=1.0)
    lender = borrowed[who]
    own_room = lender.quota - lender.used
    grown = replace(lender, used=lender.used + min(more, own_room))
    assert grown.used <= grown.quota  # its own quota admitted all of it
    after = [grown if i == who else x for i, x in enumerate(borrowed)]
    assert overdrawn(after) <= min(more, own_room) + 1e-9
