import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from arcsim.errors import UnitError
from arcsim.units import parse_duration, parse_rate, parse_size


@pytest.mark.parametrize(("text", "expected"), [
    ("100MB", 1e8), ("1MiB", 2**20), ("1e6B", 1e6), ("2.5GB", 2.5e9), ("64KiB", 65536), ("1kB", 1e3),
    ("0B", 0.0), ("3GiB", 3 * 2**30),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("100Gbps", 12.5e9), ("1Gbit", 1.25e8), ("400Gbit/s", 50e9), ("12.5GB/s", 12.5e9), ("12.5GBps", 12.5e9),
    ("100Mbit", 12.5e6),
])
def test_rates(text, expected):
    assert parse_rate(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("text", "expected"), [("5us", 5e-6), ("0.5ms", 5e-4), ("2µs", 2e-6), ("1s", 1.0),
                                                ("100ns", 1e-7)])
def test_durations(text, expected):
    assert parse_duration(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("text", ["100 MiB", "1e6", "12XB", "", "MB", "-1MB", "1.2.3MB", "inf", "nanMB"])
def test_unreadable_sizes_raise_a_unit_error(text):
    with pytest.raises(UnitError) as info:
        parse_size(text)
    assert "\n" not in str(info.value)


def test_bare_number_gets_a_hint():
    with pytest.raises(UnitError, match="1e6B"):
        parse_size("1e6")


@given(st.floats(min_value=0, max_value=1e15, allow_nan=False),
       st.sampled_from([("B", 1), ("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("KiB", 2**10), ("MiB", 2**20),
                        ("GiB", 2**30)]))
def test_size_round_trip(value, unit):
    suffix, scale = unit
    assume(value * scale == 0 or value * scale >= 1)  # below a byte is refused (test_sizes_below_a_byte_…)
    assert math.isclose(parse_size(f"{value!r}{suffix}"), value * scale, rel_tol=1e-12)


def test_sizes_below_a_byte_are_refused():
    with pytest.raises(UnitError, match="below one byte"):
        parse_size("0.5B")
    with pytest.raises(UnitError, match="below one byte"):
        parse_size("1e-4kB")
    assert parse_size("0B") == 0 and parse_size("1B") == 1


@given(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False), st.sampled_from(["bps", "bit", "bit/s"]),
       st.sampled_from([("M", 1e6), ("G", 1e9), ("T", 1e12)]))
def test_bit_rates_are_eighth_of_bytes(value, unit, prefix):
    p, scale = prefix
    assert math.isclose(parse_rate(f"{value!r}{p}{unit}"), value * scale / 8, rel_tol=1e-12)


@given(st.text(max_size=12))
def test_any_text_parses_or_raises_unit_error(text):
    for parse in (parse_size, parse_rate, parse_duration):
        try:
            value = parse(text)
        except UnitError:
            continue
        assert value >= 0 and math.isfinite(value)
