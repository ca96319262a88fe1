"""gpu-webhook: a Kubernetes admission webhook that governs GPU workloads.

The package is a pure policy core (``webhook.policy``, ``webhook.engine``, ``webhook.k8s``
and the quota arithmetic of ``webhook.quota``) run by one admission pipeline
(``webhook.admission``), with thin adapters around it: ``webhook.server`` for HTTPS,
``webhook.tools`` and ``webhook.cli`` for the command line, ``webhook.libs.kube`` for the
cluster, ``webhook.libs.certs`` for X.509.
"""

__version__ = "0.1.0"
