"""One parser for every time argument of the command line (``--since``, ``--until``, ``--start``,
``--end``, ``--at``...).

Accepted forms (``HELP`` says the same in one line for ``--help``):

* ``now``;
* a time ago: ``2h`` or ``-2h`` (both two hours ago), in the duration grammar of every
  configuration file (``triscope.core.durations``: units ``ms``, ``s``, ``m``, ``h``, ``d``, ``w``,
  decimals and compounds allowed: ``1.5h``, ``1h30m``) but always with a unit;
* ISO 8601: ``2026-11-29T17:00:00Z``, ``2026-11-29T18:00:00+01:00``, ``2026-11-29 17:00``,
  ``2026-11-29``; without a zone the time is **UTC**;
* a plain number: epoch seconds when it is at least 1,000,000,000 (2001-09-09), otherwise a count
  of seconds ago (``--since 600`` is ten minutes ago, as it always was for ``triscope query``;
  no stored data is older than 2001, so the two readings cannot be confused).

Anything else (``nan``, ``inf``, ``yesterday``, a time before 1970 or after 9999) is refused with
a ``TimeParseError`` that says what was given and which forms work.

``allow_relative_times(parser)`` lets argparse take ``-2h`` as the value of an option written
without ``=`` (``--since -2h``; otherwise argparse reads ``-2h`` as an unknown option).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from datetime import UTC, datetime

from triscope.core.durations import unit_seconds

EPOCH_MIN = 1_000_000_000.0
"""Plain numbers at or above this are epoch seconds; below, seconds ago."""
MAX_TS = 253402300799.0   # 9999-12-31T23:59:59Z
HELP = ("ISO 8601 (2026-11-29T17:00:00Z; no zone = UTC), a time ago (2h or -2h; s, m, h, d, w), "
        "epoch seconds, or now")

_NUMBER = re.compile(r"^(-?)(\d+(?:\.\d+)?)$")
# what argparse must take for an option's value, not for an option: -2h, -1h30m, -90, -.5 (and -inf,
# -nan: refused by parse_time with its own message, not argparse's usage text)
_NEGATIVE_VALUE = re.compile(r"^-\.?\d|^-(?:inf|infinity|nan)$", re.IGNORECASE)


class TimeParseError(ValueError):
    """A time argument that is not one of the accepted forms (the message says which are)."""


def _ago(value: str) -> float | None:
    """Seconds of a time ago with a unit (``2h``, ``-2h``, ``1h30m``), None when not that form."""
    v = value.strip()
    v = v[1:] if v.startswith("-") else v
    return None if not v[:1].isdigit() else unit_seconds(v)


def parse_duration(value: str) -> float:
    """``2h``, ``-2h``, ``1h30m``, ``90s`` as seconds (the sign is ignored: a duration ago)."""
    seconds = _ago(value)
    if seconds is None:
        raise TimeParseError(f"{value!r} is not a duration (e.g. 90s, 30m, 2h, 1h30m, 7d, 1w)")
    if not math.isfinite(seconds):
        raise TimeParseError(f"{value!r} is too long a duration")
    return seconds


def parse_time(value: str, now: float | None = None) -> float:
    """Epoch seconds of a time argument (see the module docstring for the forms)."""
    if not isinstance(value, str):
        raise TimeParseError(f"{value!r} is not a time: use {HELP}")
    now = time.time() if now is None else now
    v = value.strip()
    if not v:
        raise TimeParseError(f"an empty time: use {HELP}")
    if v.lower() == "now":
        return now
    if _ago(v) is not None:
        return _check(value, now - parse_duration(v))
    m = _NUMBER.match(v)
    if m:
        x = float(m.group(2))
        if m.group(1) or x < EPOCH_MIN:   # -600 and 600: ten minutes ago
            return _check(value, now - x)
        return _check(value, x)
    low = v.lower().lstrip("+-")
    if low in ("nan", "inf", "infinity"):
        raise TimeParseError(f"{value!r} is not a time (not a finite number): use {HELP}")
    try:
        dt = datetime.fromisoformat(v[:-1] + "+00:00" if v[-1:] in ("Z", "z") else v)
    except ValueError:
        raise TimeParseError(f"cannot read time {value!r}: use {HELP}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    try:
        return _check(value, dt.timestamp())
    except (OverflowError, ValueError, OSError):
        raise TimeParseError(f"{value!r} is out of range (1970 to 9999)") from None


def _check(value: str, ts: float) -> float:
    if not math.isfinite(ts) or ts < 0 or ts > MAX_TS:
        raise TimeParseError(f"{value!r} is out of range: times run from 1970 to 9999")
    return ts


def allow_relative_times(parser: argparse.ArgumentParser) -> None:
    """Let ``--since -2h`` through: argparse would otherwise take ``-2h`` for an unknown option.

    argparse decides whether a word that starts with ``-`` is an option or a value with the
    parser's negative-number pattern; this widens it to relative times (``-2h``, ``-1h30m``)."""
    parser._negative_number_matcher = _NEGATIVE_VALUE


def parse_rfc3339(text: str) -> float:
    """Epoch seconds of an RFC 3339 time (``2026-11-29T18:00:00.123456789Z``, ``...+01:00``): what
    Kubernetes and Alertmanager write.  The zone is required; digits past microseconds are dropped
    (Python 3.11's ``datetime.fromisoformat`` reads ``Z`` and any number of fraction digits).
    Raises ``TimeParseError`` for anything else."""
    try:
        dt = datetime.fromisoformat(text.strip())
    except (ValueError, TypeError, AttributeError):
        raise TimeParseError(f"{text!r} is not an RFC 3339 time") from None
    if dt.tzinfo is None:
        raise TimeParseError(f"{text!r} has no time zone (RFC 3339 needs Z or +HH:MM)")
    return dt.timestamp()


def format_rfc3339(ts: float, *, micro: bool = False) -> str:
    """``ts`` as RFC 3339 in UTC: ``2026-11-29T18:00:00Z`` (whole seconds), or with ``micro``
    ``2026-11-29T18:00:00.123456Z`` (a Kubernetes MicroTime, a restart stamp)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")
