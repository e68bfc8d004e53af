"""Byte, bandwidth and duration quantities as people write them ("200MiB", "40GB", "12.5GB/s", "5us").

Binary prefixes (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (KB, MB, GB, TB) powers of
1000, as on GPU spec sheets (an "A100 40GB" has 40 GiB of HBM; users may write either).
"""

from __future__ import annotations

import re

from hybridplan.errors import UsageError
from hybridplan.limits import MAX_BYTES, shown

__all__ = ["parse_bytes", "format_bytes", "parse_bandwidth", "format_bandwidth", "parse_seconds"]

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int | float, *, what: str = "memory size") -> int:
    """Parse a byte quantity.

    Args:
        text: "200MiB", "40GB", "1.5GiB", or a plain number of bytes.
        what: the name of the value, used in the error message.

    Returns:
        The number of bytes (rounded down to an integer).

    Raises:
        UsageError: if the text is not a non-negative quantity with a known unit.

    Example:
        >>> parse_bytes("200MiB")
        209715200
    """
    if isinstance(text, bool):
        raise UsageError(f"{what} must be a size such as '200MiB', got {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise UsageError(f"{what} must not be negative, got {text!r}")
        return _at_most_max(float(text), text, what)
    match = _QUANTITY.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UsageError(
            f"{what} {shown(text)} is not a size",
            fix="write a number with a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024),"
            " e.g. '200MiB' or '40GB'",
        )
    return _at_most_max(float(match.group(1)) * _UNITS[unit], text, what)


def _at_most_max(value: float, text: str | int | float, what: str) -> int:
    """``value`` bytes as an integer, refused above :data:`~hybridplan.limits.MAX_BYTES` (``1e300TB`` is no size)."""
    if not value <= MAX_BYTES:  # also inf and nan
        raise UsageError(f"{what} {shown(text)} is more than {MAX_BYTES:,} bytes (1 PiB), over 7,000 times the largest"
                         " device memory of the GPU catalogue (hybridplan/limits.py)",
                         fix="give one device's memory, e.g. '80GB'")
    return int(value)


def format_bytes(n: float | None) -> str:
    """Format a byte count with a binary unit, e.g. ``format_bytes(209715200) == '200.00 MiB'``."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{int(n)} B"


_BANDWIDTH = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]?)(bps|b/s|Bps|B/s)\s*$")
_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str | int | float, *, what: str = "bandwidth") -> float:
    """Parse a bandwidth into bytes per second.

    Lower-case ``b`` is bits ("100Gbps", "100Gb/s"), upper-case ``B`` bytes ("25GB/s", "25GBps"); a plain
    number is bytes per second. Prefixes are decimal, as network and interconnect specs are.

    Example:
        >>> parse_bandwidth("100Gbps")
        12500000000.0
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise UsageError(f"{what} must be positive, got {text!r}")
        return float(text)
    match = _BANDWIDTH.match(text) if isinstance(text, str) else None
    if match is None:
        raise UsageError(
            f"{what} {text!r} is not a bandwidth",
            fix="write e.g. '100Gbps' (bits per second), '25GB/s' (bytes per second) or a number of bytes per second",
        )
    value = float(match.group(1)) * _DECIMAL[match.group(2).lower()]
    if match.group(3).startswith("b"):
        value /= 8
    if not value < float("inf"):
        raise UsageError(f"{what} {shown(text)} is not a finite bandwidth", fix="e.g. '100Gbps' or '25GB/s'")
    if value <= 0:
        raise UsageError(f"{what} must be positive, got {text!r}")
    return value


def format_bandwidth(bytes_per_second: float) -> str:
    """Format bytes per second, e.g. ``format_bandwidth(12.5e9) == '12.50 GB/s'``."""
    for unit, size in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_second >= size:
            return f"{bytes_per_second / size:.2f} {unit}"
    return f"{bytes_per_second:.0f} B/s"


_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "\u00b5s": 1e6, "ns": 1e9}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|ms|us|\u00b5s|ns)\s*$")


def parse_seconds(text: str | int | float, *, what: str = "duration") -> float:
    """Parse a duration (a link's latency) into seconds: "5us", "0.3ms", "2e-6s", or a plain number of seconds.

    Example:
        >>> parse_seconds("5us")
        5e-06
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _DURATION.match(text) if isinstance(text, str) else None
        if match is None:
            raise UsageError(f"{what} {text!r} is not a duration",
                             fix="write e.g. '5us', '0.3ms', '1e-6s' or a number of seconds")
        value = float(match.group(1)) / _PER_SECOND[match.group(2)]
    if not 0 <= value < float("inf"):
        raise UsageError(f"{what} must be a finite number of seconds >= 0, got {text!r}", fix="e.g. '5us'")
    return value
