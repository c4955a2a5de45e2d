"""The error a configuration file (or value) raises, apart from the pydantic models that find it:
code that only catches it (the agent, through the thresholds) does not load pydantic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from triscope.core import yamlsafe


@dataclass(frozen=True)
class Problem:
    """One problem: where (``file``, ``line``, the path in the document) and what."""

    file: str
    line: int | None
    path: tuple[str | int, ...]
    field: str
    what: str

    @property
    def reason(self) -> str:
        return f"{self.field}: {self.what}" if self.field else self.what

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}" if self.line else f"{self.file}: {self.reason}"


class ConfigFileError(yamlsafe.YAMLFileError):
    """A configuration file (or value) that cannot be used: ``FILE:LINE: field: what is wrong``
    (``FILE: ...`` where there is no line).  ``reason`` is everything after ``FILE:LINE: ``,
    ``field`` the field alone; ``problems`` every problem found, the reported one first."""

    def __init__(self, file: str, line: int | None, reason: str, *, field: str = "",
                 problems: Sequence[Problem] = ()) -> None:
        super().__init__(file, line, reason)
        self.field = field
        self.problems: tuple[Problem, ...] = tuple(problems)
