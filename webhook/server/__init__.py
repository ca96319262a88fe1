"""The online adapter: the HTTPS app the API server calls, how it is run (uvicorn, TLS,
certificates), its settings, the cluster wiring (watches, ledger), policy hot reload and
the Prometheus metrics. It runs the admission pipeline (``webhook.admission``) and adds
only HTTP, fail-closed handling and operations."""
