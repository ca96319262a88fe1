"""The one package that talks to the Kubernetes API (through the ``kubernetes`` client),
one module per family of objects.

Everything else speaks the product's terms: pods and namespaces arrive as plain dicts from
:class:`Watcher` (:mod:`.watch`; the pods on the event loop itself, :mod:`.loopwatch`),
the workload of a scale request is read as a plain dict by :class:`Workloads`
(:mod:`.workloads`), a DRA claim or template a pod names and the watch has not delivered
yet (or its PodGroup) by :class:`ResourceClaims` (:mod:`.claims`), the ledger reads and
writes one ConfigMap with a resourceVersion precondition (:mod:`.configmaps`), self-
managed certificates read and write one Secret the same way (:mod:`.secrets`) and set the
``caBundle`` of named webhook configurations (:mod:`.webhookconfigs`), the native
admission policies are listed, applied and deleted (:mod:`.admissionpolicies`), the leader
holds a Lease (:mod:`.leases`) and releases pods waiting for quota (:mod:`.pods`),
GPUPolicy, GPUQuota and PolicyReport objects are custom objects (:mod:`.custom`), and API
failures become :class:`Conflict`, :class:`NotFound` or :class:`Unreachable` with a
message that says what was tried (:mod:`.api`). Callers use the names below
(``kube.ConfigMaps``), not the modules.
"""

from webhook.libs.kube.admissionpolicies import AdmissionPolicies
from webhook.libs.kube.api import (
    Conflict,
    KubeError,
    NotFound,
    Unreachable,
    connect,
    translated,
)
from webhook.libs.kube.claims import ResourceClaims
from webhook.libs.kube.configmaps import ConfigMaps, StoredMap
from webhook.libs.kube.custom import (
    APPLY,
    POLICY_GROUP,
    POLICY_PLURAL,
    POLICY_VERSION,
    ClusterRecords,
    CustomObjects,
    GPUPolicies,
)
from webhook.libs.kube.leases import Leases, StoredLease
from webhook.libs.kube.loopwatch import LoopWatcher, loop_watcher
from webhook.libs.kube.pods import Pods, whoami
from webhook.libs.kube.secrets import Secrets, StoredSecret
from webhook.libs.kube.watch import ABSENT_RECHECK_SECONDS, DEFAULT_WATCH_WINDOW, Event, Watcher
from webhook.libs.kube.webhookconfigs import WEBHOOK_KINDS, WebhookConfigurations
from webhook.libs.kube.workloads import AUDITED_WORKLOADS, Workloads, list_objects, list_typed

__all__ = [
    "ABSENT_RECHECK_SECONDS",
    "APPLY",
    "AUDITED_WORKLOADS",
    "DEFAULT_WATCH_WINDOW",
    "POLICY_GROUP",
    "POLICY_PLURAL",
    "POLICY_VERSION",
    "WEBHOOK_KINDS",
    "AdmissionPolicies",
    "ClusterRecords",
    "ConfigMaps",
    "Conflict",
    "CustomObjects",
    "Event",
    "GPUPolicies",
    "KubeError",
    "Leases",
    "LoopWatcher",
    "NotFound",
    "Pods",
    "ResourceClaims",
    "Secrets",
    "StoredLease",
    "StoredMap",
    "StoredSecret",
    "Unreachable",
    "Watcher",
    "WebhookConfigurations",
    "Workloads",
    "connect",
    "list_objects",
    "list_typed",
    "loop_watcher",
    "translated",
    "whoami",
]
