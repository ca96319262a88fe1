"""The admission reviews the benchmark sends, and the mixes they are sent in.

Objects are shaped like what the API server really sends: defaulted fields, a service
account token volume, environment, probes (about 2-3 KB of JSON per Pod), because the
cost of parsing and walking a review grows with its size. Every item states the outcome
it must get; ``check`` proves it in process before any load is run, so a mix can never
silently measure a different path than its name says.
"""

from __future__ import annotations

import copy
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonpatch
import orjson

from webhook.admission.webhooks import Cluster, Phase, admit, reply
from webhook.engine.decision import Decision
from webhook.engine.mutate import mutate
from webhook.engine.target import no_labels
from webhook.k8s.review import parse_review, request_review
from webhook.policy.compiled import CompiledPolicy, compile_policy
from webhook.policy.load import load_file
from webhook.quota.store import UsageStore

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "policies" / "multi-tenant.yaml"


@cache
def policy() -> CompiledPolicy:
    return compile_policy(load_file(POLICY))


def container(name: str, limits: dict[str, Any], requests: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    res: dict[str, Any] = {"limits": {"cpu": "8", "memory": "64Gi", **limits},
                           "requests": {"cpu": "8", "memory": "64Gi", **(requests or {})}}
    return {
        "name": name, "image": "registry.example.com/ml/pytorch:2.4.0-cuda12.4",
        "command": ["torchrun"], "args": ["--nproc-per-node=2", "train.py", "--config=cfg.yaml"],
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                                                                "fieldPath": "metadata.name"}}},
                {"name": "WANDB_PROJECT", "value": "pretrain"}],
        "ports": [{"containerPort": 29500, "name": "rdzv", "protocol": "TCP"}],
        "resources": res,
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
                           "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1,
                           "failureThreshold": 3},
        "volumeMounts": [{"name": "data", "mountPath": "/data"},
                         {"name": "kube-api-access-x7k2p", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
    }


def pod_spec(containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "containers": containers,
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
                    {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420,
                     "sources": [{"serviceAccountToken": {"expirationSeconds": 3607,
                                                          "path": "token"}},
                                 {"configMap": {"name": "kube-root-ca.crt",
                                                "items": [{"key": "ca.crt",
                                                           "path": "ca.crt"}]}}]}}],
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "serviceAccount": "default",
        "securityContext": {}, "schedulerName": "default-scheduler", "priority": 0,
        "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300}],
    }


def pod(name: str, namespace: str, limits: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "uid": "7d3c1f0e-5b2a-4c8e-9f11-2a3b4c5d6e7f",
                     "labels": {"app": "pretrain", "team": namespace},
                     "annotations": {"example.com/owner": "ml-platform"}},
        "spec": pod_spec([container("trainer", limits)]),
    }


def deployment(namespace: str, gpus: int, replicas: int) -> dict[str, Any]:
    template = {"metadata": {"labels": {"app": "serve"}},
                "spec": pod_spec([container("server", {"nvidia.com/gpu": gpus})])}
    template["spec"]["restartPolicy"] = "Always"
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llm-serve", "namespace": namespace,
                     "labels": {"app": "serve"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "serve"}},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {
                     "maxSurge": "25%", "maxUnavailable": "25%"}},
                 "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
                 "template": template},
    }


