"""The bounded Kubernetes quantity parser, against the Python client's reference parser."""

from __future__ import annotations

import re
import time
from decimal import ROUND_UP, Decimal, localcontext

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as reference_parse_quantity

from scheduler.kube.quantity import (
    MAX_MAGNITUDE,
    MAX_QUANTITY_CHARS,
    QuantityError,
    parse_quantity,
)

NANO = Decimal("1e-9")
INT32 = (-(2**31), 2**31 - 1)
SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
HOSTILE = [
    "1e999999999", "-1e999999999", "1e-999999999", "9" * 5000, "1" + "0" * 5000 + "Ki",
    "0." + "0" * 5000 + "1", "1e" + "9" * 5000, ".", "+", "-", "+.", "", "1.5.5", "1Ki5",
    "1e", "1E+", "1e3k", "1e3.5", "1K", "1ki", "1mi", "1i", "Ki", "e3", "1 ", " 1", "\t1\n",
    "1\n", "1_000", "١", "١٢٣m", "NaN", "nan", "-NaN", "sNaN", "inf", "-Infinity", "0x10",
    "1,5", "--1", "+-1", "1e+-3", "1e4294967296", "1e-2147483649",
]


def short_id(value: object) -> str:
    return repr(value)[:24]


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=200, database=None)


def expected(text: str, exponent: int = 0) -> Decimal | None:
    """What parse_quantity must return for a string the reference accepts, from the reference's
    exact value (None: must raise QuantityError). ``exponent`` is the string's e-exponent."""
    with localcontext(prec=200):  # the reference multiplies in the thread's context
        try:
            ref = Decimal(reference_parse_quantity(text))  # type: ignore[no-untyped-call]
        except ValueError:
            return None
        if len(text) > MAX_QUANTITY_CHARS or not INT32[0] <= exponent <= INT32[1]:
            return None
        if ref.is_zero():
            return Decimal(0)
        if ref.copy_abs() > MAX_MAGNITUDE:  # copy_abs: no context, so no Overflow
            return None
        if ref.adjusted() < -9:  # below one nano: Kubernetes rounds up to 1n, away from zero
            return NANO.copy_sign(ref)
        return ref.quantize(NANO, rounding=ROUND_UP)


@st.composite
def grammar_quantities(draw: st.DrawFn) -> tuple[str, int]:
    """A string of the Kubernetes quantity grammar, and its e-exponent (0 if none)."""
    digits = st.text("0123456789", min_size=1, max_size=30)
    sign = draw(st.sampled_from(["", "+", "-"]))
    number = draw(st.one_of(
        digits,
        st.builds("{}.".format, digits),
        st.builds("{}.{}".format, digits, digits),
        st.builds(".{}".format, digits),
    ))
    exponent = 0
    if draw(st.booleans()):
        suffix = draw(st.sampled_from(SUFFIXES))
    else:
        exponent = draw(st.one_of(st.integers(-40, 40), st.integers(-(2**40), 2**40)))
        exponent_sign = "-" if exponent < 0 else draw(st.sampled_from(["", "+"]))
        zeros = "0" * draw(st.integers(0, 3))
        suffix = f"{draw(st.sampled_from('eE'))}{exponent_sign}{zeros}{abs(exponent)}"
    return f"{sign}{number}{suffix}", exponent


beyond_grammar = st.one_of(
    st.text(max_size=80),
    st.text(alphabet="0123456789.+-eEKMGTPinumk ١٢\t_x", max_size=80),
    st.sampled_from(HOSTILE),
    st.builds("1e{}".format, st.integers(-(10**30), 10**30)),
    st.builds("{}{}".format, st.text("0123456789", min_size=60, max_size=6000),
              st.sampled_from(SUFFIXES)),
    # A grammar string with one character inserted somewhere.
    st.tuples(grammar_quantities(), st.integers(0, 70), st.characters()).map(
        lambda t: t[0][0][: t[1]] + t[2] + t[0][0][t[1]:]),
)


