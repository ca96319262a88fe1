"""Which GPU product and topology group a pod is pinned to, and the conflicts.

A pod names a product by the policy's request label or annotation, by a nodeSelector
on the product node label, or by its own required node affinity; otherwise it gets the
tenant's default product (or any of its allowed products). Node-affinity terms are ORed,
so a term already confined to allowed products other than the default is kept as it is
and only the others get the chosen product, unless the pod asked for a product or the
tenant's quota is per product (which needs every pod pinned to one product): then the
chosen product goes into every term. The topology group comes from the tenant.
Conflicts between what the pod asks and what the tenant allows are reported under the
``allowed-products`` and ``topology`` rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.engine import messages
from webhook.engine.decision import Checker
from webhook.engine.placement import Placement, Restriction
from webhook.k8s.objects import child_map
from webhook.k8s.workloads import PodTemplate
from webhook.policy.compiled import CompiledPolicy
from webhook.policy.model import Rule


@dataclass(slots=True)
class Requirement:
    """A node label the pod must be pinned to, with the values it may take."""

    rule: Rule
    key: str
    values: list[str]
    # Values a term may already be confined to and be left as it is (Placement.pin).
    keep: frozenset[str] = frozenset()


def _asked_product(check: Checker, policy: CompiledPolicy, template: PodTemplate,
                   placement: Placement) -> tuple[str | None, bool]:
    """The product the pod names explicitly (short name), and whether asking failed."""
    asks: list[tuple[str, str]] = []  # (value, where it was written)
    meta = template.metadata
    if meta is not None:
        for key, field, label in ((policy.product_request_label, "labels", "label"),
                                  (policy.product_request_annotation, "annotations",
                                   "annotation")):
            if key is None:
                continue
            m = child_map(meta, field, template.pointer + "/metadata")
            if m is not None and isinstance(m.get(key), str):
                asks.append((m[key], f"{label} {key}"))
    sel = placement.selector()
    if sel is not None and isinstance(sel.get(policy.product_label), str):
        value = sel[policy.product_label]
        if value in policy.product_value and value not in policy.product_value.values():
            # A short name matches no node: nodes carry the full label value, so the pod
            # would never schedule (and the validating webhook would refuse it).
            check.report(Rule.ALLOWED_PRODUCTS, messages.selector_short_name(
                policy.product_label, value, policy.product_value[value]))
            return None, True
        asks.append((value, f"nodeSelector {policy.product_label}"))
    names: list[str] = []
    tenant = check.tenant
    for value, source in asks:
        name = policy.product_name(value)
        if name is None:
            # Offer what this pod may actually use, not every product of the cluster.
            usable = (tenant.allowed_products if tenant and tenant.allowed_products is not None
                      else sorted(policy.product_value))
            check.report(Rule.ALLOWED_PRODUCTS, messages.unknown_product(value, source, usable))
            return None, True
        if name not in names:
            names.append(name)
    if len(names) > 1:
        check.report(Rule.ALLOWED_PRODUCTS, messages.products_disagree(names))
        return None, True
    if names:
        if tenant and tenant.allowed_products is not None and names[0] not in \
                tenant.allowed_products:
            check.report(Rule.ALLOWED_PRODUCTS,
                         messages.product_not_allowed(names[0], asks[0][1], tenant.name,
                                                      tenant.allowed_products))
            return None, True
        return names[0], False
    return None, False


def requirements(check: Checker, policy: CompiledPolicy, template: PodTemplate,
                 placement: Placement, products: bool = True) -> list[Requirement]:
    """The node-label requirements the mutating webhook adds: the product (unless
    ``products`` is False: DRA claims pin their devices' product themselves), then the
    topology group; reports conflicts. ``placement`` is the template spec's, shared with
    the caller's pins."""
    out: list[Requirement] = []
    product = _product(check, policy, template, placement) if products else None
    if product is not None:
        out.append(product)
    if check.tenant is not None and check.tenant.topology_label:
        topology = _topology(check, placement)
        if topology is not None:
            out.append(topology)
    return out


def _product(check: Checker, policy: CompiledPolicy, template: PodTemplate,
             placement: Placement) -> Requirement | None:
    """The GPU product to pin the pod to: the one it asked for, its own affinity's choice
    within the allowed set, or the tenant's default (or allowed) products."""
    tenant = check.tenant
    asked, failed = _asked_product(check, policy, template, placement)
    if failed:
        return None
    allowed = list(tenant.allowed_products) if tenant and tenant.allowed_products else None
    own = placement.restriction(policy.product_label)
    products = _chosen(check, policy, asked, own, allowed)
    if products:
        products = _satisfiable(check, policy, placement, products, asked, own, allowed)
    if products:
        named: frozenset[str] = frozenset()
        if asked is None and tenant is not None and not tenant.capped_products:
            # Terms are ORed: the chosen product ANDed into a term that names another
            # allowed product would leave that term no node. Such a term has made its
            # choice and is kept. The default is left out: a term offering it among
            # others is narrowed to it, as a pod with that term alone is. A pod that
            # asked by label or annotation is pinned to what it asked everywhere.
            named = frozenset(policy.product_value[p]
                              for p in allowed or sorted(policy.product_value)
                              if p != tenant.default_product)
        return Requirement(Rule.ALLOWED_PRODUCTS, policy.product_label,
                           [policy.product_value[p] for p in products], named)
    return None


def _values(policy: CompiledPolicy, products: list[str] | None) -> list[str]:
    """The node-label values of products (every product when ``products`` is None): a
    message about ``nvidia.com/gpu.product in [...]`` names what nodes carry, not the
    policy's short names, which no node matches."""
    return [policy.product_value[p] for p in (products or sorted(policy.product_value))]


def _chosen(check: Checker, policy: CompiledPolicy, asked: str | None,
            own: Restriction | None, allowed: list[str] | None) -> list[str] | None:
    """The products the pod may be pinned to, before its own terms are considered."""
    tenant = check.tenant
    products: list[str] | None = None
    if asked is not None:
        products = [asked]
    elif own is not None:
        # The pod's own affinity picks among products; keep its choice within the
        # tenant's allowed set (and the default when it allows several).
        # Only full label values match nodes: a short name in the pod's own affinity
        # matches none, and ANDing the full value next to it would leave no node.
        full = set(policy.product_value.values())
        short = sorted(v for v in own.values if v in policy.product_value and v not in full)
        mine = [n for v in sorted(own.values)
                if v in full and (n := policy.product_name(v))]
        ok = [n for n in mine if allowed is None or n in allowed]
        if not ok and short:
            check.report(Rule.ALLOWED_PRODUCTS, messages.affinity_short_name(
                policy.product_label, short[0], policy.product_value[short[0]]))
        elif not ok:
            shown = sorted(own.values)
            check.report(Rule.ALLOWED_PRODUCTS, messages.placement_conflict(
                own.source, policy.product_label, shown, tenant.name if tenant else "-",
                _values(policy, allowed)))
        elif tenant and tenant.default_product in ok and len(ok) > 1:
            products = [tenant.default_product]
        else:
            products = ok
    elif tenant and tenant.default_product:
        products = [tenant.default_product]
    elif allowed:
        products = allowed
    return products


def _satisfiable(check: Checker, policy: CompiledPolicy, placement: Placement,
                 products: list[str], asked: str | None, own: Restriction | None,
                 allowed: list[str] | None) -> list[str]:
    """``products`` narrowed (or, for a default, widened) to what leaves the pod's own
    node-affinity terms satisfiable; a conflict is reported and leaves none."""
    tenant = check.tenant
    banned = placement.excluded(policy.product_label)
    if banned:
        # A product every term rules out (NotIn) would make the pod unschedulable:
        # fall back to the other allowed products, or report the conflict.
        keep = [p for p in products if policy.product_value[p] not in banned]
        if not keep and asked is None and own is None and allowed:
            keep = [p for p in allowed if policy.product_value[p] not in banned]
        if not keep and asked is not None:
            check.report(Rule.ALLOWED_PRODUCTS, messages.asked_product_ruled_out(
                asked, policy.product_value[asked], policy.product_label))
        elif not keep:
            check.report(Rule.ALLOWED_PRODUCTS, messages.placement_conflict(
                "node affinity", policy.product_label, [],
                tenant.name if tenant else "-", _values(policy, allowed)))
        products = keep
    if products and asked is not None and not placement.survives(
            policy.product_label, [policy.product_value[asked]]):
        # The pod named a product and its own terms rule it out: widening, as for a
        # default, would run it on a product it did not ask for.
        check.report(Rule.ALLOWED_PRODUCTS, messages.asked_product_ruled_out(
            asked, policy.product_value[asked], policy.product_label))
        products = []
    if products and not placement.survives(policy.product_label,
                                           [policy.product_value[p] for p in products]):
        # Terms that each rule out the chosen product in their own way (one In
        # another product, one NotIn it): widen to every allowed product that
        # leaves a term satisfiable, or report the conflict.
        wide = [p for p in (allowed or []) if p not in products]
        products = [*products, *wide]
        if not placement.survives(policy.product_label,
                                  [policy.product_value[p] for p in products]):
            check.report(Rule.ALLOWED_PRODUCTS, messages.placement_conflict(
                "node affinity", policy.product_label, [],
                tenant.name if tenant else "-", _values(policy, allowed)))
            products = []
    return products


def _topology(check: Checker, placement: Placement) -> Requirement | None:
    """The tenant's topology group (rack, NVLink domain): every allowed value the pod's
    own terms leave open."""
    tenant = check.tenant
    assert tenant is not None and tenant.topology_label is not None
    own = placement.restriction(tenant.topology_label)
    values = list(tenant.topology_values)
    banned = placement.excluded(tenant.topology_label)
    values = [v for v in values if v not in banned]
    if own is not None:
        values = [v for v in values if v in own.values]
    if not values or not placement.survives(tenant.topology_label, values):
        values = []
        check.report(Rule.TOPOLOGY, messages.placement_conflict(
            own.source if own else "node affinity", tenant.topology_label,
            sorted(own.values) if own else [], tenant.name, tenant.topology_values))
    if values:
        # Nothing to keep: values are every allowed one the pod's terms leave open, so
        # a term confined to allowed values is already within them.
        return Requirement(Rule.TOPOLOGY, tenant.topology_label, values)
    return None


def check_pinned(check: Checker, policy: CompiledPolicy, template: PodTemplate,
                 products: bool = True) -> str | None:
    """Validating phase: the final pod must be confined to allowed products and topology.
    Returns the product short name the pod is pinned to, when it is exactly one.
    ``products`` False: the pod's GPUs come from DRA claims alone, whose devices are
    confined to products by their own selectors, so only the topology is checked here."""
    tenant = check.tenant
    product: str | None = None
    placement = Placement(template.spec, template.spec_pointer)
    own = placement.restriction(policy.product_label)
    if own is not None:
        names = {policy.product_name(v) for v in own.values}
        if len(names) == 1 and None not in names:
            product = names.pop()
    if tenant is None:
        return product
    reported = not products  # nothing to report about products
    if products and tenant.allowed_products is not None:
        allowed_values = [policy.product_value[p] for p in tenant.allowed_products]
        if own is None:
            check.report(Rule.ALLOWED_PRODUCTS, messages.unpinned(
                policy.product_label, tenant.name, allowed_values))
            reported = True
        elif not own.values <= set(allowed_values):
            check.report(Rule.ALLOWED_PRODUCTS, messages.placement_conflict(
                own.source, policy.product_label, sorted(own.values), tenant.name,
                allowed_values))
            reported = True
    if product is None and not reported and tenant.capped_products:
        # Quota charges a pod to a product only when it can land on that one alone: a pod
        # left free to choose would count against no product's cap. The mutating webhook
        # pins such a tenant's pods to one product; this catches a pod it did not see.
        check.report(Rule.ALLOWED_PRODUCTS, messages.one_product_needed(
            policy.product_label, sorted(own.values) if own else None, tenant.name,
            tenant.capped_products))
    if tenant.topology_label:
        own_t = placement.restriction(tenant.topology_label)
        if own_t is None:
            check.report(Rule.TOPOLOGY, messages.unpinned(
                tenant.topology_label, tenant.name, tenant.topology_values))
        elif not own_t.values <= set(tenant.topology_values):
            check.report(Rule.TOPOLOGY, messages.placement_conflict(
                own_t.source, tenant.topology_label, sorted(own_t.values), tenant.name,
                tenant.topology_values))
    return product
