"""Kubernetes resource quantities ('500m', '16Gi', '1e3', '2.5k') as plain numbers, and back to short text.

The grammar is the API's (k8s.io/apimachinery/pkg/api/resource, `Quantity`): a signed decimal number then
one suffix - binary (Ki Mi Gi Ti Pi Ei), decimal (n u m k M G T P E) or a decimal exponent (e3, E-2). A
quantity comes out in base units: cores for cpu, bytes for memory and storage, a count for the rest.

Bounded on purpose: the number is read as a float, never an int, so '1e400' is infinity (too big for any
node: it cannot fit) and '1e-320' a tiny number, never an OverflowError. Text that is not a quantity, or a
negative one, is 0 (the API server rejects both; a malformed document asks for nothing).
"""

from __future__ import annotations

import math
import re
from typing import Any

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}  # powers of 10
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d{1,6})?$")
_LONGEST = 64  # real quantities are short; anything longer is not one
BYTE_RESOURCES = ("memory", "ephemeral-storage", "storage")  # shown in binary units


def parse_quantity(text: Any) -> float:
    """A quantity in base units; 0.0 for what is not a non-negative quantity, inf for one too big for a
    float."""
    s = str(text).strip() if isinstance(text, (str, int, float)) and not isinstance(text, bool) else ""
    found = _QUANTITY.match(s) if len(s) <= _LONGEST else None
    if found is None:
        return 0.0
    number, suffix = float(found.group(1)), found.group(2) or ""
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif suffix in _DECIMAL:  # read as one decimal number: '100u' is 1e-4, not 100 * 1e-6
        value = float(f"{found.group(1)}e{_DECIMAL[suffix]}")
    else:  # a decimal exponent: float() reads '1e400' as inf and '1e-400' as 0, it never raises
        value = float(f"{found.group(1)}{suffix}")
    return value if value > 0 and not math.isnan(value) else 0.0


def is_quantity(text: Any) -> bool:
    """Whether the text is a non-negative quantity as the API writes one (what a policy may give)."""
    s = str(text).strip()
    return len(s) <= _LONGEST and _QUANTITY.match(s) is not None and not s.startswith("-")


def is_bytes(resource: str) -> bool:
    return resource in BYTE_RESOURCES or resource.startswith("hugepages-")


def show(resource: str, value: float, down: bool = False) -> str:
    """A quantity as a person writes it in a pod: cpu '4' or '0.5', memory '16Gi' or '14.5Gi', a count
    '2'; 'inf' for one too big to be real. Three significant digits; `down` rounds toward zero (what a
    node offers is never overstated: 14.55Gi is '14.5Gi')."""
    if not math.isfinite(value):
        return "inf"
    if is_bytes(resource):
        for unit in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            if value >= _BINARY[unit]:
                return f"{_round(value / _BINARY[unit], down)}{unit}"
    return _round(value, down)


def _round(value: float, down: bool) -> str:
    """Three significant digits, no float noise: 3.92, 14.5, 0.001, 200, 1e+20."""
    if value <= 0:
        return "0"
    if not 1e-3 <= value < 1e6:  # tiny or huge: exponent form (10.0**digits must stay a float)
        return f"{value:.3g}"
    digits = 3 - 1 - math.floor(math.log10(value))
    scale = 10.0**digits
    rounded = (math.floor(value * scale + 1e-9) if down else round(value * scale)) / scale
    return f"{rounded:.{max(0, digits)}f}".rstrip("0").rstrip(".") if digits > 0 else f"{rounded:.0f}"
