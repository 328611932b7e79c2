"""Human units at the edges, SI floats inside: bytes, bytes/s, seconds.

SI prefixes are decimal (k = 10³, M = 10⁶, G = 10⁹, T = 10¹²); binary prefixes are binary
(Ki = 2¹⁰, Mi = 2²⁰, Gi = 2³⁰, Ti = 2⁴⁰). Rates in bits ("100Gbps", "100Gbit", "100Gbit/s") or bytes
("12.5GB/s", "12.5GBps"). A unit is always required and no space may stand inside a quantity.
"""

from __future__ import annotations

import math
import re

from arcsim.errors import UnitError

_PREFIX = {
    "": 1.0,
    "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
}
_NUMBER = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_PREFIXES = r"(?P<prefix>Ki|Mi|Gi|Ti|k|K|M|G|T)?"
_SIZE_RE = re.compile(rf"^{_NUMBER}{_PREFIXES}B$")
_RATE_RE = re.compile(rf"^{_NUMBER}{_PREFIXES}(?P<unit>bps|bit/s|bit|B/s|Bps)$")
_TIME_RE = re.compile(rf"^{_NUMBER}(?P<unit>ns|us|µs|ms|s)$")
_TIME_DIVISOR = {"ns": 1e9, "us": 1e6, "µs": 1e6, "ms": 1e3, "s": 1.0}  # divide: 5 / 1e6 is exactly 5e-6


def _check_text(text: object, kind: str, example: str) -> str:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise UnitError(f"{kind} {text!r} is not a quantity; write it like {example!r}")
    s = str(text)
    if s != s.strip() or " " in s or "\t" in s:
        raise UnitError(f"{kind} {s!r} contains a space; write it without one, like {example!r}")
    return s


def _quantity(text: object, kind: str, example: str, pattern: re.Pattern[str], how: str,
              bare: str = "") -> tuple[str, re.Match[str]]:
    """``text`` checked (:func:`_check_text`) and matched by ``pattern``, else one UnitError: "cannot read", then
    ``bare`` where it is a bare number, then "use" ``how``."""
    s = _check_text(text, kind, example)
    m = pattern.match(s)
    if not m:
        raise UnitError(f"cannot read {kind} {s!r}{bare if _is_number(s) else ''}; use {how}")
    return s, m


def _finite_nonnegative(value: float, kind: str, text: str) -> float:
    if not math.isfinite(value):
        raise UnitError(f"{kind} {text!r} is not finite")
    return value


def parse_size(text: object) -> float:
    """'100MB' → 1e8 bytes; '1MiB' → 1048576; '1e6B' → 1e6."""
    s, m = _quantity(text, "size", "100MB", _SIZE_RE, "a number and a unit such as B, kB, MB, GB, KiB, MiB, GiB",
                     " (a bare number needs the unit B, e.g. '1e6B')")
    size = _finite_nonnegative(float(m["num"]) * _PREFIX[m["prefix"] or ""], "size", s)
    if 0 < size < 1:
        raise UnitError(f"size {s!r} is below one byte; give at least 1B (or 0)")
    return size


def parse_rate(text: object) -> float:
    """'100Gbps' → 1.25e10 bytes/s; '12.5GB/s' → 1.25e10 bytes/s."""
    s, m = _quantity(text, "bandwidth", "100Gbps", _RATE_RE, "bits ('100Gbps', '1Gbit') or bytes ('12.5GB/s', "
                     "'12.5GBps')")
    value = float(m["num"]) * _PREFIX[m["prefix"] or ""]
    if m["unit"] in ("bps", "bit/s", "bit"):
        value /= 8.0
    return _finite_nonnegative(value, "bandwidth", s)


def parse_duration(text: object) -> float:
    """'5us' → 5e-6 s; '0.5ms' → 5e-4 s."""
    s, m = _quantity(text, "duration", "5us", _TIME_RE, "a number and one of ns, us, ms, s (e.g. '5us')")
    return _finite_nonnegative(float(m["num"]) / _TIME_DIVISOR[m["unit"]], "duration", s)


_COUNT_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
MAX_PARAMS = 1e13


def parse_params(text: object) -> int:
    """A parameter count: ``123M``, ``1.5B``, ``7e9`` (k, M, B or G, T are powers of 1000), 1 … 10T."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", str(text).lower())
    if not m:
        raise UnitError(f"--params {text!r} is not a parameter count; write e.g. 125M, 1.5B or 7e9")
    value = float(m[1]) * _COUNT_SUFFIX[m[2]]
    if not 1 <= value <= MAX_PARAMS:
        raise UnitError(f"--params {text!r} must be between 1 and 10T parameters")
    if value != round(value):
        raise UnitError(f"--params {text!r} is {value:g}, not a whole number of parameters")
    return round(value)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def format_size(nbytes: float) -> str:
    """Decimal SI rendering: 1e8 → '100 MB'."""
    return _format(nbytes, "B")


def format_rate(bytes_per_s: float) -> str:
    """Bytes/s → 'GB/s' style."""
    return _format(bytes_per_s, "B/s")


def format_bits(bytes_per_s: float) -> str:
    """Bytes/s → 'Gbit/s' style."""
    return _format(bytes_per_s * 8.0, "bit/s")


def format_duration(seconds: float) -> str:
    """Seconds → the largest unit that keeps the number ≥ 1."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def _format(value: float, unit: str) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"
