"""Per-user caps and quota windows on a simulated GPU cluster of its own: the real
kube-apiserver (RBAC, impersonation), kube-controller-manager (Deployments' ReplicaSets
creating the pods, as their service accounts), kube-scheduler and kwok nodes, with two
webhook replicas behind a round-robin proxy sharing the ledger.

- Two users of one tenant, each capped at 4 GPUs, create Deployments of one-GPU pods at
  once (as themselves, by impersonation): their ReplicaSets race 8 pods each through both
  replicas, and exactly 4 of each user's are admitted, each pod carrying its user.
- A tenant's quota window switched by a clock the test holds: both replicas are given
  one clock offset file (``serve --test-clock-offset-file``, for tests only), and each
  replica in turn answers on each side of the boundary.
- A tenant allowed A100s and H100s, without per-product caps: a pod that names no
  product may run on either, and is counted on the product of the node it was bound to
  (the GPUQuota object, from the webhook's cache, and ``gpu-webhook status``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from e2ekit import assert_denied, gpu_webhook, wait_until
from gpucluster.fixtures import (
    a100_cluster,
    deployment,
    own_policy,
    own_sim,
    pod,
    pods,
    running,
    started,
)
from gpucluster.sim import SimCluster
from kubernetes import client as k8s

pytestmark = pytest.mark.e2e

USER = "gpu-webhook.dev/requested-by"

CLUSTER = a100_cluster("users-sim", "a100", 2, 8)
PRODUCTS = {"a100": "NVIDIA-A100-SXM4-80GB", "h100": "NVIDIA-H100-80GB-HBM3"}
CLUSTER["spec"]["gpuModels"]["h100"] = {"product": PRODUCTS["h100"],
                                        "nvmlName": "NVIDIA H100 80GB HBM3",
                                        "memoryMiB": 81559, "family": "hopper"}
CLUSTER["spec"]["nodeGroups"].append({"name": "h100", "count": 1, "rack": "rack-a",
                                      "gpu": {"model": "h100", "count": 8}})

POLICY = own_policy("users-sim", """\
    - name: team
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: team}
      quota: {gpus: 16}
      userQuota: {gpus: 4}
    - name: lab
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: lab}
      quota: {gpus: 1}
      quotaSchedule:
        timeZone: Europe/Berlin
        windows:
          - name: working-hours
            days: [Mon, Tue, Wed, Thu, Fri]
            start: "08:00"
            end: "18:00"
            quota: {gpus: 3}
    - name: either
      namespaceSelector:
        matchLabels: {gpu.example.com/tenant: either}
      allowedProducts: [a100, h100]
      quota: {gpus: 8}
""", spec="""\
  products:
    nodeLabel: nvidia.com/gpu.product
    aliases: {a100: NVIDIA-A100-SXM4-80GB, h100: NVIDIA-H100-80GB-HBM3}
