"""The status a replica writes on the GPUPolicy it serves (``desired_status``): what a
platform engineer reads in ``kubectl get gpupolicy -o yaml``, computed without I/O.
The replicas settle (a status written once is not changed by the next report), a
refused generation keeps the last accepted spec, and gone replicas drop out.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from webhook.server.sources.policyobject import View, desired_status

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SPEC = {"tenants": [{"name": "a"}, {"name": "b"}]}


def obj(generation: int, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "uid": "u1", "generation": generation},
            "spec": SPEC, "status": status or {}}


def served(replica: str, generation: int) -> View:
    return View(replica, "u1", generation, 2, "u1", generation, None, dict(SPEC))


def refused(replica: str, serving: int, generation: int) -> View:
    return View(replica, "u1", serving, 2, "u1", generation, "GPUPolicy p: spec.x: bad", None)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_two_replicas_serving_the_generation_make_it_active_and_then_settle() -> None:
    one = desired_status(obj(3), served("pod-a", 3), NOW, 900, refresh=False)
    both = desired_status(obj(3, one), served("pod-b", 3), NOW, 900, refresh=False)
    got = conditions(both)
    assert got["Accepted"]["status"] == "True" and got["Accepted"]["observedGeneration"] == 3
    assert got["Active"]["status"] == "True" and got["Active"]["observedGeneration"] == 3
    assert got["Active"]["message"] == "2 replica(s) serve generation 3: pod-a, pod-b"
    assert [(r["name"], r["servedGeneration"]) for r in both["replicas"]] == [
        ("pod-a", 3), ("pod-b", 3)]
    assert both["tenants"] == 2
    assert both["lastAccepted"] == {"generation": 3, "spec": SPEC}
    later = NOW + timedelta(seconds=30)
    for replica in ("pod-a", "pod-b"):  # woken by each other's write: nothing to change
        assert desired_status(obj(3, both), served(replica, 3), later, 900, False) == both


def test_a_refused_generation_is_reported_and_the_last_accepted_kept() -> None:
    good = desired_status(obj(3), served("pod-a", 3), NOW, 900, False)
    bad = desired_status(obj(4, good), refused("pod-a", 3, 4), NOW, 900, False)
    got = conditions(bad)
    assert (got["Accepted"]["status"], got["Accepted"]["reason"]) == ("False", "Invalid")
    assert got["Accepted"]["message"] == "GPUPolicy p: spec.x: bad"
    assert got["Accepted"]["observedGeneration"] == 4
    assert (got["Active"]["status"], got["Active"]["reason"]) == ("False", "ServingLastAccepted")
    assert bad["replicas"][0]["servedGeneration"] == 3
    assert bad["lastAccepted"]["generation"] == 3


def test_a_replica_on_an_older_generation_makes_it_updating() -> None:
    a = desired_status(obj(5), served("pod-a", 5), NOW, 900, False)
    b = desired_status(obj(5, a), served("pod-b", 4), NOW, 900, False)
    assert (conditions(b)["Active"]["status"], conditions(b)["Active"]["reason"]) == (
        "False", "Updating")
    assert "pod-a=5, pod-b=4" in conditions(b)["Active"]["message"]


def test_a_replica_that_leaves_or_goes_silent_drops_out() -> None:
    a = desired_status(obj(2), served("pod-a", 2), NOW, 900, False)
    b = desired_status(obj(2, a), served("pod-b", 2), NOW + timedelta(seconds=600), 900, False)
    left = desired_status(obj(2, b), served("pod-b", 2), NOW, 900, False, leaving=True)
    assert [r["name"] for r in left["replicas"]] == ["pod-a"]
    # pod-a last reported at NOW; 20 minutes later with a 15-minute staleness it is gone.
    silent = desired_status(obj(2, b), served("pod-b", 2), NOW + timedelta(minutes=20), 900,
                            refresh=True)
    assert [r["name"] for r in silent["replicas"]] == ["pod-b"]


def test_a_transition_time_changes_only_with_the_status() -> None:
    a = desired_status(obj(1), served("pod-a", 1), NOW, 900, False)
    later = NOW + timedelta(minutes=5)
    b = desired_status(obj(2, a), served("pod-a", 2), later, 900, False)
    assert conditions(b)["Active"]["lastTransitionTime"] == conditions(a)["Active"][
        "lastTransitionTime"]  # True at 1, True at 2
    c = desired_status(obj(3, b), refused("pod-a", 2, 3), later, 900, False)
    assert conditions(c)["Accepted"]["lastTransitionTime"] == "2026-12-01T12:05:00Z"


def test_the_status_shown_in_deploy_readme_is_the_shape_written() -> None:
    text = (Path(__file__).resolve().parents[2] / "deploy" / "README.md").read_text()
    section = text.split("### Serving a GPUPolicy object", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    shown = yaml.safe_load(block)["status"]
    good = desired_status(obj(3), served("pod-a", 3), NOW, 900, False)
    written = desired_status(obj(4, good), refused("pod-a", 3, 4), NOW, 900, False)

    def shape(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: shape(v) for k, v in node.items() if k != "spec"}
        if isinstance(node, list):
            return [shape(v) for v in node]
        return type(node).__name__

    shown_conditions = {c["type"]: c for c in shown["conditions"]}
    for kind, c in conditions(written).items():
        assert set(shown_conditions[kind]) == set(c) - {"lastTransitionTime"}, kind
        assert (shown_conditions[kind]["status"], shown_conditions[kind]["reason"]) == (
            c["status"], c["reason"])
    assert shape(shown["replicas"]) == shape(written["replicas"])
    assert shape(shown["lastAccepted"]) == shape(written["lastAccepted"])
    assert set(shown) == set(written)
