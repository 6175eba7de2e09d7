"""Kubernetes quantities (``8``, ``500m``, ``32Gi``, ``1.5k``) as numbers, as the API server
reads them: a decimal number, then a binary (``Ki``…``Ei``) or decimal (``n``…``E``) suffix or
an exponent."""

from __future__ import annotations

import re
from fractions import Fraction

_FORM = re.compile(
    r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?"
)
_BINARY = {f"{p}i": 1024**n for n, p in enumerate("KMGTPE", 1)}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000)}
_DECIMAL |= {p: Fraction(1000**n) for n, p in enumerate("kMGTPE", 1)}


def parse(text: str) -> Fraction | None:
    """The value of the quantity `text`; None when it is not one."""
    found = _FORM.fullmatch(text.strip()) if len(text) <= 64 else None
    if found is None:
        return None
    number, exponent, suffix = found.groups()
    value = Fraction(number)
    if exponent:
        power = int(exponent[1:])
        if abs(power) > 30:
            return None
        value *= Fraction(10) ** power
    if suffix:
        value *= _BINARY.get(suffix) or _DECIMAL[suffix]
    return value
