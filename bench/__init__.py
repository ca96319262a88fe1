"""Benchmarks of gpu-webhook: HTTP load against the served webhook and a bare ASGI
baseline, plus in-process costs of the pure core and the quota store (``make bench``)."""
