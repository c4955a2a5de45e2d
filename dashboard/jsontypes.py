"""JSON as the dashboard reads it: the store's event details, the root-cause contract
(``triscope rca --json``, docs/workloads.md section 3), the wait-for chain evidence.

The analysis and the store hand these over as ``dict[str, Any]``; the dashboard reads them through
``JSON`` (what JSON can hold, read-only) so that every value it takes out is narrowed by a check
(``isinstance``) before it is used, and a missing check is a type error, not a page that breaks on
an odd value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeAlias

JSONScalar: TypeAlias = str | int | float | bool | None
JSON: TypeAlias = JSONScalar | Sequence["JSON"] | Mapping[str, "JSON"]
JSONObject: TypeAlias = Mapping[str, JSON]


class HasDetails(Protocol):
    """A stored event (``triscope.store.reader.EventRow``) as the dashboard reads its details."""

    @property
    def details(self) -> JSONObject: ...


def text(v: JSON, default: str = "") -> str:
    """A JSON value shown as text: strings as they are, None as ``default``, others as ``str`` writes them."""
    if v is None:
        return default
    return v if isinstance(v, str) else str(v)


def number(v: JSON) -> float | None:
    """A JSON number (or numeric text) as a float; None for anything else."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def obj(v: JSON) -> JSONObject:
    """A JSON object, or {} for anything else."""
    return v if isinstance(v, Mapping) else {}


def items(v: JSON) -> list[JSON]:
    """A JSON array as a list ([] for anything else, strings included)."""
    return list(v) if isinstance(v, Sequence) and not isinstance(v, str) else []
