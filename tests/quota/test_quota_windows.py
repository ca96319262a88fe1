"""Quota that changes with the clock (``tenants[].quotaSchedule``): the window open at
an instant in the schedule's time zone, the caps it gives at admission, decided by the
pipeline's clock (which the tests hold), and shown by ``status``.

The same switch across two replicas of a real deployment, by a clock both are given:
tests/e2e/test_e2e_quota_windows.py.
"""

from __future__ import annotations

import asyncio
import copy
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import jsonpatch
import orjson
import pytest
import yaml
from fakeapi import FakeAPI
from kit import policy_yaml
from quotakit import ledger_replica

from webhook.admission.webhooks import Cluster, mutating, validating
from webhook.engine.decision import Decision
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import PolicyError, load_text
from webhook.quota.status import gpuquota_status, of
from webhook.quota.store import MemoryStore, UsageStore
from webhook.server.clock import OffsetClock

POLICY = policy_yaml("windows", """\
  gpuResources: {names: [nvidia.com/gpu]}
  tenants:
    - name: notebooks
      namespaces: [notebooks]
      quota: {gpus: 4, pods: 10}
      quotaSchedule:
        timeZone: Europe/Berlin
        windows:
          - name: working-hours
            days: [Mon, Tue, Wed, Thu, Fri]
            start: "08:00"
            end: "18:00"
            quota: {gpus: 8}
          - name: friday-night
            days: [Fri]
            start: "22:00"
            end: "06:00"
            quota: {gpus: 1}
""")
BERLIN = ZoneInfo("Europe/Berlin")
ROOT = Path(__file__).resolve().parents[2]


def at(text: str) -> float:
    """Unix time of a Berlin wall-clock time (``2026-03-02 09:00``: a Monday)."""
    return datetime.fromisoformat(text).replace(tzinfo=BERLIN).timestamp()


def policy(text: str = POLICY) -> CompiledPolicy:
    return compile_policy(load_text(text))