def mutated(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the mutating webhook leaves it (what the validating webhook sees)."""
    req = parse_review(orjson.dumps(request_review(copy.deepcopy(obj))))
    d = mutate(req, policy())
    assert d.allowed, d.message
    return jsonpatch.apply_patch(obj, d.patch)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Item:
    name: str
    path: str  # /mutate or /validate
    body: bytes
    expect: str  # "patch", "allow" (no patch), "deny"


def _item(name: str, path: str, obj: dict[str, Any], expect: str,
          dry_run: bool = False) -> Item:
    review = request_review(obj, uid=f"bench-{name}", dry_run=dry_run,
                            username="system:serviceaccount:ml:trainer")
    return Item(name, path, orjson.dumps(review), expect)


@cache
def items() -> dict[str, Item]:
    gpu = pod("trainer-0", "research", {"nvidia.com/gpu": 2})
    dev = pod("debug-0", "research-dev", {"nvidia.com/gpu": 1})
    cpu = pod("etl-0", "research", {})
    denied = pod("huge-0", "research", {"nvidia.com/gpu": 12})  # max 8 per pod
    denied["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = 1
    deploy = deployment("research", 1, 4)
    out = [
        _item("gpu-needs-mutation", "/mutate", gpu, "patch"),
        _item("gpu-already-correct", "/mutate", mutated(gpu), "allow"),
        _item("non-gpu", "/mutate", cpu, "patch"),  # a tenant's pod: NVIDIA_VISIBLE_DEVICES=void
        _item("deployment", "/mutate", deploy, "patch"),
        _item("denied", "/mutate", denied, "deny"),
        _item("gpu-quota-dryrun", "/validate", mutated(gpu), "allow", dry_run=True),
        _item("gpu-ns-quota-dryrun", "/validate", mutated(dev), "allow", dry_run=True),
        _item("non-gpu", "/validate", cpu, "allow"),
        _item("deployment-quota", "/validate", mutated(deploy), "allow"),
        _item("denied", "/validate", denied, "deny"),
    ]
    return {f"{i.path[1:]}:{i.name}": i for i in out}


@cache
def all_items() -> dict[str, Item]:
    """items() and the realistic mix's (kept apart: the in-process timings are per item
    of items(), and the realistic mix has a thousand one-off pods)."""
    return {**items(), **{f"{i.path[1:]}:{i.name}": i for i in realistic()}}


# Distinct one-off pods in the realistic mix: more than the mutating webhook keeps
# decisions for (webhook.server.web.reuse, 1,024), so that wrk's replay of the same bodies
# does not turn them into repeats the cache answers.
UNIQUE_PODS = 1100


def _owned(name: str, kind: str, gpus: int) -> dict[str, Any]:
    """A pod as its controller creates it: generateName, no name or uid yet."""
    obj = pod("", "research", {"nvidia.com/gpu": gpus})
    meta = obj["metadata"]
    del meta["name"], meta["uid"]
    meta["generateName"] = f"{name}-"
    meta["ownerReferences"] = [{"apiVersion": "apps/v1" if kind == "ReplicaSet" else "batch/v1",
                                "kind": kind, "name": name, "controller": True,
                                "uid": "4b1e6c9a-0d3f-4f7e-8a21-6c5d4e3f2a1b"}]
    return obj


def realistic() -> list[Item]:
    """The mix bench/apiserver.py sends through a real API server, as the reviews our
    webhook gets from it: per round, a pod of a ReplicaSet and of a Job (one shape
    each, the same every round), a one-off pod, a non-GPU pod tolerating the GPU taint
    (stripped), a pod the policy denies; each admitted pod's validating review (dry run).
    ``realistic`` in MIXES interleaves them as they arrive."""
    rs = _owned("serve-6d4cf56db7", "ReplicaSet", 1)
    job = _owned("finetune", "Job", 2)
    tolerating = pod("etl-0", "research", {})
    tolerating["spec"]["tolerations"].append({"key": "nvidia.com/gpu", "operator": "Exists"})
    denied = pod("mig-1", "research", {"nvidia.com/mig-1g.10gb": 1})  # not allowed here
    out = [_item("rs", "/mutate", rs, "patch"),
           _item("rs", "/validate", mutated(rs), "allow", dry_run=True),
           _item("job", "/mutate", job, "patch"),
           _item("job", "/validate", mutated(job), "allow", dry_run=True),
           _item("tolerating", "/mutate", tolerating, "patch"),
           _item("denied-pod", "/mutate", denied, "deny")]
    for i in range(UNIQUE_PODS):
        one = pod(f"notebook-{i}", "research", {"nvidia.com/gpu": 1 + i % 4})
        one["spec"]["containers"][0]["image"] = f"registry.example.com/ml/notebook:{i}"
        out += [_item(f"unique-{i}", "/mutate", one, "patch"),
                _item(f"unique-{i}", "/validate", mutated(one), "allow", dry_run=True)]
    return [Item(f"realistic-{i.name}", i.path, i.body, i.expect) for i in out]


def _realistic_keys() -> list[str]:
    keys: list[str] = []
    for i in range(UNIQUE_PODS):
        for name in ("rs", "job"):
            keys += [f"mutate:realistic-{name}", f"validate:realistic-{name}"]
        keys += [f"mutate:realistic-unique-{i}", f"validate:realistic-unique-{i}",
                 "mutate:realistic-tolerating", "mutate:realistic-denied-pod"]
    return keys


# Mixes: (endpoint, mix name) -> item keys, sent round-robin. "gpu" is the GPU-pod mix
# the targets are stated for; "all" adds the cheap and the expensive paths.
MIXES: dict[str, list[str]] = {
    "mutate/gpu": ["mutate:gpu-needs-mutation", "mutate:gpu-already-correct"],
    "mutate/all": ["mutate:gpu-needs-mutation", "mutate:gpu-already-correct",
                   "mutate:non-gpu", "mutate:deployment", "mutate:denied"],
    "validate/gpu": ["validate:gpu-quota-dryrun", "validate:gpu-ns-quota-dryrun"],
    "validate/all": ["validate:gpu-quota-dryrun", "validate:gpu-ns-quota-dryrun",
                     "validate:non-gpu", "validate:deployment-quota", "validate:denied"],
    # Both webhooks, the pods bench/apiserver.py creates (see realistic()).
    "realistic": _realistic_keys(),
}


def decide(item: Item, store: UsageStore | None) -> dict[str, Any]:
    """What the server's hot path does for one review, minus ASGI, metrics and logs:
    parse the envelope, run the admission pipeline, build the reply."""
    req = parse_review(item.body)
    phase = Phase.MUTATE if item.path == "/mutate" else Phase.VALIDATE
    d = run_now(admit(phase, req, policy(), Cluster(no_labels, store), 1.0))
    return reply(phase, req.uid, d, req.api_version)


def run_now(coro: Coroutine[Any, Any, Decision]) -> Decision:
    """Run a pipeline step that never waits (an in-memory store never does) without an
    event loop, whose per-call cost would hide the pipeline's own."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: Decision = done.value
        return result
    coro.close()
    raise RuntimeError("the admission pipeline waited: not an in-memory store?")


def check(store: UsageStore | None) -> None:
    """Every item gets the outcome its name promises (raises AssertionError if not)."""
    for key, item in all_items().items():
        r = decide(item, store)["response"]
        got = "deny" if not r["allowed"] else ("patch" if "patch" in r else "allow")
        assert got == item.expect, f"{key}: expected {item.expect}, got {got}: {r}"