@pytest.mark.parametrize(("text", "value"), ids=short_id, argvalues=[
    ("100m", Decimal("0.1")),
    ("2Gi", Decimal(2147483648)),
    ("1.5", Decimal("1.5")),
    ("1e3", Decimal(1000)),
    ("500Mi", Decimal(524288000)),
    ("1k", Decimal(1000)),
    ("0", Decimal(0)),
    ("-0", Decimal(0)),
    ("95500m", Decimal("95.5")),
    ("384Gi", Decimal(412316860416)),
    ("1E", Decimal(10**18)),
    ("1E3", Decimal(1000)),
    ("1e-3", Decimal("0.001")),
    ("1e+03", Decimal(1000)),
    (".5", Decimal("0.5")),
    ("5.", Decimal(5)),
    ("1.G", Decimal(10**9)),
    ("+2", Decimal(2)),
    ("-250m", Decimal("-0.25")),
    ("1n", NANO),
    ("1.5u", Decimal("0.0000015")),
    ("0.1n", NANO),
    ("-0.1n", -NANO),
    ("1.0000000001", Decimal("1.000000001")),
    ("1e-999999999", NANO),
    ("0e999999999", Decimal(0)),
    ("1Ei", Decimal(2**60)),
    ("7.999999999999999999Ei", Decimal("9223372036854775806.847078496")),
    ("9223372036854775807", Decimal(MAX_MAGNITUDE)),
    ("-9223372036854775807", Decimal(-MAX_MAGNITUDE)),
    ("9223372036854775806.9999999991", Decimal(MAX_MAGNITUDE)),
    ("0" * (MAX_QUANTITY_CHARS - 1) + "1", Decimal(1)),
    (4, Decimal(4)),
    (-3, Decimal(-3)),
    (MAX_MAGNITUDE, Decimal(MAX_MAGNITUDE)),
    (0.1, Decimal("0.1")),
    (1.5e-10, NANO),
    (2.5, Decimal("2.5")),
    (1e16, Decimal(10**16)),
    (-0.0, Decimal(0)),
])
def test_typical_values(text: object, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(("value", "message"), ids=short_id, argvalues=[
    ("9223372036854775808", "larger in magnitude than 9223372036854775807"),
    ("-9223372036854775808", "larger in magnitude"),
    ("9223372036854775807.0000000001", "larger in magnitude"),
    ("8Ei", "larger in magnitude"),
    ("1e999999999", "larger in magnitude"),
    (2**63, "larger in magnitude"),
    pytest.param(10**5000, "an integer of 16610 bits is larger in magnitude", id="10**5000"),
    (1e19, "larger in magnitude"),
    ("1e2147483648", "exponent 2147483648, outside the int32 range"),
    ("1e-2147483649", "outside the int32 range"),
    ("0" * MAX_QUANTITY_CHARS + "1", "65 characters long; a Kubernetes quantity here is at most"),
    ("9" * 5000, "5000 characters long"),
    ("1.5.5", "'1.5.5' is not a Kubernetes quantity: expected a number with an optional suffix"),
    ("", "'' is not a Kubernetes quantity"),
    (float("nan"), "nan is not a finite number"),
    (float("-inf"), "-inf is not a finite number"),
    (True, "got bool True"),
    (None, "got NoneType"),
    (Decimal(1), "got Decimal"),
    (b"1", "got bytes"),
])
def test_errors_say_what_is_wrong(value: object, message: str) -> None:
    with pytest.raises(QuantityError, match=re.escape(message)):
        parse_quantity(value)


def test_is_a_value_error_with_a_bounded_message() -> None:
    with pytest.raises(ValueError, match="characters long") as info:
        parse_quantity("1" + "0" * 5000 + "Ki")
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("text", HOSTILE, ids=short_id)
def test_hostile_strings_are_refused_fast(text: str) -> None:
    start = time.perf_counter()
    try:
        value = parse_quantity(text)
    except QuantityError:
        pass
    else:
        assert value == expected(text)  # the few in range, such as "1e-999999999"
    assert time.perf_counter() - start < 0.05


def test_result_is_exact_whatever_the_decimal_context() -> None:
    with localcontext(prec=3):
        assert parse_quantity("123456789012345678.123456789") == Decimal(
            "123456789012345678.123456789")
        assert parse_quantity("7Ei") == Decimal(7 * 2**60)


def test_results_have_no_positive_exponent_or_trailing_zeros() -> None:
    assert str(parse_quantity("1E")) == "1000000000000000000"
    assert str(parse_quantity("1500m")) == "1.5"
    assert str(parse_quantity("2.000")) == "2"


@fuzz(600)
@given(grammar_quantities())
@example(("1e999999999", 999999999))
@example(("1" + "0" * 5000 + "Ki", 0))
@example(("9" * 5000, 0))
@example(("-.000000000000000000001e-5", -5))
def test_grammar_matches_the_reference_within_bounds(case: tuple[str, int]) -> None:
    text, exponent = case
    want = expected(text, exponent)
    if want is None:
        with pytest.raises(QuantityError):
            parse_quantity(text)
    else:
        assert parse_quantity(text) == want


@fuzz(600)
@given(beyond_grammar)
@example("1e999999999")
@example("9" * 5000)
@example("1" + "0" * 5000 + "Ki")
@example(".")
@example("+")
@example("1.5.5")
@example("1Ki5")
@example("١")
@example(" 1 ")
@example("NaN")
@example("inf")
@example("")
def test_anything_else_is_the_reference_or_refused(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert value == expected(text)


@fuzz(300)
@given(st.one_of(st.floats(), st.integers(), st.integers(-(2**70), 2**70)))
def test_json_numbers(number: float | int) -> None:
    if isinstance(number, float):
        want = expected(repr(number)) if number == number and abs(number) != float("inf") else None
    else:
        want = Decimal(number) if abs(number) <= MAX_MAGNITUDE else None
    if want is None:
        with pytest.raises(QuantityError):
            parse_quantity(number)
    else:
        assert parse_quantity(number) == want