def pod(name: str, gpus: int = 1) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "notebooks", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {
                "limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}}]}}


def admit(obj: dict[str, Any], store: UsageStore, p: CompiledPolicy, now: float
          ) -> Decision:
    """Both webhooks at the clock's ``now``, as the server runs them."""
    r = parse_review(orjson.dumps(request_review(copy.deepcopy(obj))))
    m = mutating(r, p)
    final = jsonpatch.apply_patch(obj, m.patch) if m.patch else obj
    req = parse_review(orjson.dumps(request_review(final)))
    return asyncio.run(validating(req, p, Cluster(store=store, clock=lambda: now)))


@pytest.mark.parametrize(("when", "window"), [
    ("2026-03-02 09:00", "working-hours"),  # Monday
    ("2026-03-02 07:59", None),
    ("2026-03-02 08:00", "working-hours"),  # the start is in
    ("2026-03-02 18:00", None),  # the end is out
    ("2026-03-07 12:00", None),  # Saturday
    ("2026-03-06 23:30", "friday-night"),
    ("2026-03-07 05:59", "friday-night"),  # past midnight: Friday's window
    ("2026-03-07 06:00", None),
    ("2026-03-30 09:00", "working-hours"),  # the Monday after the clocks went forward
])
def test_the_window_open_at_a_time_in_the_schedules_zone(when: str, window: str | None
                                                         ) -> None:
    [t] = policy().tenants
    assert t.schedule is not None
    w = t.schedule.open_at(at(when))
    assert (w.name if w else None) == window


def test_the_zone_decides_not_utc() -> None:
    [t] = policy().tenants
    assert t.schedule is not None
    # 07:30 UTC on a Monday in winter is 08:30 in Berlin: open.
    utc = datetime(2026, 3, 2, 7, 30, tzinfo=ZoneInfo("UTC")).timestamp()
    w = t.schedule.open_at(utc)
    assert w is not None and w.name == "working-hours"


def test_the_cap_changes_at_the_boundary_for_new_pods_only() -> None:
    p, store = policy(), MemoryStore(ttl=3600)
    day = at("2026-03-02 17:00")
    assert all(admit(pod(f"d{i}"), store, p, day).allowed for i in range(8))
    refused = admit(pod("d8"), store, p, day)
    assert not refused.allowed
    assert ("exceeded quota: tenant notebooks would use 9 of its 8 GPUs in window "
            "working-hours") in refused.message
    # 18:00: the night's 4 apply to new pods; the 8 admitted stay counted (and running).
    night = at("2026-03-02 18:00")
    d = admit(pod("n0"), store, p, night)
    assert not d.allowed
    assert "tenant notebooks would use 9 of its 4 GPUs: 8 in use" in d.message
    assert store.view().tenant("notebooks").gpus == 8
    # A window's fields replace only what they name: the pod cap of 10 still binds.
    assert policy().tenants[0].at(day).quota.pods == 10  # type: ignore[union-attr]


def test_one_second_before_the_boundary_the_old_cap_holds() -> None:
    p = policy()
    store = MemoryStore(ttl=3600)
    assert all(admit(pod(f"a{i}"), store, p, at("2026-03-02 07:59")).allowed
               for i in range(4))
    assert not admit(pod("a4"), store, p, at("2026-03-02 07:59:59")).allowed
    assert admit(pod("a4"), store, p, at("2026-03-02 08:00")).allowed


def test_a_window_commits_through_the_ledger_like_any_cap(api: FakeAPI) -> None:
    p = policy()
    store = ledger_replica(api, p)
    night = at("2026-03-06 23:00")
    assert admit(pod("one"), store, p, night).allowed
    d = admit(pod("two"), store, p, night)
    assert not d.allowed and "of its 1 GPUs in window friday-night" in d.message
    api.faults.extend(["503"] * 50)
    d = admit(pod("three"), store, p, at("2026-03-02 09:00"))
    assert not d.allowed and "the GPU quota ledger cannot be reached" in d.message


def test_status_and_the_gpuquota_status_say_which_window_applies() -> None:
    p = policy()
    store = MemoryStore(ttl=3600)
    assert admit(pod("a", 3), store, p, at("2026-03-02 09:00")).allowed
    report = of(p.tenants, store.pods, store.reserved, policy=p, now=at("2026-03-02 09:00"))
    assert report.windows == {
        "notebooks": "working-hours (Mon,Tue,Wed,Thu,Fri 08:00-18:00 Europe/Berlin)"}
    [row] = [r for r in report.rows if r.cap == "gpus"]
    assert (row.reserved, row.limit) == (3, 8)
    st = gpuquota_status(report, "notebooks", p.name)
    assert st["window"].startswith("working-hours") and st["limit"] == 8
    # Declared in the CRD, or the API server would prune it.
    crd = yaml.safe_load((ROOT / "deploy" / "base" / "crd-gpuquota.yaml").read_text())
    [version] = crd["spec"]["versions"]
    assert set(st) - {"updated"} <= set(
        version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"])
    outside = of(p.tenants, store.pods, store.reserved, policy=p, now=at("2026-03-07 12:00"))
    assert outside.windows == {"notebooks": ""}
    assert gpuquota_status(outside, "notebooks", p.name)["limit"] == 4


@pytest.mark.parametrize(("field", "value", "says"), [
    ("timeZone: Europe/Berlin", "timeZone: Europe/Atlantis",
     "time zone 'Europe/Atlantis' is not an IANA time zone"),
    ('start: "08:00"', 'start: "8am"', "start"),
    ('end: "18:00"', 'end: "08:00"', "opens and closes at 08:00"),
    ("days: [Fri]", "days: [Friday]", "days"),
])
def test_a_bad_schedule_is_refused_with_the_field(field: str, value: str, says: str) -> None:
    with pytest.raises(PolicyError, match="quotaSchedule") as err:
        policy(POLICY.replace(field, value, 1))
    assert says in str(err.value)


def test_the_test_clock_follows_its_offset_file(tmp_path: Path) -> None:
    f = tmp_path / "offset"
    clock = OffsetClock(str(f))

    assert abs(clock() - time.time()) < 5  # no file yet: no offset
    f.write_text("86400")
    assert 86395 < clock() - time.time() < 86405
    f.write_text("-3600.5\n")
    assert -3605 < clock() - time.time() < -3595
    f.write_text("soon")  # unreadable: the last offset is kept
    assert -3605 < clock() - time.time() < -3595


def test_review_at_decides_as_at_that_time(tmp_path: Path) -> None:
    import os
    import subprocess

    from kit import console_script

    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "pods.yaml").write_text("---\n".join(
        orjson.dumps(pod(f"p{i}", 3)).decode() + "\n" for i in range(2)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_WEBHOOK_")}

    def review(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([console_script(), "review", "-f", "pods.yaml", "--policy",
                               "policy.yaml", *extra], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path, env=env)

    day = review("--at", "2026-03-02T09:00:00+01:00")  # 2 x 3 of the window's 8
    assert day.returncode == 0, day.stdout + day.stderr
    night = review("--at", "2026-03-02T20:00:00+01:00")  # the tenant's own 4
    assert night.returncode == 1
    assert "tenant notebooks would use 6 of its 4 GPUs" in night.stdout
    bad = review("--at", "tomorrow")
    assert bad.returncode == 2
    assert "--at 'tomorrow' is not a time with its offset" in bad.stderr


def test_status_prints_the_window_that_applies(tmp_path: Path) -> None:
    from webhook.tools.status import Cluster as Read
    from webhook.tools.status import report, table

    running = pod("held", 2)
    r = report(policy(), Read(pods=[running]), tenant="notebooks",
               now=at("2026-03-02 09:00"))
    text = table(r)
    assert ("notebooks: quota window working-hours (Mon,Tue,Wed,Thu,Fri 08:00-18:00 "
            "Europe/Berlin) applies now") in text
    assert any(x.cap == "gpus" and (x.used, x.limit) == (2, 8) for x in r.rows)
    later = table(report(policy(), Read(pods=[running]), tenant="notebooks",
                         now=at("2026-03-02 19:00")))
    assert "notebooks: outside its quota windows: its own caps apply" in later


def test_a_cohort_tenant_cannot_have_a_schedule() -> None:
    text = POLICY.replace("      quota: {gpus: 4, pods: 10}\n",
                          "      quota: {gpus: 4, pods: 10}\n      cohort: {name: lab}\n")
    with pytest.raises(PolicyError, match="a tenant in a cohort cannot have a quotaSchedule"):
        policy(text)
