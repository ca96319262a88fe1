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


def _group(kind: str, version: str, count: str, name: str, n: int | None,
           parent: str | None) -> dict[str, Any]:
    """A PodGroup or CompositePodGroup: a gang of ``n`` (its ``count`` field), or basic
    (``n`` None), under ``parent`` if given."""
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {count: n}} if n is not None
                            else {"basic": {}}}
    if parent is not None:
        spec["parentCompositePodGroupName"] = parent
    return {"apiVersion": f"scheduling.k8s.io/{version}", "kind": kind,
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{kind}-{name}"},
            "spec": spec}


def podgroup(name: str, min_count: int | None, parent: str | None = None
             ) -> dict[str, Any]:
    return _group("PodGroup", "v1beta1", "minCount", name, min_count, parent)


def composite(name: str, groups: int | None, parent: str | None = None) -> dict[str, Any]:
    return _group("CompositePodGroup", "v1alpha3", "minGroupCount", name, groups, parent)


def member(group: str, i: int, gpus: int = 2) -> dict[str, Any]:
    obj = pod(f"{group}-{i}", NS, gpus)
    obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    return obj


class Groups:
    """The PodGroups (and CompositePodGroups) the API server holds, and how often the
    pipeline read one."""

    def __init__(self, *groups: dict[str, Any], fail: str | None = None) -> None:
        self.groups = {(g["kind"], g["metadata"]["name"]): g for g in groups}
        self.fail = fail
        self.reads = 0
        self.charged: dict[str, int] = {}

    async def read(self, kind: str, namespace: str, name: str, timeout: float
                   ) -> Mapping[str, Any] | None:
        self.reads += 1
        if self.fail is not None:
            raise GroupUnreadable(self.fail)
        return self.groups.get((kind, name))

    def members(self, group: str) -> int:
        return self.charged.get(group, 0)


def admit(store: MemoryStore, groups: Groups, obj: dict[str, Any], *,
          dry_run: bool = False, watched: bool = False) -> Decision:
    """The validating pipeline on ``obj``; ``watched``: the watches hold the groups (no
    read is needed), as a replica's do once they have delivered them."""
    req = parse_review(orjson.dumps(request_review(obj, dry_run=dry_run)))

    def seen(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return groups.groups.get((kind, name)) if watched else None

    cluster = webhooks.Cluster(store=store, read_group=groups.read,
                               group_members=groups.members, claims=seen)
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
            "PodGroup train", "tenant team-a", "a100 GPUs", 4, 2, 6) in d.message, d.message
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
    assert groups.reads == 3  # the watch did not hold it: read for each pod
    # A fourth pod, beyond minCount, finds no slot: checked alone (6 of 6 A100s held).
    d = admit(store, groups, member("train", 3))
    assert not d.allowed and "a100 GPUs" in d.message, d.message


