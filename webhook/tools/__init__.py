"""The offline adapters: ``review``, ``review --replay``, ``test`` and ``manifests``. They
run the same admission pipeline as the server (``webhook.admission.webhooks``), with no server."""
