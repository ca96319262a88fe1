"""What the kubelet does for a ConfigMap volume, for the simulated cluster's webhook (kwok
nodes have no kubelet, and the webhook runs as a process): one key of a ConfigMap kept
in a file, written again whenever the ConfigMap changes, atomically (the kubelet swaps a
symlink; here a rename), so the replica's hot reload sees the edit as it would in a pod.
The kubelet does it within its sync period (up to about a minute); this follows a watch,
so a test sees the edit in a second or two.

Run as a process of its own (the demo leaves it running with the cluster)::

    python mount.py --kubeconfig K --namespace gpu-webhook --name gpu-webhook-policy \\
        --key policy.yaml --to /path/policy.yaml
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch


def write(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def follow(core: client.CoreV1Api, namespace: str, name: str, key: str, to: Path) -> None:
    """Write the key at once, then on every change, until stopped."""
    selector = f"metadata.name={name}"
    while True:
        listed: Any = core.list_namespaced_config_map(namespace, field_selector=selector)
        for cm in listed.items:
            if key in (cm.data or {}):
                write(to, cm.data[key])
        stream = watch.Watch().stream(
            core.list_namespaced_config_map, namespace, field_selector=selector,
            resource_version=listed.metadata.resource_version, timeout_seconds=300)
        try:
            for event in stream:
                cm = event["object"]
                if event["type"] in ("ADDED", "MODIFIED") and key in (cm.data or {}):
                    write(to, cm.data[key])
        except Exception:  # 410 Gone, a dropped stream, the API server
            time.sleep(1)  # restarting: as the kubelet, list again and go on


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--to", required=True, type=Path)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    core = client.CoreV1Api(config.new_client_from_config(config_file=args.kubeconfig))
    follow(core, args.namespace, args.name, args.key, args.to)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
