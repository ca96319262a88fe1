"""gpu-webhook: a Kubernetes admission webhook that governs GPU workloads.

The package is a pure policy core (``webhook.policy``, ``webhook.engine``,
``webhook.k8s.resources``, ``webhook.k8s.workloads``) with thin adapters around it
(``webhook.server.web.app`` for HTTPS, ``webhook.cli`` for the command line, ``webhook.libs.kube``
for the cluster, ``webhook.libs.certs`` for X.509).
"""

__version__ = "0.1.0"