""")


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    work = tmp_path_factory.mktemp("users-sim")
    (work / "clock-offset").write_text("0")
    args = ["--test-clock-offset-file", str(work / "clock-offset"),
            "--quota-status-seconds", "1", "--audit-seconds", "0"]
    with started(own_sim(work, CLUSTER, POLICY, replicas=2, as_installed=True,
                         webhook_args=args)) as cluster:
        yield cluster


def as_user(sim: SimCluster, user: str, namespace: str, obj: dict[str, Any]) -> Any:
    """``kubectl create`` as ``user`` (impersonated: the API server's userInfo is
    theirs, as with their own credentials)."""
    return sim.cp.kubectl("create", f"--as={user}", "-n", namespace, "-f", "-", check=False,
                          input=yaml.safe_dump(obj))


def test_two_users_racing_through_deployments_get_exactly_their_4_each(
        own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Callable[[str], str]) -> None:
    ns = tenant_ns("team")
    for user in ("alice", "bob"):
        own_cluster.cp.kubectl("create", "rolebinding", f"{user}-edit", "-n", ns,
                               "--clusterrole=edit", f"--user={user}")
    # 4 Deployments of 2 one-GPU pods per user, created at once: 8 pods each, raced by
    # their ReplicaSets through both webhook replicas.
    work = [(u, f"{u}-{i}") for u in ("alice", "bob") for i in range(4)]
    with ThreadPoolExecutor(len(work)) as pool:
        done = list(pool.map(lambda w: as_user(own_cluster, w[0], ns,
                                               deployment(w[1], 2, 1)), work))
    for d in done:
        assert d.returncode == 0, d.stderr

    def refused(user: str) -> set[str]:
        """The ReplicaSets of ``user`` with a pod creation refused on their cap."""
        out = set()
        for e in api.list_namespaced_event(ns, field_selector="reason=FailedCreate").items:
            if f"user {user} holds 4 of their 4 GPUs in tenant team" in (e.message or ""):
                out.add(e.involved_object.name)
        return out

    def by_user() -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"alice": [], "bob": []}
        for p in pods(api, ns):
            out.setdefault((p.metadata.annotations or {}).get(USER, "?"), []).append(p)
        return out

    def settled() -> bool:
        # Every Deployment's ReplicaSet has its 2 pods or has had a creation refused on
        # its user's cap: all 16 pods were tried.
        held = by_user()
        for user in ("alice", "bob"):
            per_rs = Counter(p.metadata.owner_references[0].name for p in held[user])
            tried = {rs for rs, n in per_rs.items() if n >= 2} | refused(user)
            if len({rs.rsplit("-", 1)[0] for rs in tried}) < 4:
                return False
        return True

    wait_until("every ReplicaSet to have its pods or a refusal", settled, timeout=120,
               every=0.5)
    held = by_user()
    assert sorted(held) == ["alice", "bob"], sorted(held)  # no pod of no one, or of "?"
    assert (len(held["alice"]), len(held["bob"])) == (4, 4)
    running(api, ns, 8)
    # Both replicas took part, and the ledger charged each reservation to its user.
    proxy = own_cluster.webhook.proxy  # type: ignore[union-attr]
    assert proxy is not None and all(n > 0 for n in proxy.connections.values())
    ledger = json.loads(own_cluster.cp.kubectl(
        "get", "configmap", "-n", "gpu-webhook", "gpu-webhook-ledger-team", "-o",
        "json").stdout)["data"]["reservations"]
    users = {e["user"] for e in json.loads(ledger).values()}
    assert users == {"alice", "bob"}
    # The GPUQuota object (kubectl get gpuquota) counts each user's GPUs.

    def per_user() -> dict[str, Any]:
        obj = json.loads(own_cluster.cp.kubectl("get", "gpuquota", "-n", ns, "team", "-o",
                                                "json", check=False).stdout or "{}")
        return {c["scope"]: c["used"] + c["reserved"]
                for c in (obj.get("status") or {}).get("caps", ())}

    wait_until("the GPUQuota status to count each user's 4", lambda: (
        per_user().get("user alice"), per_user().get("user bob")) == (4, 4), timeout=30,
        every=0.5)


# ------------------------------------------------------------- quota windows by a clock

BERLIN = ZoneInfo("Europe/Berlin")


def set_clock(sim: SimCluster, when: str) -> None:
    """Both replicas' quota clock to ``when`` (Berlin time), by their offset file."""
    target = datetime.fromisoformat(when).replace(tzinfo=BERLIN).timestamp()
    (sim.work_dir / "clock-offset").write_text(f"{target - time.time():.3f}\n")


def through(sim: SimCluster, index: int, namespace: str, name: str) -> Any:
    """Create a 1-GPU pod with replica ``index`` answering."""
    assert sim.webhook is not None and sim.webhook.proxy is not None
    sim.webhook.proxy.route([sim.webhook.replicas[index].port])
    return sim.cp.kubectl("create", "-n", namespace, "-f", "-", check=False,
                          input=yaml.safe_dump(pod(name, 1)))


