"""gpu-webhook: a Kubernetes admission webhook that governs GPU workloads.

The package is a pure policy core (``webhook.policy``, ``webhook.engine``,
``webhook.resources``, ``webhook.workloads``) with thin adapters around it
(``webhook.server`` for HTTPS, ``webhook.cli`` for the command line, ``webhook.kube``
for the cluster, ``webhook.certs`` for X.509).
"""

__version__ = "0.1.0"
