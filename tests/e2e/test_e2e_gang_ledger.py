"""Gang reservations across two webhook replicas, on a real API server and its ledger.

Two ``gpu-webhook serve`` replicas share the quota ledger in the API server. Which
replica decides a request is not left to chance: the rendered webhook configurations
are installed once per replica, each pointing at its replica and selecting the objects
labelled ``e2e.gpu-webhook.dev/replica: <n>`` (an objectSelector), so a test says which
replica each object goes through. The Volcano Job CRD is installed from the fixtures; no
Volcano controller runs: the test creates a job's pods as it would (owned by the job,
labelled with its name, from its stored task template).

- two 4-pod gangs racing for a tenant's 4 free GPUs, applied at once through different
  replicas: exactly one gang's reservation is in the ledger, the other is admitted with
  a warning that nothing is reserved for it, none of its pods is admitted ahead of the
  first's, and the first's pods, created through the *other* replica, draw from the
  reservation and are admitted;
- the reservation is freed when the workload is deleted: a pod that did not fit beside
  it fits once ``kubectl delete`` has returned;
- a gang slot written into the ledger by hand lifts no cap: a pod of that "gang" is
  refused when the tenant's GPUs are all in use.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from controlplane.cluster import ControlPlane
from e2ekit import (
    LEDGER_NAMESPACE,
    MUTATED_ANNOTATION,
    Deployment,
    NamespaceFactory,
    apply,
    capped_policy,
    create_namespace,
    deployed,
    gpu_pod,
    sees_free_gpus,
    short_id,
    wait_until,
)
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.e2e

CRDS = Path(__file__).resolve().parent / "crds"
ROUTE = "e2e.gpu-webhook.dev/replica"
GROUP, VERSION, PLURAL = "batch.volcano.sh", "v1alpha1", "jobs"
CAP = 4
TENANTS = ("race", "release", "forged")
PROBE_NS = "e2e-gang-probe"


def _policy(workdir: Path) -> Path:
    return capped_policy(workdir, "gangs.yaml", TENANTS, CAP)


def routed(d: Deployment, index: int) -> list[dict[str, Any]]:
    """The configurations ``gpu-webhook manifests`` renders for replica ``index``'s own
    address, sent only the objects labelled for it."""
    docs = [doc for doc in yaml.safe_load_all(
        d.render(f"https://127.0.0.1:{d.replicas[index].port}")) if doc]
    for doc in docs:
        doc["metadata"]["name"] += f"-r{index}"
        for hook in doc["webhooks"]:
            hook["objectSelector"] = {"matchLabels": {ROUTE: str(index)}}
    return docs


def probe_mutated(cp: ControlPlane, index: int) -> bool:
    obj = gpu_pod(f"probe-{short_id()}", labels={ROUTE: str(index)})
    out = apply(cp, PROBE_NS, obj, dry_run=True)
    if out.returncode != 0:
        return False
    meta = yaml.safe_load(out.stdout)["metadata"]
    return MUTATED_ANNOTATION in (meta.get("annotations") or {})


@pytest.fixture(scope="module")
def replicas(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Deployment]:
    control_plane.kubectl("apply", "-f", str(CRDS / "batch.volcano.sh_jobs.yaml"))
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                          "crd/jobs.batch.volcano.sh")
    wait_until("the Volcano Job CRD to be served", lambda: "jobs" in control_plane.kubectl(
        "api-resources", f"--api-group={GROUP}", check=False).stdout, timeout=60)
    if control_plane.kubectl("get", "namespace", PROBE_NS, check=False).returncode != 0:
        create_namespace(control_plane, PROBE_NS, "research")
    workdir = tmp_path_factory.mktemp("webhook-gangs")
    with deployed(control_plane, workdir, replicas=2, policy=_policy(workdir)) as d:
        d.manifests = routed(d, 0) + routed(d, 1)
        control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(d.manifests))
        try:
            for i in (0, 1):
                wait_until(f"the API server to call replica {i}",
                           lambda i=i: probe_mutated(control_plane, i), timeout=60, every=0.2)
            yield d
        finally:
            d.uninstall()
            for i in (0, 1):
                wait_until(f"the API server to stop calling replica {i}",
                           lambda i=i: not probe_mutated(control_plane, i), timeout=60,
                           every=0.2)


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(control_plane.kubeconfig),
                            client_configuration=cfg)
    with client.ApiClient(cfg) as a:
        yield a


def volcano_job(name: str, route: int) -> dict[str, Any]:
    """4 workers of 1 GPU that must start together."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Job",
            "metadata": {"name": name, "labels": {ROUTE: str(route)}},
            "spec": {"minAvailable": 4, "schedulerName": "volcano", "tasks": [
                {"name": "worker", "replicas": 4, "template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "train", "image": "pytorch/pytorch",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}]}}


def controller_pod(job: dict[str, Any], i: int, route: int) -> dict[str, Any]:
    """Worker ``i`` as the Volcano controller makes it from the stored job."""
    meta = job["metadata"]
    template = copy.deepcopy(job["spec"]["tasks"][0]["template"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-worker-{i}",
                "labels": {"volcano.sh/job-name": meta["name"],
                           "volcano.sh/task-spec": "worker", ROUTE: str(route)},
                "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "Job",
                                     "name": meta["name"], "uid": meta["uid"],
                                     "controller": True, "blockOwnerDeletion": True}]},
            "spec": template["spec"]}


def create_job(api: client.ApiClient, ns: str, job: dict[str, Any]
               ) -> tuple[dict[str, Any], list[str]]:
    """The stored job and the warnings the API server passed on (kubectl prints them)."""
    data, _, headers = client.CustomObjectsApi(api).create_namespaced_custom_object_with_http_info(
        GROUP, VERSION, ns, PLURAL, job)
    return data, [w for k, w in headers.items() if k.lower() == "warning"]


def create_pod(api: client.ApiClient, ns: str, obj: dict[str, Any]) -> tuple[int, str]:
    try:
        client.CoreV1Api(api).create_namespaced_pod(ns, obj)
    except ApiException as exc:
        return int(exc.status), str(exc.body)
    return 201, ""


def ledger(api: client.ApiClient, tenant: str) -> dict[str, Any]:
    cm = client.CoreV1Api(api).read_namespaced_config_map(f"gpu-webhook-ledger-{tenant}",
                                                         LEDGER_NAMESPACE)
    out: dict[str, Any] = orjson.loads((cm.data or {}).get("reservations") or "{}")
    return out


def slots_of(entries: dict[str, Any], uid: str) -> list[str]:
    return sorted(k for k in entries if k.startswith(uid + "#"))


def validated(d: Deployment, index: int, name: str) -> bool:
    """Whether replica ``index`` logged its validating decision on Job ``name``."""
    for line in d.replicas[index].log().splitlines():
        if line.startswith("{") and '"decision"' in line:
            rec = orjson.loads(line)
            if (rec.get("webhook"), rec.get("kind"), rec.get("name")) == (
                    "validate", "Job", name):
                return True
    return False


def tenant_namespace(d: Deployment, namespace: NamespaceFactory, tenant: str) -> str:
    ns = namespace(tenant)
    wait_until(f"both replicas to see namespace {ns}", lambda: sees_free_gpus(d, ns, 1),
               timeout=60, every=0.2)
    return ns


def test_two_gangs_racing_through_two_replicas_one_is_reserved_whole(
        replicas: Deployment, api: client.ApiClient, namespace: NamespaceFactory) -> None:
    d = replicas
    ns = tenant_namespace(d, namespace, "race")
    names = {0: f"a-{short_id()}", 1: f"b-{short_id()}"}
    results: dict[int, tuple[dict[str, Any], list[str]]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def apply_job(route: int) -> None:
        try:
            start.wait(10)
            results[route] = create_job(api, ns, volcano_job(names[route], route))
        except BaseException as exc:  # reported below, not lost on the thread
            errors.append(exc)

    threads = [threading.Thread(target=apply_job, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for route in (0, 1):  # each job was decided by the replica it was sent to
        # (decision lines are flushed within a moment, not at once)
        wait_until(f"replica {route} to log its decision on {names[route]}",
                   lambda r=route: validated(d, r, names[r]), timeout=30)

    entries = ledger(api, "race")
    reserved = {r: slots_of(entries, results[r][0]["metadata"]["uid"]) for r in (0, 1)}
    [winner] = [r for r in (0, 1) if reserved[r]]  # exactly one gang is reserved...
    loser = 1 - winner
    assert len(reserved[winner]) == 4 and reserved[loser] == []  # ...whole, never half
    assert results[winner][1] == [], results[winner][1]
    assert any("No GPUs are reserved for it" in w for w in results[loser][1]), results[loser]

    # The losing gang's pods come first: none is admitted ahead of the reserved gang.
    won, lost = results[winner][0], results[loser][0]
    refused = [create_pod(api, ns, controller_pod(lost, i, route=loser)) for i in range(4)]
    assert [status for status, _ in refused] == [403] * 4, refused
    assert "exceeded quota" in refused[0][1]
    # The reserved gang's pods, created through the other replica than the one that
    # reserved it, draw from the reservation.
    admitted = [create_pod(api, ns, controller_pod(won, i, route=loser)) for i in range(4)]
    assert [status for status, _ in admitted] == [201] * 4, admitted
    entries = ledger(api, "race")
    assert slots_of(entries, won["metadata"]["uid"]) == []  # every slot drawn
    pods = client.CoreV1Api(api).list_namespaced_pod(ns).items
    assert sorted(p.metadata.name for p in pods) == [
        f"{names[winner]}-worker-{i}" for i in range(4)]
    assert sum(int(c.resources.limits["nvidia.com/gpu"]) for p in pods
               for c in p.spec.containers) == CAP


def test_deleting_the_workload_frees_its_reservation(
        replicas: Deployment, control_plane: ControlPlane, api: client.ApiClient,
        namespace: NamespaceFactory) -> None:
    d = replicas
    ns = tenant_namespace(d, namespace, "release")
    job, warnings = create_job(api, ns, volcano_job(f"c-{short_id()}", 0))
    assert warnings == []
    uid = job["metadata"]["uid"]
    assert len(slots_of(ledger(api, "release"), uid)) == 4
    # Another pod of the tenant, through the other replica: the 4 GPUs are reserved.
    status, body = create_pod(api, ns, gpu_pod("solo", labels={ROUTE: "1"}))
    assert status == 403 and "exceeded quota" in body, body
    control_plane.kubectl("delete", f"{PLURAL}.{GROUP}", job["metadata"]["name"], "-n", ns)
    assert slots_of(ledger(api, "release"), uid) == []
    assert d.replicas[0].log().count("gang reservation released") == 1, d.logs()
    status, body = create_pod(api, ns, gpu_pod("solo", labels={ROUTE: "1"}))
    assert status == 201, body


def test_a_slot_written_by_hand_lifts_no_cap(
        replicas: Deployment, api: client.ApiClient, namespace: NamespaceFactory) -> None:
    ns = tenant_namespace(replicas, namespace, "forged")
    statuses = [create_pod(api, ns, gpu_pod(f"p{i}", labels={ROUTE: str(i % 2)}))
                for i in range(CAP)]
    assert [s for s, _ in statuses] == [201] * CAP, statuses
    core = client.CoreV1Api(api)
    name = "gpu-webhook-ledger-forged"
    cm = core.read_namespaced_config_map(name, LEDGER_NAMESPACE)
    entries = orjson.loads(cm.data["reservations"])
    some = next(iter(entries.values()))
    forged_uid = "00000000-0000-0000-0000-00000000f0f0"
    entries[f"{forged_uid}#0"] = {k: v for k, v in some.items() if k != "name"} | {
        "gang": [forged_uid], "owner": "job/forged", "expires": time.time() + 120}
    cm.data["reservations"] = orjson.dumps(entries).decode()
    core.replace_namespaced_config_map(name, LEDGER_NAMESPACE, cm)
    # A pod claiming to belong to that gang, as its controller would make it.
    job = {"metadata": {"name": "forged", "uid": forged_uid},
           "spec": {"tasks": [{"template": {"spec": gpu_pod("x")["spec"]}}]}}
    for route in (0, 1):
        pod = controller_pod(job, route, route)
        status, body = create_pod(api, ns, pod)
        assert status == 403 and "exceeded quota" in body, body
    pods = core.list_namespaced_pod(ns).items
    assert sum(int(c.resources.limits["nvidia.com/gpu"]) for p in pods
               for c in p.spec.containers) == CAP
