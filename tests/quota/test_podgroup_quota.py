"""PodGroups of the core gang API (``scheduling.k8s.io/v1beta1``, gate GenericWorkload)
under quota, through the validating pipeline and the in-memory store: the first pod of a
PodGroup has its whole gang (``minCount`` pods like it) checked and reserved, or is
refused with the gang's numbers; the pods after it draw the reservation; a replacement
pod of a gang that runs is checked alone; a PodGroup that cannot be read leaves the pod
counted alone, said in a warning. The PodGroup reader is the pipeline's own hook (what
the server reads from the API server); the simulated cluster runs it for real
(tests/e2e/test_e2e_sim_podgroups.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from quotakit import pod, policy

from webhook.admission import webhooks
from webhook.admission.groups import GroupUnreadable
from webhook.engine import messages
from webhook.engine.decision import Decision
from webhook.k8s import podgroups
from webhook.k8s.review import parse_review, request_review
from webhook.quota.line import gang_of
from webhook.quota.store import MemoryStore

NS = "team-a"  # tenant team-a: 8 GPUs, 6 A100s, 5 pods


def podgroup(name: str, min_count: int | None) -> dict[str, Any]:
    policy_ = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-pg-{name}"},
            "spec": {"schedulingPolicy": policy_}}


def member(group: str, i: int, gpus: int = 2) -> dict[str, Any]:
    obj = pod(f"{group}-{i}", NS, gpus)
    obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    return obj


class Groups:
    """The PodGroups the API server holds, and how often the pipeline read one."""

    def __init__(self, *groups: dict[str, Any], fail: str | None = None) -> None:
        self.groups = {g["metadata"]["name"]: g for g in groups}
        self.fail = fail
        self.reads = 0
        self.charged: dict[str, int] = {}

    async def read(self, namespace: str, name: str, timeout: float
                   ) -> Mapping[str, Any] | None:
        self.reads += 1
        if self.fail is not None:
            raise GroupUnreadable(self.fail)
        return self.groups.get(name)

    def members(self, group: str) -> int:
        return self.charged.get(group, 0)


def admit(store: MemoryStore, groups: Groups, obj: dict[str, Any], *,
          dry_run: bool = False) -> Decision:
    req = parse_review(orjson.dumps(request_review(obj, dry_run=dry_run)))
    cluster = webhooks.Cluster(store=store, read_group=groups.read,
                               group_members=groups.members)
    return asyncio.run(webhooks.validating(req, policy(), cluster, 5.0))


def used(store: MemoryStore) -> float:
    return store.view().tenant("team-a").gpus


def test_a_podgroup_whose_gang_can_never_fit_refuses_its_first_pod_and_reserves_nothing(
) -> None:
    # 4 pods x 2 A100s = 8, over the tenant's 6 A100s: no pod of it is admitted.
    store, groups = MemoryStore(), Groups(podgroup("train", 4))
    for i in range(4):
        d = admit(store, groups, member("train", i))
        assert not d.allowed
        assert messages.group_never_fits(
            "train", "tenant team-a", "a100 GPUs", 4, 2, 6) in d.message, d.message
    assert used(store) == 0
    assert "minCount to 3 or less" in d.message


def test_a_podgroup_that_fits_is_reserved_at_its_first_pod_and_its_pods_draw_it() -> None:
    store, groups = MemoryStore(), Groups(podgroup("train", 3))
    first = admit(store, groups, member("train", 0))
    assert first.allowed and first.warnings == [], first.warnings
    assert used(store) == 6  # the whole gang held at once: 3 x 2
    for i in (1, 2):
        assert admit(store, groups, member("train", i)).allowed
        assert used(store) == 6  # drawn from the reservation, counted once
    assert groups.reads == 1  # read at the first pod only
    # A fourth pod, beyond minCount, finds no slot: checked alone (6 of 6 A100s held).
    d = admit(store, groups, member("train", 3))
    assert not d.allowed and "a100 GPUs" in d.message, d.message


def test_a_podgroup_that_does_not_fit_what_is_free_now_refuses_its_first_pod() -> None:
    store, groups = MemoryStore(), Groups(podgroup("train", 2))
    assert admit(store, groups, pod("other", NS, 4)).allowed  # 4 of 6 A100s held
    d = admit(store, groups, member("train", 0))
    assert not d.allowed
    assert messages.group_not_free(
        "train", "tenant team-a", "a100 GPUs", 2, 2, 4, 6) in d.message, d.message
    assert used(store) == 4


def test_a_replacement_pod_of_a_running_gang_is_checked_alone() -> None:
    # Three of four members run and hold their GPUs (the pod watch counts them), the
    # reservation is gone (its bound passed): the fourth is checked for itself only.
    store, groups = MemoryStore(), Groups(podgroup("train", 4))
    for i in range(3):
        assert admit(store, groups, pod(f"running-{i}", NS, 1)).allowed
    groups.charged[podgroups.group_id(NS, "train")] = 3
    d = admit(store, groups, member("train", 3, gpus=1))
    assert d.allowed and d.warnings == [], d.message
    assert used(store) == 4


@pytest.mark.parametrize("groups,why", [
    (Groups(), "it does not exist yet"),
    (Groups(podgroup("train", 4), fail="podgroups is forbidden"), "podgroups is forbidden"),
])
def test_a_podgroup_that_cannot_be_read_leaves_the_pod_counted_alone_with_a_warning(
        groups: Groups, why: str) -> None:
    store = MemoryStore()
    d = admit(store, groups, member("train", 0))
    assert d.allowed
    [warning] = d.warnings
    assert warning == (f"pod team-a/train-0: {messages.group_unread('train', why)} "
                       "[rule quota, tenant team-a]")
    assert used(store) == 2


def test_a_basic_podgroup_and_a_dry_run_are_charged_as_pods_alone() -> None:
    store, groups = MemoryStore(), Groups(podgroup("each", None))
    assert admit(store, groups, member("each", 0)).allowed
    assert used(store) == 2  # one pod's worth, no gang
    dry = Groups(podgroup("train", 4))
    assert admit(store, dry, member("train", 0), dry_run=True).allowed  # 2 of 4 free
    assert dry.reads == 0 and used(store) == 2


def test_the_pods_of_a_podgroup_wait_as_one_gang_found_by_their_group() -> None:
    # The line (overQuota: wait) keys a PodGroup's pods by the group, read before any
    # owner: a Job's pod that joins a PodGroup is released with the group's gang.
    obj = member("train", 0)
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job",
                                           "name": "train", "uid": "uid-job",
                                           "controller": True}]
    gang = gang_of(obj)
    assert gang is not None
    assert (gang.key, gang.kind, gang.group, gang.version, gang.resource, gang.name) == (
        "team-a/podgroup=train", "PodGroup", "scheduling.k8s.io", "v1beta1", "podgroups",
        "train")
    assert gang.named() == "podgroup.scheduling.k8s.io/train"


@pytest.mark.parametrize("spec,size", [
    ({"schedulingPolicy": {"gang": {"minCount": 4}}}, 4),
    ({"schedulingPolicy": {"gang": {"minCount": 1}}}, 1),
    ({"schedulingPolicy": {"basic": {}}}, 1),
    ({"schedulingPolicy": {"gang": {"minCount": "4"}}}, 1),
    ({"schedulingPolicy": {"gang": {"minCount": True}}}, 1),
    ({}, 1),
])
def test_a_podgroups_gang_size_is_its_min_count(spec: dict[str, Any], size: int) -> None:
    assert podgroups.gang_size({"spec": spec}) == size


def test_docs_quote_the_refusal_a_podgroup_gets() -> None:
    # docs/quota.md quotes the start of the refusal of a gang that can never fit.
    docs = (Path(__file__).resolve().parents[2] / "docs" / "quota.md").read_text()
    quoted = " ".join(docs.split('("its PodGroup', 1)[1].split('..."', 1)[0].split())
    said = messages.group_never_fits("train", "tenant ml", "GPUs", 4, 2, 6)
    assert said.startswith("its PodGroup " + quoted), quoted
