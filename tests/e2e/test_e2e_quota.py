"""GPU quota through the real API server, with two webhook replicas behind one address.

The replicas share nothing but the cluster: each keeps its own watch-fed pod cache and
commits reservations to the tenant's ledger ConfigMap with a resourceVersion
precondition. A burst of parallel creates, spread over both replicas, must admit
exactly as many pods as the quota holds; deletions free quota once the watches see
them; dry runs never reserve; a Job whose gang can never fit is refused at apply.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest
from controlplane.cluster import ControlPlane
from e2ekit import (
    LEDGER_NAMESPACE,
    Deployment,
    NamespaceFactory,
    absent,
    apply,
    apply_until_counted,
    assert_denied,
    assert_refused_at_create,
    assert_succeeded,
    core_client,
    denial_prefix,
    get_if_there,
    gpu_deployment,
    gpu_job,
    gpu_pod,
    sees_free_gpus,
    wait_until,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.e2e

E2E_REPLICAS = 2  # read by the `webhook` fixture: two replicas behind a round-robin proxy
WORKERS = 32


@pytest.fixture(scope="module")
def core(control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    with core_client(control_plane, WORKERS) as api:
        yield api


def create_all(core: client.CoreV1Api, namespace: str, names: list[str]
               ) -> tuple[list[str], list[str]]:
    """Create a 1-GPU pod per name, in parallel. Returns (created, refusal messages)."""

    def one(name: str) -> tuple[str, str | None]:
        try:
            core.create_namespaced_pod(namespace, gpu_pod(name, limits="1"))
        except ApiException as exc:
            body = orjson.loads(exc.body) if exc.body else {}
            return name, f"{exc.status}: {body.get('message', exc.reason)}"
        return name, None

    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(one, names))
    return ([n for n, err in results if err is None],
            [err for _, err in results if err is not None])


def pod_names(core: client.CoreV1Api, namespace: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace).items}


def ledger(cp: ControlPlane, tenant: str) -> dict[str, Any] | None:
    """The quota ledger ConfigMap of ``tenant``, or None while there is none."""
    return get_if_there(cp, LEDGER_NAMESPACE, "configmap", f"gpu-webhook-ledger-{tenant}")


def test_parallel_creates_across_two_replicas_admit_exactly_the_quota(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
    core: client.CoreV1Api,
) -> None:
    ns = namespace("burst")  # tenant burst: 10 GPUs
    assert webhook.proxy is not None
    before = dict(webhook.proxy.connections)

    created, refused = create_all(core, ns, [f"gpu-{i:03d}" for i in range(200)])

    assert len(created) == 10
    assert pod_names(core, ns) == set(created)
    # Every refusal is our quota denial, not a timeout or an error of the webhook.
    prefix = f"403: {denial_prefix(webhook.validating)}"
    assert len(refused) == 190
    odd = [m for m in refused
           if not (m.startswith(prefix) and "tenant burst would use 11 of its 10 GPUs" in m)]
    assert not odd, odd[:3]
    # Both replicas answered: the API server opened connections to each of them.
    used = Counter(webhook.proxy.connections) - Counter(before)
    assert len(used) == 2, dict(used)

    # Each replica counts the 10 pods, including those the other one admitted.
    assert not sees_free_gpus(webhook, ns, 1)

    # Free 5: once both replicas' watches have seen the deletions, exactly 5 more fit.
    gone = sorted(created)[:5]
    control_plane.kubectl("delete", "pod", "-n", ns, *gone, "--wait=true")
    wait_until("both replicas to see the deletions", lambda: sees_free_gpus(webhook, ns, 5),
               timeout=20, every=0.2)
    again, refused = create_all(core, ns, [f"more-{i:03d}" for i in range(50)])
    assert len(again) == 5
    assert len(refused) == 45
    assert pod_names(core, ns) == (set(created) - set(gone)) | set(again)


def test_dry_run_never_consumes_quota(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("dryrun")  # tenant dryrun: 4 GPUs
    before = ledger(control_plane, "dryrun")

    for i in range(5):
        out = apply(control_plane, ns, gpu_pod(f"try-{i}", limits="4"), dry_run=True)
        assert out.returncode == 0, out.stderr
        assert "(server dry run)" not in out.stderr
    # The tenant's ledger is untouched (not even created: nothing was ever reserved).
    assert ledger(control_plane, "dryrun") == before

    # Later real creates still fit: the dry runs left the whole quota free.
    out = apply(control_plane, ns, gpu_pod("real", limits="4"))
    assert_succeeded(out, "pod/real created")

    # A dry run is still checked: with the quota now full it is refused, with numbers.
    out = apply(control_plane, ns, gpu_pod("one-more", limits="1"), dry_run=True)
    assert_denied(out, "tenant dryrun would use 5 of its 4 GPUs: 4 in use",
                  webhook=webhook.validating)


def test_a_job_that_can_never_fit_is_refused_at_apply(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("gang")  # tenant gang: 16 GPUs
    out = apply(control_plane, ns, gpu_job("allreduce", limits="4", parallelism=5))

    assert_refused_at_create(
        out, webhook.validating,
        f"job {ns}/allreduce, pod template: asks for 5 pods x 4 = 20 GPUs at once, but "
        "tenant gang's quota is 16 GPUs: it can never run in full. Run at most 4 pods of "
        "this size, or fewer GPUs per pod. [rule quota, tenant gang]")
    assert absent(control_plane, ns, "job", "allreduce")


def test_a_deployment_larger_than_the_free_quota_is_created_with_a_warning(
    control_plane: ControlPlane, webhook: Deployment, namespace: NamespaceFactory,
) -> None:
    ns = namespace("gang")  # tenant gang: 16 GPUs
    apply_until_counted(control_plane, webhook, ns, gpu_pod("holder", limits="8"),
                        "both replicas to count the running pod", refused=9)

    out = apply(control_plane, ns, gpu_deployment("serve", limits="4", replicas=3))

    assert_succeeded(out, "deployment.apps/serve created")
    assert (f"Warning: deployment {ns}/serve, pod template: asks for 3 pods x 4 GPUs, but only "
            "8 of tenant gang's 16 GPUs are free now: 2 of its pods can start now and the rest "
            "will be refused until quota frees up.") in out.stderr


def test_each_replica_freezes_its_first_list_of_the_cluster(webhook: Deployment) -> None:
    # Long-lived objects out of the garbage collector's full passes (webhook.server.heap):
    # once at start, and once the watch caches have listed the cluster.
    for r in webhook.replicas:
        assert '"reason":"started"' in r.log()
        # Settled soon after the replica first turned ready (it polls for that).
        wait_until("the replica to settle its first list",
                   lambda r=r: '"reason":"caches listed the cluster"' in r.log())
