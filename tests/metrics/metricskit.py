"""A real ``gpu-webhook serve`` subprocess for the metrics tests, an HTTPS client that
trusts its development CA, and a Prometheus text parser."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from kit import await_serving, free_port, listening, stop_process
from kit import serve as start
from prometheus_client.parser import text_string_to_metric_families

from webhook.k8s.review import request_review

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "policies" / "multi-tenant.yaml"
GPU_WEBHOOK = str(Path(sys.executable).with_name("gpu-webhook"))


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    client: httpx.Client
    log: Path

    def post(self, path: str, review: dict[str, Any]) -> httpx.Response:
        return self.client.post(self.url + path, json=review)

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics: (name, sorted labels) -> value."""
        r = self.client.get(self.url + "/metrics")
        r.raise_for_status()
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(r.text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def metric_names(self) -> set[str]:
        """Every series name /metrics can carry, including those of labelled families
        with no sample yet (a counter nobody has incremented)."""
        r = self.client.get(self.url + "/metrics")
        r.raise_for_status()
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"],
                    "summary": ["_count", "_sum"]}
        names: set[str] = set()
        for f in text_string_to_metric_families(r.text):
            names.add(f.name)
            names.update(f.name + s for s in suffixes.get(f.type, []))
            names.update(s.name for s in f.samples)
        return names

    def generation(self) -> int:
        return int(self.client.get(self.url + "/readyz").json()["generation"])


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], metric: str,
          /, **labels: str) -> float:
    """Sum of the samples of ``metric`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items()
               if n == metric and set(labels.items()) <= set(ls))




@contextmanager
def serve(tmp: Path, policy: Path, *flags: str) -> Iterator[Server]:
    port = free_port()
    log = tmp / "server.log"
    proc = start(port, tmp / "certs", log, "--policy", str(policy),
                 "--policy-poll-seconds", "0.05", *flags)
    try:
        await_serving(proc, listening(port), log.read_text, "listening")
        trust = ssl.create_default_context(cafile=str(tmp / "certs" / "ca.pem"))
        with httpx.Client(verify=trust, timeout=10) as client:
            yield Server(proc, f"https://localhost:{port}", client, log)
    finally:
        stop_process(proc, 20)


def wait_for(predicate: Any, what: str, timeout: float = 30.0) -> None:
    """Poll until ``predicate()`` is true (a generous ceiling, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def pod_review(name: str, namespace: str, gpus: int | str = 1, *, request: int | None = None,
               resource: str = "nvidia.com/gpu", mutated: bool = False,
               dry_run: bool = False) -> dict[str, Any]:
    """A GPU pod's AdmissionReview; ``mutated`` gives the object as the validating webhook
    sees it (request = limit, pinned to A100, with a uid)."""
    resources: dict[str, Any] = {"limits": {resource: gpus}}
    if request is not None:
        resources["requests"] = {resource: request}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda",
                                            "resources": resources}]}
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if mutated:
        resources["requests"] = {resource: gpus}
        spec["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                                "topology.example.com/gpu-rack": "rack-a"}
        meta["uid"] = str(uuid.uuid4())
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    review: dict[str, Any] = dict(request_review(pod, uid=str(uuid.uuid4()), dry_run=dry_run))
    return review


def write_policy(path: Path, edit: dict[str, Any] | None = None, text: str | None = None
                 ) -> None:
    """Write a policy by atomic rename (as a ConfigMap update swaps a symlink)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    if text is None:
        doc = yaml.safe_load(POLICY.read_text())
        for key, v in (edit or {}).items():
            doc["metadata" if key == "name" else "spec"][key] = v
        text = yaml.safe_dump(doc, sort_keys=False)
    tmp.write_text(text)
    os.replace(tmp, path)
