"""Resource quantities ("500m", "2", "32Gi") as exact numbers, for the scheduler's sums."""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIXES = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    **{suffix: Fraction(1000**power) for power, suffix in enumerate("kMGTPE", start=1)},
    **{f"{suffix}i": Fraction(1024**power) for power, suffix in enumerate("KMGTPE", start=1)},
}
_QUANTITY = re.compile(r"([+-]?\d+(?:\.\d+)?)(?:[eE]([+-]?\d+))?([a-zA-Z]*)")


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a Kubernetes quantity; ValueError for malformed text."""
    if isinstance(value, int | float):
        return Fraction(value)
    match = _QUANTITY.fullmatch(value.strip())
    if match is None or match.group(3) not in _SUFFIXES:
        raise ValueError(f"not a quantity: {value!r}")
    number, exponent, suffix = match.groups()
    scaled = Fraction(number) * _SUFFIXES[suffix]
    return scaled * Fraction(10) ** int(exponent) if exponent else scaled


def format_count(value: Fraction | int) -> str:
    """An integral count as a quantity string (device counts, pods)."""
    return str(int(value))