def test_a_podgroup_that_does_not_fit_what_is_free_now_refuses_its_first_pod() -> None:
    store, groups = MemoryStore(), Groups(podgroup("train", 2))
    assert admit(store, groups, pod("other", NS, 4)).allowed  # 4 of 6 A100s held
    d = admit(store, groups, member("train", 0))
    assert not d.allowed
    assert messages.group_not_free(
        "PodGroup train", "tenant team-a", "a100 GPUs", 2, 2, 4, 6) in d.message, d.message
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
    assert warning == (f"pod team-a/train-0: {messages.group_unread('PodGroup train', why)} "
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
    gang = gang_of(obj)  # no watch: the PodGroup's own key
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
    # docs/quota.md quotes the start of the refusals of gangs that can never fit.
    docs = (Path(__file__).resolve().parents[2] / "docs" / "quota.md").read_text()
    for start, said in (
            ("its PodGroup", messages.group_never_fits("PodGroup train", "tenant ml", "GPUs",
                                                       4, 2, 6)),
            ("its CompositePodGroup", messages.group_never_fits(
                "CompositePodGroup llm", "tenant ml", "GPUs", 4, 2, 6, composite=True))):
        quoted = " ".join(docs.split(f'("{start}', 1)[1].split('..."', 1)[0].split())
        assert said.startswith(f"{start} {quoted}"), quoted


def test_a_composite_podgroup_is_one_gang_of_its_groups_checked_at_the_first_pod() -> None:
    # CompositePodGroup llm: 2 PodGroups of 2 pods x 2 A100s start together, 8 > 6 A100s.
    store = MemoryStore()
    groups = Groups(composite("llm", 2), podgroup("llm-0", 2, "llm"),
                    podgroup("llm-1", 2, "llm"))
    d = admit(store, groups, member("llm-0", 0))
    assert not d.allowed
    assert messages.group_never_fits("CompositePodGroup llm", "tenant team-a", "a100 GPUs",
                                     4, 2, 6, composite=True) in d.message, d.message
    assert "minGroupCount x minCount" in d.message
    assert used(store) == 0


def test_a_composite_that_fits_is_reserved_whole_and_every_groups_pods_draw_it() -> None:
    store = MemoryStore()
    groups = Groups(composite("llm", 3), podgroup("llm-0", 1, "llm"),
                    podgroup("llm-1", 1, "llm"), podgroup("llm-2", 1, "llm"))
    assert admit(store, groups, member("llm-0", 0)).allowed
    assert used(store) == 6  # 3 groups x 1 pod x 2 A100s, held at once
    for g in ("llm-1", "llm-2"):
        assert admit(store, groups, member(g, 0)).allowed
        assert used(store) == 6  # drawn from the composite's reservation


def test_a_basic_composite_leaves_each_podgroup_a_gang_of_its_own() -> None:
    store = MemoryStore()
    groups = Groups(composite("llm", None), podgroup("llm-0", 2, "llm"))
    assert admit(store, groups, member("llm-0", 0)).allowed
    assert used(store) == 4  # llm-0's own gang: 2 x 2


@pytest.mark.parametrize("chain,size,top", [
    ([], 3, ("PodGroup", "g")),
    ([composite("c1", 2)], 6, ("CompositePodGroup", "c1")),
    ([composite("c1", 2, "c2"), composite("c2", 4)], 24, ("CompositePodGroup", "c2")),
    ([composite("c1", None, "c2"), composite("c2", 4)], 3, ("PodGroup", "g")),
    ([composite("c1", 2, "c2"), composite("c2", None)], 6, ("CompositePodGroup", "c1")),
])
def test_a_podgroups_gang_is_the_highest_gang_of_gangs_above_it(
        chain: list[dict[str, Any]], size: int, top: tuple[str, str]) -> None:
    g = podgroups.gang(NS, "g", podgroup("g", 3, "c1"), chain)
    assert (g.size, (g.kind, g.name)) == (size, top)


def test_the_line_keys_a_composites_pods_by_the_composite_when_the_watches_hold_it(
) -> None:
    held = {("PodGroup", "llm-0"): podgroup("llm-0", 2, "llm"),
            ("CompositePodGroup", "llm"): composite("llm", 2)}
    gang = gang_of(member("llm-0", 0),
                   lookup=lambda kind, ns, name: held.get((kind, name)))
    assert gang is not None
    assert (gang.key, gang.kind, gang.version, gang.resource, gang.size) == (
        "team-a/compositepodgroup=llm", "CompositePodGroup", "v1alpha3",
        "compositepodgroups", 4)


def test_podgroups_the_watches_hold_are_not_read() -> None:
    store, groups = MemoryStore(), Groups(podgroup("train", 2))
    for i in range(2):
        assert admit(store, groups, member("train", i), watched=True).allowed
    assert groups.reads == 0 and used(store) == 4


def test_the_slots_no_pod_took_are_held_by_the_gang_in_messages() -> None:
    store, groups = MemoryStore(), Groups(podgroup("train", 3))
    assert admit(store, groups, member("train", 0)).allowed
    d = admit(store, groups, pod("other", NS, 2))
    assert not d.allowed
    # 2 of the gang's 3 slots are untaken: held by the PodGroup, the first pod its own.
    assert "podgroup/train 4" in d.message and "pod/train-0 2" in d.message, d.message


def test_deleting_a_podgroup_frees_the_slots_no_pod_took() -> None:
    store, groups = MemoryStore(), Groups(podgroup("train", 3))
    assert admit(store, groups, member("train", 0)).allowed
    assert used(store) == 6  # the gang of 3 x 2 reserved at its first pod
    # Its controller gave up: the PodGroup's DELETE (sent to release.gpu-webhook.dev).
    review = request_review(groups.groups[("PodGroup", "train")], operation="DELETE")
    review["request"]["object"] = None
    review["request"]["oldObject"] = groups.groups[("PodGroup", "train")]
    req = parse_review(orjson.dumps(review))
    d = asyncio.run(webhooks.admit(webhooks.Phase.VALIDATE, req, policy(),
                                   webhooks.Cluster(store=store)))
    assert d.allowed
    assert used(store) == 2  # only the pod that took its slot holds GPUs now
