"""Prometheus-style label matchers (``name=value``, ``!=``, ``=~``, ``!~``), shared by the SLO
queries and the remediation triggers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Matcher:
    name: str
    op: str          # = != =~ !~
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Does a label set match?  A missing label reads as ""; regular expressions match the whole value."""
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        ok = re.fullmatch(self.value, v) is not None
        return ok if self.op == "=~" else not ok

    def promql(self) -> str:
        return f'{self.name}{self.op}"{escape_value(self.value)}"'


def escape_value(s: str) -> str:
    """A label value as the inside of a double-quoted PromQL string."""
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
