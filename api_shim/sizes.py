"""Human-readable data sizes, parsed the way the reference service does (humanfriendly rules).

Units starting with k/m/g/t/p/e/z/y are decimal (`8GB` = 8e9, and even `4Gi` = 4e9); only the
explicit binary spellings (`KiB`, `mebibyte`, ...) are powers of 1024; a bare number or a unit
starting with `b` means bytes. Integers are byte counts already. As there, a whole number is exact
and a decimal one a float; the result is not bounded here (callers check it fits).
"""

from __future__ import annotations

import math
import re

_PREFIXES = "kmgtpezy"
_BINARY_NAMES = (
    "kibibyte",
    "mebibyte",
    "gibibyte",
    "tebibyte",
    "pebibyte",
    "exbibyte",
    "zebibyte",
    "yobibyte",
)
_TOKEN = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)\s*$")


class InvalidSize(ValueError):
    pass


class SizeTooLarge(InvalidSize):
    """A well-formed size too large to compute (beyond any int64 anyway)."""


def parse_size(value: str | int) -> int:
    if isinstance(value, bool):
        raise InvalidSize(value)
    if isinstance(value, int):
        if value < 0:
            raise InvalidSize(value)
        return value
    match = _TOKEN.match(value.lower())
    if not match:
        raise InvalidSize(value)
    token = match.group(1)
    try:
        number: int | float = float(token) if "." in token else int(token)
    except ValueError:  # more digits than Python converts
        raise SizeTooLarge(value) from None
    unit = match.group(2)
    if unit.endswith("s"):
        unit = unit[:-1]
    if not unit or unit.startswith("b"):
        return _whole(number, value)
    power = _PREFIXES.find(unit[0]) + 1
    if power == 0:
        raise InvalidSize(value)
    if unit == f"{unit[0]}ib" or unit == _BINARY_NAMES[power - 1]:
        return _whole(number * 1024**power, value)
    return _whole(number * 1000**power, value)


def _whole(number: int | float, value: str) -> int:
    if isinstance(number, float) and not math.isfinite(number):
        raise SizeTooLarge(value)  # a decimal of hundreds of digits: beyond any size
    return int(number)
