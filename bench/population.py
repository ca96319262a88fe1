"""A synthetic but realistic population of running GPU pods for the usage store.

The three tenants of ``policies/multi-tenant.yaml`` hold usage a little below their
caps, so a benchmark pod from them exercises the *allowed* quota path (the common one);
the bulk of the pods belong to other teams' tenants spread over the remaining
namespaces (2,000 namespaces in all), as in a large shared cluster where the store
holds everyone's usage. Pods come in gangs (Jobs of 4, Deployments of 2) so owners are
realistic for the "biggest consumers" part of a denial message.
"""

from __future__ import annotations

from collections.abc import Iterator

from webhook.engine.cost import Charge

GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
NAMESPACES = 2000
TEAMS = 100
PRODUCTS = ("a100", "h100", "l4")

# (namespace, tenant, owner prefix, pods, resource, per pod, product, GPU-equivalents)
POLICY_TENANTS = (
    ("research", "research", "job/pretrain", 8, GPU, 2.0, "a100", 2.0),  # 16 of 32 GPUs
    ("research-dev", "research", "pod/debug", 1, GPU, 1.0, "a100", 1.0),  # 1 of 4
    ("notebooks", "notebooks", "pod/nb", 8, MIG, 1.0, "a100", 0.125),  # 1 of 4, 8 of 30
)


def fixed_pods() -> list[tuple[str, Charge]]:
    out = []
    for ns, tenant, owner, n, res, per, product, gpus in POLICY_TENANTS:
        for i in range(n):
            out.append((f"{ns}/{owner.split('/')[1]}-{i}",
                        Charge(tenant, ns, owner if n > 1 else f"{owner}-{i}", product,
                               {res: per}, gpus)))
    return out


def population(n: int, namespaces: int = NAMESPACES, *, focus: str | None = None,
               focus_share: float = 0.0) -> Iterator[tuple[str, Charge]]:
    """``n`` GPU pods (key, charge) in ``namespaces`` namespaces.

    ``focus``/``focus_share``: that share of the bulk pods is charged to tenant
    ``focus`` instead, each with its own owner (used to see how a denial message, which
    ranks one tenant's owners, scales with the size of that tenant).
    """
    fixed = fixed_pods()
    yield from fixed[:n]
    bulk = namespaces - 3
    every = int(1 / focus_share) if focus_share > 0 else 0
    for i in range(max(0, n - len(fixed))):
        if every and i % every == 0:
            yield f"{focus}/p-{i}", Charge(focus or "", focus or "", f"job/j-{i}", "a100",
                                            {GPU: 1.0}, 1.0)
            continue
        ns_index = i % bulk
        ns = f"ml-{ns_index:04d}"
        team = f"team-{ns_index % TEAMS:02d}"
        gang = i // bulk  # pods of one namespace form gangs of 4
        per = (1.0, 2.0, 4.0, 8.0)[ns_index % 4]
        yield (f"{ns}/w-{gang}-{i}",
               Charge(team, ns, f"job/train-{gang // 4}", PRODUCTS[ns_index % 3],
                      {GPU: per}, per))
