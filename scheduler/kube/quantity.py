"""Kubernetes resource quantities ("500m", "2Gi", "1e3") -> ``Decimal``, in bounded time.

Why this exists: ``kubernetes.utils.quantity.parse_quantity`` hands its text to ``Decimal``,
which stores "1e999999999" or five thousand digits as given; the first ``int()`` or
``quantize`` on such a value then materialises a number with a billion digits. One stored pod,
snapshot row or extender request could stall scheduling for minutes.
This parser reads exactly the grammar of Kubernetes' ``resource.Quantity``
(k8s.io/apimachinery/pkg/api/resource/quantity.go)::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= [+|-] (<digits> | <digits>.<digits> | <digits>. | .<digits>)
    <suffix>          ::= <binarySI> | <decimalSI> | <decimalExponent>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= (e | E) [+|-] <digits>

and does all arithmetic on Python ints of a few dozen digits, so its cost is O(length of the
input), which is itself capped.

Bounds, and what upstream does:

* At most :data:`MAX_QUANTITY_CHARS` (64) characters. The longest meaningful quantity, a
  sign, 19 integer digits (2^63-1), a point, 9 nano digits and a 2-letter suffix, is 32;
  anything longer only adds leading zeros or sub-nano digits. Upstream's ``ParseQuantity``
  sets no length limit: past 18 digits it leaves its int64 fast path for ``inf.Dec``/big.Int
  arithmetic, whose cost grows with the input.
* Exponents must fit an int32, which is where upstream stores them; its suffix parser reads
  the exponent as int64 and truncates it to int32, so "1e4294967296" would wrap to 1 there.
  Within that range nothing is ever scaled by the exponent: a nonzero mantissa with a large
  exponent is too large (below), one with a very negative exponent rounds up to 1n.
* Magnitudes above :data:`MAX_MAGNITUDE` (2^63-1 base units) raise :class:`QuantityError`.
  Upstream caps them at that value instead. A silently clamped request is wrong, so we
  reject it.
* Precision is one nano (1e-9). A nonzero value finer than that is rounded up, away from
  zero, to the next nano, as upstream does ("if you want some resources, you should get
  some"). "0.1n" is 1n, and "-0.1n" is -1n.

Where the two disagree we follow the documented grammar, not upstream's lenient scanner:
"", ".", "+" and "-" are rejected (the scanner reads the last three as 0), and so is
surrounding whitespace, which upstream's JSON decoder trims before parsing ("TODO: Remove
support for leading/trailing whitespace"). The Python client's reference parser accepts
more: ``Decimal`` syntax ("NaN", "Infinity", "1_000", " 1 ", Unicode digits such as "١"),
"K" as kilo, and an exponent combined with a suffix ("1e3k"). None of those is a Kubernetes
quantity. Within the bounds, every string both accept gives the same value.

Negative quantities parse (the grammar allows a sign); callers decide whether a negative
request makes sense.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Final

__all__ = ["MAX_MAGNITUDE", "MAX_QUANTITY_CHARS", "QuantityError", "parse_quantity"]

MAX_QUANTITY_CHARS: Final = 64
"""Longest quantity string accepted; twice the longest meaningful one (see the module doc)."""

MAX_MAGNITUDE: Final = 2**63 - 1
"""Largest magnitude, in base units (cores, bytes, devices), that a quantity may hold."""

_NANOS_PER_UNIT: Final = 10**9
_MAX_NANOS: Final = MAX_MAGNITUDE * _NANOS_PER_UNIT
_MAX_NANOS_DIGITS: Final = len(str(_MAX_NANOS))  # 28
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1

# Each suffix as (power of ten, power of two). "E" alone is exa; "E3" is an exponent.
_SUFFIXES: Final[dict[str, tuple[int, int]]] = {
    "": (0, 0),
    "n": (-9, 0), "u": (-6, 0), "m": (-3, 0),
    "k": (3, 0), "M": (6, 0), "G": (9, 0), "T": (12, 0), "P": (15, 0), "E": (18, 0),
    "Ki": (0, 10), "Mi": (0, 20), "Gi": (0, 30), "Ti": (0, 40), "Pi": (0, 50), "Ei": (0, 60),
}

# [0-9], not \d: \d also matches other scripts' digits, such as "١".
_QUANTITY_RE: Final = re.compile(
    r"(?P<sign>[+-]?)"
    r"(?:(?P<whole>[0-9]+)(?:\.(?P<frac>[0-9]*))?|\.(?P<frac_only>[0-9]+))"
    r"(?:(?P<exponent>[eE][+-]?[0-9]+)|(?P<suffix>[KMGTPE]i|[numkMGTPE])?)"
)

_GRAMMAR_HINT: Final = (
    "expected a number with an optional suffix (Ki Mi Gi Ti Pi Ei; n u m k M G T P E; "
    "or e<integer>), such as '500m', '2Gi' or '1e3'"
)


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity within bounds; the message says why."""


