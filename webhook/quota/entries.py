"""A quota ledger as it is written in its ConfigMap: the ConfigMaps' names and labels,
and each reservation entry encoded and decoded.

The ledger is data from outside the process (anyone with RBAC on the ConfigMap can edit
it): every entry is range-checked on the way in, and one that is malformed (wrong types,
negative, NaN or absurd amounts, an expiry beyond the longest TTL) is dropped and logged,
never read as room. Dropping a corrupt entry can only free what it claimed, never more.
The store that commits them is :mod:`webhook.quota.ledger`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.engine.borrowed import account, borrower_of
from webhook.engine.cost import Charge
from webhook.libs import logs

LEDGER_PREFIX = "gpu-webhook-ledger-"
LABELS = {"app.kubernetes.io/name": "gpu-webhook", "gpu-webhook.dev/ledger": "quota"}
MAX_TTL = 3600.0  # the policy schema's upper bound for reservationTTLSeconds
# More devices than any one pod can ask for: an entry claiming more is not a reservation
# this webhook wrote (a pod's request is capped far below by the node it would run on).
MAX_AMOUNT = 1e6
MAX_GANG_IDS = 8  # a gang is found by its uid and its controller's label: a few at most


@dataclass(frozen=True, slots=True)
class Entry:
    charge: Charge
    expires: float  # unix time
    name: str | None = None  # "namespace/name" of the pod (None in ledgers before names)
    # A gang slot (key ``<workload uid>#<n>``): what the gang's pods find it by, the
    # workload's uid first (webhook.quota.gang). Empty for a pod's reservation.
    gang: tuple[str, ...] = ()


def encode(entries: dict[str, Entry], memo: dict[str, tuple[Entry, dict[str, Any]]] | None = None
           ) -> dict[str, str]:
    """The ConfigMap data of a ledger. ``memo`` keeps each entry's JSON object from one
    encoding to the next (a ledger is rewritten whole on every commit and holds a
    TTL's worth of entries, nearly all unchanged since the last write)."""
    out = {}
    for key, e in entries.items():
        if memo is not None:
            known = memo.get(key)
            if known is not None and known[0] is e:
                out[key] = known[1]
                continue
        item: dict[str, Any] = {
            "ns": e.charge.namespace, "owner": e.charge.owner, "product": e.charge.product,
            "resources": dict(e.charge.resources), "gpus": e.charge.gpus,
            "expires": round(e.expires, 3)}
        if e.name is not None:
            item["name"] = e.name
        if e.charge.pods != 1:
            item["pods"] = e.charge.pods  # a DRA claim counts no GPU pod
        if e.charge.spot:
            item["spot"] = e.charge.spot  # GPU-equivalents on spot nodes
        if e.charge.shared:
            item["shared"] = e.charge.shared  # GPU-equivalents held as shares of devices
        if e.gang:
            item["gang"] = list(e.gang)
        if e.charge.user is not None:
            item["user"] = e.charge.user  # charged to this user too (userQuota)
        out[key] = item
        if memo is not None:
            memo[key] = (e, item)
    if memo is not None and len(memo) > 2 * len(entries) + 64:
        for key in [k for k in memo if k not in entries]:
            del memo[key]  # entries gone from the ledger (expired)
    return {"reservations": orjson.dumps(out, option=orjson.OPT_SORT_KEYS).decode()}


class Corrupt(ValueError):
    """One ledger entry (or the whole ledger) that this webhook did not write."""


def _amount(v: object, what: str) -> float:
    # bool is an int to Python, never an amount in a ledger this webhook wrote.
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Corrupt(f"{what} is {type(v).__name__}, not a number")
    n = float(v)
    if not math.isfinite(n) or n < 0 or n > MAX_AMOUNT:
        raise Corrupt(f"{what} is {v!r}: outside 0-{MAX_AMOUNT:g}")
    return n


def _pods(v: object) -> int:
    if v not in (0, 1) or isinstance(v, bool):
        raise Corrupt(f"pods is {v!r}: a reservation counts 0 or 1 GPU pod")
    return int(v)


def _text(v: object, what: str) -> str:
    if not isinstance(v, str) or not v or len(v) > 512:
        raise Corrupt(f"{what} is not a name")
    return v


def _entry(tenant: str, v: object, now: float) -> Entry:
    if not isinstance(v, dict):
        raise Corrupt(f"the entry is {type(v).__name__}, not an object")
    product = v.get("product")
    if product is not None:
        product = _text(product, "product")
    resources = v.get("resources")
    if not isinstance(resources, dict):
        raise Corrupt("resources is not an object")
    charge = Charge(tenant, _text(v.get("ns"), "ns"), _text(v.get("owner"), "owner"),
                    product, {_text(r, "a resource name"): _amount(n, f"resources[{r!r}]")
                              for r, n in resources.items()},
                    _amount(v.get("gpus"), "gpus"), _pods(v.get("pods", 1)),
                    _amount(v.get("spot", 0), "spot"),
                    _text(v["user"], "user") if v.get("user") is not None else None,
                    _amount(v.get("shared", 0), "shared"))
    if charge.resources and charge.gpus == 0:
        raise Corrupt("gpus is 0 for a pod with GPU resources")
    if charge.shared > charge.gpus + 1e-9 and not charge.spot:
        raise Corrupt(f"shared is {charge.shared!r}: more than its {charge.gpus!r} GPUs")
    expires = v.get("expires")
    if isinstance(expires, bool) or not isinstance(expires, (int, float)) \
            or not math.isfinite(expires):
        raise Corrupt(f"expires is {expires!r}, not a time")
    if expires > now + MAX_TTL + 60:  # + a minute of clock skew between replicas
        raise Corrupt(f"expires {expires - now:.0f}s from now, beyond the longest TTL")
    name = v.get("name")
    if name is not None:
        name = _text(name, "name")
        if not name.startswith(charge.namespace + "/"):
            raise Corrupt(f"name {name!r} is not in namespace {charge.namespace!r}")
    gang = v.get("gang")
    if gang is not None:
        if not isinstance(gang, list) or not 1 <= len(gang) <= MAX_GANG_IDS:
            raise Corrupt(f"gang is not a list of 1-{MAX_GANG_IDS} names")
        gang = tuple(_text(g, "a gang id") for g in gang)
        if name is not None or charge.pods != 1:
            raise Corrupt("a gang slot names no pod and counts one GPU pod")
    return Entry(charge, float(expires), name, gang or ())


def decode(tenant: str, data: dict[str, str], now: float | None = None,
           ledger: str = "") -> dict[str, Entry]:
    """The valid entries of a ledger. Each invalid one is logged and dropped; a ledger
    that is not JSON at all reads as empty (and is rewritten by the next commit) rather
    than blocking the tenant forever."""
    now = time.time() if now is None else now
    where = ledger or LEDGER_PREFIX + tenant
    try:
        raw: Any = orjson.loads(data.get("reservations") or "{}")
    except orjson.JSONDecodeError as exc:
        _corrupt(where, None, f"not JSON ({exc})")
        return {}
    if not isinstance(raw, dict):
        _corrupt(where, None, f"reservations is {type(raw).__name__}, not an object")
        return {}
    out: dict[str, Entry] = {}
    for key, v in raw.items():
        try:
            e = _entry(tenant, v, now)
            if e.gang and not str(key).startswith(e.gang[0] + "#"):
                raise Corrupt(f"a gang slot not keyed by its workload {e.gang[0]!r}")
            out[str(key)] = e
        except Corrupt as exc:
            _corrupt(where, str(key), str(exc))
    return out


def _corrupt(ledger: str, key: str | None, problem: str) -> None:
    logs.event("quota ledger entry is invalid and ignored; the next commit rewrites the "
               "ledger without it" if key else
               "quota ledger is unreadable and read as empty; the next commit rewrites it",
               logging.ERROR, ledger=ledger, entry=key, problem=problem)


# A cohort's ledger of borrowed reservations: ``gpu-webhook-borrowed-<cohort>``, a data
# key per borrowing tenant (``borrowed.<tenant>``) in the tenant ledger's format, whose
# entries are charged to the tenant's borrowed account (webhook.engine.borrowed).
BORROWED_PREFIX = "gpu-webhook-borrowed-"
BORROWED_LABELS = {**LABELS, "gpu-webhook.dev/ledger": "borrowed"}
_BORROWER_KEY = "borrowed."


def encode_borrowed(entries: dict[str, Entry]) -> dict[str, str]:
    by_tenant: dict[str, dict[str, Entry]] = {}
    for key, e in entries.items():
        tenant = borrower_of(e.charge.tenant) or e.charge.tenant
        by_tenant.setdefault(tenant, {})[key] = e
    return {_BORROWER_KEY + t: encode(es)["reservations"] for t, es in sorted(by_tenant.items())}


def decode_borrowed(data: dict[str, str], now: float | None = None, ledger: str = ""
                    ) -> dict[str, Entry]:
    """The valid entries of a cohort's ledger, each charged to its borrower's account."""
    out: dict[str, Entry] = {}
    for k, v in data.items():
        if not k.startswith(_BORROWER_KEY):
            _corrupt(ledger, k, "not a borrowing tenant's key (borrowed.<tenant>)")
            continue
        out.update(decode(account(k[len(_BORROWER_KEY):]), {"reservations": v}, now,
                          ledger))
    return out
