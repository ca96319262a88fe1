"""Every developer-facing sentence the engine produces, in one place.

A denial reads resource -> rule -> reason -> how to fix, and ends with the rule and
tenant in brackets so a platform engineer can find the policy line. Golden files in
``tests/golden/`` pin the wording: a change here shows up as a diff there.

A module per family: words (what they all share), placement (requests, products,
pinning, caps), quota, claims (DRA), roles (training jobs), spot, borrowing, routes,
waiting and holding.
"""

from webhook.engine.messages.borrowing import (
    borrow_refused,
    borrowed,
    borrowed_priority_changed,
    gang_borrows,
    gang_never_fits_borrowing,
    not_borrowed,
)
from webhook.engine.messages.claims import (
    admin_access,
    claim_per_pod_max,
    claim_unpinned,
    device_class_not_allowed,
    fake_extended_resource_claim,
    template_unknown,
)
from webhook.engine.messages.holding import (
    capability_unpinned,
    capability_unreadable,
    duration,
    per_gpu,
    queue_unrouted,
    runtime_cap,
    runtime_longer,
    runtime_missing,
)
from webhook.engine.messages.placement import (
    affinity_short_name,
    asked_product_ruled_out,
    bad_kai_fraction,
    bad_quantity,
    bad_share,
    devices,
    malformed,
    no_tenant,
    one_product_needed,
    per_container_max,
    per_pod_max,
    placement_conflict,
    product_not_allowed,
    products_disagree,
    request_differs,
    resource_not_allowed,
    selector_short_name,
    tolerates_gpu_taint,
    unknown_product,
    unpinned,
    within,
)
from webhook.engine.messages.quota import (
    EXCEEDED_QUOTA,
    PODS,
    SHARED_GPUS,
    SPOT_GPUS,
    alternative,
    events_on,
    gang_never_fits,
    gang_not_free,
    gang_unreserved,
    in_window,
    most_pods,
    name_taken,
    quota_exceeded,
    quota_not_decided,
    quota_unavailable,
    scale_unchecked,
    tightest,
    user_not_recorded,
    user_quota_exceeded,
)
from webhook.engine.messages.roles import (
    parts,
    role_pod_never_fits,
    roles_exceed_quota,
    roles_never_fit,
    roles_not_free,
)
from webhook.engine.messages.routes import (
    device_host_path,
    device_taint_tolerated,
    holds_host_path,
    holds_privileged,
    holds_visible_devices,
    node_name,
    priority_above_ceiling,
    priority_class_not_allowed,
    privileged,
    visible_devices_charged,
    visible_devices_removed,
    visible_devices_uncharged,
    visible_devices_voided,
)
from webhook.engine.messages.spot import (
    spot_asked,
    spot_how_to_say,
    spot_not_fault_tolerant,
    spot_only,
    spot_ruled_out,
    spot_tenant_never,
    spot_tolerated,
    spot_unclear,
    spot_unguarded,
    spot_unpinned,
)
from webhook.engine.messages.waiting import (
    gang_pod_in_line,
    gate_removed_by_other,
    never_fits_event,
    ordinal,
    released_event,
    waiting_borrow_event,
    waiting_event,
    waiting_gang_event,
    waits_for_quota,
    waits_to_borrow,
)
from webhook.engine.messages.words import num, one_of, owners, tag

__all__ = [
    "EXCEEDED_QUOTA", "PODS", "SHARED_GPUS", "SPOT_GPUS", "admin_access",
    "affinity_short_name", "alternative", "asked_product_ruled_out", "bad_kai_fraction",
    "bad_quantity", "bad_share", "borrow_refused", "borrowed", "borrowed_priority_changed",
    "capability_unpinned", "capability_unreadable", "claim_per_pod_max", "claim_unpinned",
    "device_class_not_allowed", "device_host_path", "device_taint_tolerated", "devices",
    "duration", "events_on", "fake_extended_resource_claim", "gang_borrows",
    "gang_never_fits", "gang_never_fits_borrowing", "gang_not_free", "gang_pod_in_line",
    "gang_unreserved", "gate_removed_by_other", "holds_host_path", "holds_privileged",
    "holds_visible_devices", "in_window", "malformed", "most_pods", "name_taken",
    "never_fits_event", "no_tenant",
    "node_name", "not_borrowed", "num", "one_of", "one_product_needed", "ordinal", "owners",
    "parts", "per_container_max", "per_gpu", "per_pod_max", "placement_conflict",
    "priority_above_ceiling", "priority_class_not_allowed", "privileged",
    "product_not_allowed", "products_disagree", "queue_unrouted", "quota_exceeded",
    "quota_not_decided", "quota_unavailable", "released_event", "request_differs",
    "resource_not_allowed",
    "role_pod_never_fits", "roles_exceed_quota", "roles_never_fit", "roles_not_free",
    "runtime_cap", "runtime_longer", "runtime_missing", "scale_unchecked",
    "selector_short_name", "spot_asked", "spot_how_to_say", "spot_not_fault_tolerant",
    "spot_only", "spot_ruled_out", "spot_tenant_never", "spot_tolerated", "spot_unclear",
    "spot_unguarded", "spot_unpinned", "tag", "template_unknown", "tightest",
    "tolerates_gpu_taint", "unknown_product", "unpinned", "user_not_recorded",
    "user_quota_exceeded", "visible_devices_charged", "visible_devices_removed",
    "visible_devices_uncharged", "visible_devices_voided",
    "waiting_borrow_event", "waiting_event", "waiting_gang_event", "waits_for_quota",
    "waits_to_borrow", "within",
]
