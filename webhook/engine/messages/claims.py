"""Messages of Dynamic Resource Allocation: device classes, admin access, claims'
GPUs and pinning, claim templates the webhook has not seen."""

from __future__ import annotations

from collections.abc import Iterable

from webhook.engine.messages.words import PERSISTS, gpus_of, num, one_of

# --- Dynamic Resource Allocation -------------------------------------------------------


def device_class_not_allowed(cls: str, tenant: str, allowed: Iterable[str]) -> str:
    return (f"asks for devices of class {cls}; tenant {tenant} may use GPU device classes "
            f"[{one_of(allowed)}]. Use one of those in deviceClassName.")


def admin_access(cls: str) -> str:
    return (f"asks for {cls} devices with adminAccess, which gives access to devices in use "
            "by other pods. Only the platform's exempt namespaces may do that: drop "
            "adminAccess.")


def fake_extended_resource_claim(annotation: str) -> str:
    return (f"carries the annotation {annotation}, which only the scheduler may set (it marks "
            "a claim made for a plain nvidia.com/gpu request, which is not counted again). "
            "Remove the annotation.")


def claim_per_pod_max(asked: float, tenant: str, cap: float) -> str:
    return (f"asks for {num(asked)} GPUs in all; tenant {tenant} allows at most {gpus_of(cap)} "
            f"per pod, and every pod using this claim would hold them. Ask for {num(cap)} or "
            "fewer devices.")


def claim_unpinned(attribute: str, tenant: str, allowed: Iterable[str]) -> str:
    return (f"may be allocated a GPU of any product, but tenant {tenant}'s GPUs must be "
            f"[{one_of(allowed)}]. Add a selector on {attribute} (the mutating webhook adds "
            "it when it runs).")


def template_unknown(name: str, why: str | None = None) -> str:
    """``why``: "absent" when the API server was asked and has no such template, the
    reason its read failed, or None when it was not asked (offline: the manifests
    given)."""
    if why == "absent":
        return (f"uses ResourceClaimTemplate {name}, which does not exist in its namespace "
                "(the webhook asked the API server), so the GPUs it asks for cannot be "
                "counted. Create the template first, or fix its name in "
                "spec.resourceClaims.")
    if why is not None:
        return (f"uses ResourceClaimTemplate {name}, which the webhook has not seen yet and "
                f"could not read from the API server ({why}), so the GPUs it asks for "
                f"cannot be counted. {PERSISTS}.")
    return (f"uses ResourceClaimTemplate {name}, which the webhook has not seen, so the GPUs "
            "it asks for cannot be counted. Wait a few seconds and retry if the template was "
            "just created (the webhook learns of it a moment later); otherwise create it "
            "first.")
