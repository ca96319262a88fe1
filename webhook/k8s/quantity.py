"""Kubernetes resource quantities, parsed the way the API server parses them.

The arithmetic comes from the ``kubernetes`` client's ``parse_quantity``; this module
adds the strictness that the API server has and the Python helper lacks: it refuses
booleans, NaN/Infinity, surrounding spaces and hexadecimal, all of which
``parse_quantity`` (built on ``Decimal``) would otherwise accept.

GPU counts are extended resources and must be whole numbers, so the main entry point
is :func:`gpu_count`, which returns an ``int`` or a reason why the value is not a
usable GPU count.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache

from kubernetes.utils.quantity import parse_quantity as _k8s_parse_quantity

parse_quantity: Callable[[object], Decimal] = _k8s_parse_quantity

# The grammar of k8s.io/apimachinery/pkg/api/resource.Quantity, as one regex:
# sign, digits with an optional point, then a binary/decimal SI suffix or a decimal
# exponent. Anything else (" 1", "0x10", "NaN") is rejected before parsing.
_QUANTITY = re.compile(
    r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)

# Beyond this the value is no count of devices that exists; refusing it early also keeps
# a hostile "1e999999999" from turning into a billion-digit integer.
MAX_COUNT = 10**15


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity, or not a whole GPU count of 0 or more."""


def parse(value: object) -> Decimal:
    """Parse a quantity given as a JSON string or number; raise QuantityError if invalid."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError(f"{value!r} is not a quantity (expected a string or a number)")
    if isinstance(value, str):
        if len(value) > 64 or not _QUANTITY.match(value):
            raise QuantityError(f"{_show(value)} is not a valid quantity")
        return _parse_str(value)
    try:
        q = parse_quantity(value)
    except (ValueError, ArithmeticError) as exc:
        raise QuantityError(f"{value!r} is not a valid quantity") from exc
    if not q.is_finite():
        raise QuantityError(f"{value!r} is not a finite quantity")
    return q


@lru_cache(maxsize=4096)
def _parse_str(value: str) -> Decimal:
    # The same few strings ("1", "2", "8") arrive on nearly every request: caching the
    # Decimal parse makes the hot path a dict lookup.
    try:
        return parse_quantity(value)
    except (ValueError, ArithmeticError) as exc:
        raise QuantityError(f"{_show(value)} is not a valid quantity") from exc


def gpu_count(value: object) -> int:
    """The whole number of devices a GPU quantity asks for (0 included: see :func:`is_zero`).

    Raises QuantityError with a developer-facing reason for values that are not
    quantities, fractional ("500m", "1.5"), negative, or absurdly large.
    """
    q = parse(value)
    if q.adjusted() > 15:
        raise QuantityError(f"{_show(value)} is far more devices than any node has")
    if q != q.to_integral_value():
        # Shown as the number it is, not as written: the API server hands admission its
        # canonical form ("500m" for a 0.5 in the manifest), so kubectl and an offline
        # review of the same manifest would otherwise quote it differently.
        raise QuantityError(f"{_decimal(q)} is not a whole number")
    n = int(q)
    if n < 0:
        raise QuantityError(f"{_show(value)} is negative")
    return n


def is_zero(value: object) -> bool:
    """Whether ``value`` is a valid quantity equal to zero ("0", 0, "0m", "0.0").

    A GPU count of zero asks for no GPU: Kubernetes accepts it and schedules the pod as
    one without GPUs, and charts render it to mean "GPU off". Invalid values are not
    zero; the request rules report them.
    """
    try:
        return parse(value) == 0
    except QuantityError:
        return False


def _decimal(q: Decimal) -> str:
    """``0.5`` for 500m, 0.5 and "0.5" alike: plain decimal notation, no exponent."""
    text = format(q, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _show(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:40] + "..." if len(text) > 40 else text)