def parse_quantity(value: object) -> Decimal:
    """The value of a Kubernetes quantity, in base units, exact to the nano.

    ``value`` is a quantity string, an ``int`` (not ``bool``) or a finite ``float`` (a JSON
    number). A float is read as its shortest ``repr``, the text a JSON document would have
    held, which is what upstream parses for an unquoted number; ``Decimal(0.1)`` would
    instead give 0.1000000000000000055..., which rounds up to 0.100000001. The result has
    no exponent above 0 and no trailing fractional zeros: "1E" gives
    ``Decimal("1000000000000000000")``, "1500m" gives ``Decimal("1.5")``, and zero of any
    sign gives ``Decimal(0)``.

    Raises :class:`QuantityError` for anything else, including values beyond the bounds
    in the module doc. Runs in time linear in ``len(value)``, which is capped.
    """
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity string or number, got bool {value!r}")
    if isinstance(value, int):
        if abs(value) > MAX_MAGNITUDE:
            raise QuantityError(
                f"{_shown(value)} is larger in magnitude than {MAX_MAGNITUDE} (2^63-1), "
                "the most a Kubernetes quantity holds"
            )
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a finite number")
        return _parse_text(repr(value))
    if isinstance(value, str):
        return _parse_text(value)
    raise QuantityError(f"expected a quantity string or number, got {type(value).__name__}")


def _parse_text(text: str) -> Decimal:
    if len(text) > MAX_QUANTITY_CHARS:
        raise QuantityError(
            f"{_shown(text)} is {len(text)} characters long; a Kubernetes quantity here is at "
            f"most {MAX_QUANTITY_CHARS}"
        )
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity: {_GRAMMAR_HINT}")
    whole = match["whole"] or ""
    frac = match["frac"] or match["frac_only"] or ""
    if match["exponent"] is not None:
        exponent = int(match["exponent"][1:])  # at most 62 ASCII digits: cheap
        if not _INT32_MIN <= exponent <= _INT32_MAX:
            raise QuantityError(
                f"{text!r} has exponent {exponent}, outside the int32 range Kubernetes "
                "stores exponents in"
            )
        power_of_ten, power_of_two = exponent, 0
    else:
        power_of_ten, power_of_two = _SUFFIXES[match["suffix"] or ""]

    digits = (whole + frac).lstrip("0")
    if not digits:
        return Decimal(0)
    # value = int(digits) * 2**power_of_two * 10**(power_of_ten - len(frac)); in nanos:
    numerator = int(digits) << power_of_two  # < 10**64 * 2**60: about 83 digits at most
    shift = power_of_ten - len(frac) + 9  # nanos = numerator * 10**shift
    if shift >= 0:
        # numerator >= 10**(len(digits) - 1), so this many digits or more are certain.
        if len(digits) + shift > _MAX_NANOS_DIGITS:
            raise _too_large(text)
        nanos = numerator * 10**shift
    elif -shift > len(str(numerator)):
        nanos = 1  # 0 < value < 1n: rounds up to 1n; 10**-shift is never built
    else:
        nanos = -(-numerator // 10**-shift)  # round up, away from zero
    if nanos > _MAX_NANOS:
        raise _too_large(text)
    return _from_nanos(nanos, negative=match["sign"] == "-")


def _from_nanos(nanos: int, *, negative: bool) -> Decimal:
    units, fraction = divmod(nanos, _NANOS_PER_UNIT)
    sign = "-" if negative else ""
    if fraction == 0:
        return Decimal(f"{sign}{units}")
    # Decimal(str) is exact whatever the thread's decimal context; arithmetic would not be.
    return Decimal(f"{sign}{units}.{fraction:09d}".rstrip("0"))


def _too_large(text: str) -> QuantityError:
    return QuantityError(
        f"{text!r} is larger in magnitude than {MAX_MAGNITUDE} (2^63-1), the most a "
        "Kubernetes quantity holds"
    )


def _shown(value: object) -> str:
    """``repr(value)``, shortened so that a huge input cannot make a huge message."""
    if isinstance(value, int):
        # str() of a huge int is quadratic (and refused past 4300 digits): show its size.
        if value.bit_length() > 200:
            return f"an integer of {value.bit_length()} bits"
        return repr(value)
    shown = repr(value)
    return shown if len(shown) <= 40 else f"{shown[:32]}...{shown[-4:]}"
