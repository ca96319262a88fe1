"""``gpu-webhook status``'s leader line (webhook.tools.status.leader_line): who leads, from
the leader Lease, and when no replica does, what that leaves undone (waiting pods not
released, the GPUQuota objects and webhook configurations not kept)."""

from __future__ import annotations

from datetime import UTC, datetime

from webhook.libs.kube import StoredLease
from webhook.tools.status import leader_line

NOW = 1_800_000_000.0


def lease(holder: str, renewed_ago: float | None) -> StoredLease:
    renewed = (datetime.fromtimestamp(NOW - renewed_ago, UTC)
               if renewed_ago is not None else None)
    return StoredLease(holder, 15.0, 3, "42", renewed=renewed)


def test_a_leader_renewing_its_lease_is_named() -> None:
    assert leader_line(lease("gpu-webhook-7d9f4-abcde_1a2b3c4d", 3), NOW, 0) == \
        "leader: gpu-webhook-7d9f4-abcde_1a2b3c4d"


def test_no_lease_a_released_one_and_a_stale_one_say_no_replica_leads() -> None:
    never = leader_line(None, NOW, 0)
    assert never.startswith("leader: none has led yet (no Lease gpu-webhook-leader): ")
    assert "waiting pods would not be released" in never
    released = leader_line(lease("", 2), NOW, 1)
    assert released.startswith("leader: none (the last leader released Lease")
    assert "1 waiting pod is not released" in released
    stale = leader_line(lease("gpu-webhook-0_aa", 120), NOW, 3)
    assert stale.startswith("leader: none (Lease gpu-webhook-leader last renewed by "
                            "gpu-webhook-0_aa 120 s ago, expires after 15 s): "
                            "3 waiting pods are not released")


def test_clocks_apart_by_less_than_a_lease_are_not_taken_for_a_lost_leader() -> None:
    # The holder's clock and the reader's are not the same clock: 20 s is within 2 x 15.
    assert leader_line(lease("gpu-webhook-0_aa", 20), NOW, 0) == "leader: gpu-webhook-0_aa"
