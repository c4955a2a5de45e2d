"""The one duration grammar of triscope: policies, SLO files, mismatch thresholds and the command
line's relative times (``--since -2h``, through :mod:`triscope.core.timeparse`) all read durations here.

Accepted forms:

* a number with a unit: ``500ms``, ``30s``, ``5m``, ``1h``, ``7d``, ``1w`` (``ms``, ``s``, ``m``,
  ``h``, ``d``, ``w``), decimals allowed (``1.5h``), spaces around the unit allowed (``5 m``);
* compounds of those: ``1h30m``, ``1d12h``, ``2m30s``, ``1s500ms`` (parts added up, any order);
* a bare number: seconds, written as text (``"90"``, ``"0.5"``) or as a YAML/JSON number
  (``90``, ``0.5``).

Never negative, never NaN or infinite.  ``parse_duration`` gives seconds as a float or raises
:class:`DurationError` (a ``ValueError``) that says what was given and which forms work;
``Duration`` is the same as a pydantic v2 field type (``timeout: Duration = 30.0``).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
"""Seconds per unit."""
UNIT_NAMES = "ms, s, m, h, d, w"
EXAMPLES = "e.g. 30s, 5m, 1h30m, 7d, 1w, 500ms, or a number of seconds"

_NUMBER = r"\d+(?:\.\d+)?"
_UNIT = r"ms|[smhdw]"          # ``ms`` before ``m``
_COMPOUND = re.compile(rf"(?:\s*{_NUMBER}\s*(?:{_UNIT}))+\s*")
_PART = re.compile(rf"({_NUMBER})\s*({_UNIT})")
_BARE = re.compile(rf"\s*({_NUMBER})\s*")
_MAX_TEXT = 200   # longer text is no duration anyone wrote (and keeps the error message short)


class DurationError(ValueError):
    """A value that is not a duration: the message says what was given and which forms work."""


def unit_seconds(text: str) -> float | None:
    """Seconds of a duration written with units (``90s``, ``1h30m``, ``1.5d``), or None when
    ``text`` is not of that form (a bare number is not: callers decide what one means).  May be
    ``inf`` for absurdly long text such as ``999...9w``."""
    if len(text) > _MAX_TEXT or not _COMPOUND.fullmatch(text):
        return None
    return sum(float(n) * UNITS[u] for n, u in _PART.findall(text))


def parse_duration(value: Any) -> float:
    """Seconds of a duration: text with units (``5m``, ``1h30m``), a bare number of seconds (text
    or number).  Raises :class:`DurationError`."""
    if isinstance(value, bool):
        raise DurationError(f"must be a duration ({EXAMPLES}), not {value!r}")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise DurationError(f"must be a finite duration, not {_show(value)}") from None
    elif isinstance(value, str):
        s = unit_seconds(value)
        if s is None:
            m = _BARE.fullmatch(value) if len(value) <= _MAX_TEXT else None
            if m is None:
                raise DurationError(f"{_show(value)} is not a duration ({EXAMPLES})")
            s = float(m.group(1))
        seconds = s
    else:
        raise DurationError(f"must be a duration ({EXAMPLES}), not {_show(value)}")
    if math.isnan(seconds) or math.isinf(seconds):
        raise DurationError(f"must be a finite duration, not {_show(value)}")
    if seconds < 0:
        raise DurationError(f"must not be negative, not {_show(value)}")
    return seconds


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""A pydantic field type: any form :func:`parse_duration` accepts, held as seconds (float)."""

__all__ = ["EXAMPLES", "UNITS", "UNIT_NAMES", "Duration", "DurationError", "parse_duration", "unit_seconds"]
