"""Start the webhook for the benchmark exactly as ``gpu-webhook serve`` runs it.

``webhook.server.run.run`` is called unchanged (same uvicorn config, TLS context, uvloop,
httptools protocol, logging, policy and certificate watchers); the only difference
is that the MemoryStore it builds is preloaded with a synthetic population of running
GPU pods, as a real store fed by the cluster would be. This is done by substituting the
store class seen by ``serve`` rather than by a flag of the product, so no benchmark-only
option ships in ``gpu-webhook serve``.

    python -m bench.launch --preload 1000 --host 127.0.0.1 --port P --cert-dir D --policy F
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench.population import population
from webhook.quota.store import MemoryStore
from webhook.server import run as serve
from webhook.server.settings import Settings

PRELOADED = "bench: usage store preloaded with {n} GPU pods"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.launch", description=__doc__)
    parser.add_argument("--preload", type=int, default=1000,
                        help="running GPU pods to put in the usage store")
    Settings.add_arguments(parser)
    args = parser.parse_args(argv)
    settings = Settings.from_args(args)
    n = args.preload

    class PreloadedStore(MemoryStore):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.load(population(n))
            print(PRELOADED.format(n=len(self.pods)), file=sys.stderr, flush=True)

    serve.MemoryStore = PreloadedStore  # type: ignore[attr-defined]
    return serve.run(settings)


if __name__ == "__main__":
    sys.exit(main())
