"""The policy file's schema, as strict pydantic models.

One file holds one ``GPUPolicy``. Field names in YAML are camelCase like Kubernetes
objects; an unknown field anywhere is an error (``extra="forbid"``) so a typo never
silently turns a rule off. Every field is documented in ``policies/README.md``; keep
the two in step.

Sections: core (version, kind, patterns, rules, modes, the strict base), resources
(GPU resources, device classes, products, tolerations, selectors, topology), quota
(quota, per-user caps, quota windows), budget (GPU time: budgets, accounting,
showback), spot, routes (routes to a GPU, priority,
cohorts), holding (runtime, per-GPU resources, routing, capabilities), tenant, kinds
(workload kinds) and spec (``Spec`` and ``GPUPolicy``).
"""

from webhook.policy.model.budget import Accounting, Budget, Period, Showback
from webhook.policy.model.core import (
    API_VERSION,
    KIND,
    FieldProblem,
    Metadata,
    Mode,
    OverQuota,
    Rule,
    TolerationPolicy,
    pattern_regex,
)
from webhook.policy.model.holding import (
    GPUCapabilities,
    MaxRuntime,
    PerGPU,
    Quantity,
    ResourcesPerGPU,
    Routing,
    RuntimeKind,
)
from webhook.policy.model.kinds import BUILT_IN_KINDS, WorkloadKind, WorkloadRole
from webhook.policy.model.quota import (
    USER_ANNOTATION,
    Count,
    Day,
    Equivalents,
    Quota,
    QuotaLimits,
    QuotaSchedule,
    QuotaWindow,
    UserQuota,
)
from webhook.policy.model.resources import (
    DeviceClass,
    GPUResources,
    HAMi,
    KAIFractions,
    LabelSelector,
    LabelSelectorRequirement,
    ProductRequest,
    Products,
    Toleration,
    Topology,
)
from webhook.policy.model.routes import (
    BorrowedPriority,
    Cohort,
    FairShare,
    GPURoutes,
    PriorityLimits,
    RouteChoice,
    VisibleDevicesChoice,
)
from webhook.policy.model.spec import Exemptions, GPUPolicy, QuotaLedger, RuleSettings, Spec
from webhook.policy.model.spot import (
    SPOT_PRESETS,
    FaultTolerance,
    SpotAffinity,
    SpotCapacity,
    SpotPlacement,
    TenantSpot,
)
from webhook.policy.model.tenant import Tenant

__all__ = [
    "API_VERSION",
    "BUILT_IN_KINDS",
    "KIND",
    "SPOT_PRESETS",
    "USER_ANNOTATION",
    "Accounting",
    "BorrowedPriority",
    "Budget",
    "Cohort",
    "Count",
    "Day",
    "DeviceClass",
    "Equivalents",
    "Exemptions", "FairShare",
    "FaultTolerance",
    "FieldProblem",
    "GPUCapabilities",
    "GPUPolicy",
    "GPUResources",
    "GPURoutes",
    "HAMi",
    "KAIFractions",
    "LabelSelector",
    "LabelSelectorRequirement",
    "MaxRuntime",
    "Metadata",
    "Mode",
    "OverQuota",
    "PerGPU",
    "Period",
    "PriorityLimits",
    "ProductRequest",
    "Products",
    "Quantity",
    "Quota",
    "QuotaLedger",
    "QuotaLimits",
    "QuotaSchedule",
    "QuotaWindow",
    "ResourcesPerGPU",
    "RouteChoice",
    "Routing",
    "Rule",
    "RuleSettings",
    "RuntimeKind",
    "Showback",
    "Spec",
    "SpotAffinity",
    "SpotCapacity",
    "SpotPlacement",
    "Tenant",
    "TenantSpot",
    "Toleration",
    "TolerationPolicy",
    "Topology",
    "UserQuota",
    "VisibleDevicesChoice",
    "WorkloadKind",
    "WorkloadRole",
    "pattern_regex",
]