def test_a_quota_window_switches_on_both_replicas_with_the_clock(
        own_cluster: SimCluster, api: k8s.CoreV1Api, tenant_ns: Callable[[str], str]) -> None:
    ns = tenant_ns("lab")
    assert own_cluster.webhook is not None and own_cluster.webhook.proxy is not None
    both = [r.port for r in own_cluster.webhook.replicas]
    try:
        set_clock(own_cluster, "2026-03-02 07:59:00")  # a Monday, before the window
        assert through(own_cluster, 0, ns, "w0").returncode == 0
        for i in (0, 1):
            d = through(own_cluster, i, ns, "w1")
            assert_denied(d, "tenant lab would use 2 of its 1 GPUs: 1 in use")
        set_clock(own_cluster, "2026-03-02 08:00:30")  # the window's 3, on each replica
        for i, name in ((0, "w1"), (1, "w2")):
            d = through(own_cluster, i, ns, name)
            assert d.returncode == 0, d.stderr
        for i in (0, 1):
            d = through(own_cluster, i, ns, "w3")
            assert_denied(d, "would use 4 of its 3 GPUs in window working-hours")

        def shown() -> str:
            obj = json.loads(own_cluster.cp.kubectl("get", "gpuquota", "-n", ns, "lab", "-o",
                                                    "json", check=False).stdout or "{}")
            return str((obj.get("status") or {}).get("window", ""))

        wait_until("the GPUQuota status to show the window", lambda: shown().startswith(
            "working-hours (Mon,Tue,Wed,Thu,Fri 08:00-18:00 Europe/Berlin)"), timeout=30,
            every=0.5)
        running(api, ns, 3)
        set_clock(own_cluster, "2026-03-02 18:00:30")  # after it: 1 again, for new pods
        for i in (0, 1):
            d = through(own_cluster, i, ns, "w4")
            assert_denied(d, "tenant lab would use 4 of its 1 GPUs: 3 in use")
        # The pods admitted in the window keep running.
        assert sorted(p.metadata.name for p in pods(api, ns)
                      if p.status.phase == "Running") == ["w0", "w1", "w2"]
        wait_until("the GPUQuota status to leave the window", lambda: shown() == "",
                   timeout=30, every=0.5)
    finally:
        own_cluster.webhook.proxy.route(both)
        (own_cluster.work_dir / "clock-offset").write_text("0\n")


# ------------------------------------------------- a pod allowed two products, counted


def gpu_node(api: k8s.CoreV1Api, product: str) -> str:
    (node, *_) = api.list_node(label_selector=f"nvidia.com/gpu.product={product}").items
    return str(node.metadata.name)


def test_a_pod_allowed_two_products_is_counted_on_the_one_it_runs_on(
        own_cluster: SimCluster, api: k8s.CoreV1Api,
        tenant_ns: Callable[[str | None], str]) -> None:
    """Neither pod names a product: the webhook allows both of the tenant's (its node
    affinity lists both) and charges it to neither at admission; once bound, each counts
    on the product of its node."""
    ns = tenant_ns("either")
    for product, gpus in (("a100", 1), ("h100", 2)):
        p = pod(f"on-{product}", gpus)
        # Where it runs is the pod's own choice (a hostname), within what it is allowed.
        p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": gpu_node(api, PRODUCTS[product])}
        made = own_cluster.cp.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(p),
                                      check=False)
        assert made.returncode == 0, made.stderr
    for p in running(api, ns, 2):
        terms = p.spec.affinity.node_affinity.\
            required_during_scheduling_ignored_during_execution.node_selector_terms
        allowed = [sorted(e.values) for t in terms for e in t.match_expressions
                   if e.key == "nvidia.com/gpu.product"]
        assert allowed and all(v == sorted(PRODUCTS.values()) for v in allowed), allowed
    want = [{"product": "a100", "gpus": 1}, {"product": "h100", "gpus": 2}]

    def by_product() -> Any:
        got = own_cluster.cp.kubectl("get", "gpuquota", "-n", ns, "either", "-o", "json",
                                     check=False)
        return (json.loads(got.stdout or "{}").get("status") or {}).get("byProduct")

    wait_until("the GPUQuota object to count each pod on its node's product",
               lambda: by_product() == want, timeout=30, every=0.5)
    # The offline tool reads the pods and nodes and counts the same.
    out = gpu_webhook("status", "--kubeconfig", str(own_cluster.cp.kubeconfig), "--policy",
                      str(own_cluster.policy), "--tenant", "either")
    assert "either: GPUs in use by product: a100 1, h100 2" in out.stdout, out.stdout
