"""Which accelerator, which workload, which state: the one vocabulary every part speaks.

* An **accelerator** is named by its labels: ``gpu`` (NVML index) for a GPU, ``npu`` and ``chip``
  for an Ascend NPU (``ACCELERATOR_LABELS``).  As one string (a dictionary key, a track, a
  verdict's ``accelerator``) it is ``accelerator_name``: ``gpu=0``, ``chip=0,npu=1`` (label names
  sorted), read back with ``accelerator_labels``.  As a value it is an ``AcceleratorId`` (kind,
  index, chip), made from labels (``AcceleratorId.of``), that string (``parse``) or a page's URL
  parameters (``from_query``), sorted GPUs first by index.
* A **workload** is ``(namespace, pod, container, workload)`` (``WORKLOAD_LABELS``,
  ``WorkloadKey``): empty strings where unknown, never missing; off Kubernetes ``workload`` holds
  ``unit:<name>.service`` or ``cmd:<comm>``.  ``NO_WORKLOAD`` is all four empty.
* A **state** is a ``State``, each with its facts beside it (``StateFacts``: an I/O state or not,
  a quiet one or not, its order worst first, its colour on the pages); ``STATES``, ``IO_STATES``
  (they page), ``QUIET_STATES`` (they never do) and ``WORST_FIRST`` are read off them.  ``State``
  is a ``str`` enum: a member equals its text (``State.IDLE == "idle"``), so stored and published
  states compare with it as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

ACCELERATOR_LABELS: tuple[str, ...] = ("chip", "gpu", "npu")     # sorted: the order of accelerator_name
WORKLOAD_LABELS: tuple[str, str, str, str] = ("namespace", "pod", "container", "workload")
WorkloadKey = tuple[str, str, str, str]
"""(namespace, pod, container, workload): empty strings when unknown."""
NO_WORKLOAD: WorkloadKey = ("", "", "", "")

class State(StrEnum):
    """A verdict's state, in the order the docs list them (docs/workloads.md section 2)."""

    IDLE = "idle"
    DEMAND_LIMITED = "demand-limited"
    COMPUTE_BOUND = "compute-bound"
    BALANCED = "balanced"
    IO_SATURATED = "io-saturated"
    STAGING_BOUND = "staging-bound"
    NETWORK_BOUND = "network-bound"

    @property
    def facts(self) -> StateFacts:
        return STATE_FACTS[self]

    @property
    def io(self) -> bool:
        """An I/O state: the accelerator is held back by the link, the host or the network (it pages)."""
        return self.facts.io

    @property
    def quiet(self) -> bool:
        """Not busy and nothing holds it back: never a page, never a cause to find."""
        return self.facts.quiet

    @property
    def order(self) -> int:
        """Worst first: which state a mixed window, an equal score or a roll-up's tie takes."""
        return self.facts.order

    @property
    def colour(self) -> str:
        """Its colour on the pages."""
        return self.facts.colour

    @classmethod
    def of(cls, text: str | None) -> State | None:
        """The state ``text`` names; None for anything else ("", "?", an unknown word)."""
        try:
            return cls(text) if text else None
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class StateFacts:
    io: bool
    quiet: bool
    order: int          # worst first
    colour: str         # the quiet states pale greys, the healthy busy ones green and blue, the I/O ones loud


STATE_FACTS: dict[State, StateFacts] = {
    State.IDLE: StateFacts(io=False, quiet=True, order=6, colour="#e0e0e0"),
    State.DEMAND_LIMITED: StateFacts(io=False, quiet=True, order=5, colour="#b0bec5"),
    State.COMPUTE_BOUND: StateFacts(io=False, quiet=False, order=4, colour="#2e7d32"),
    State.BALANCED: StateFacts(io=False, quiet=False, order=3, colour="#1976d2"),
    State.IO_SATURATED: StateFacts(io=True, quiet=False, order=0, colour="#d32f2f"),
    State.STAGING_BOUND: StateFacts(io=True, quiet=False, order=1, colour="#ef6c00"),
    State.NETWORK_BOUND: StateFacts(io=True, quiet=False, order=2, colour="#7b1fa2"),
}

# the same as text (what is stored, published and matched; a ``State`` equals its text)
STATES: tuple[str, ...] = tuple(s.value for s in State)
IO_STATES: frozenset[str] = frozenset(s.value for s in State if s.io)
QUIET_STATES: frozenset[str] = frozenset(s.value for s in State if s.quiet)
WORST_FIRST: tuple[str, ...] = tuple(s.value for s in sorted(State, key=lambda s: s.order))
"""Which state a mixed window or an equal score takes: I/O states first, then the busiest."""


def is_healthy(state: str | None) -> bool:
    """Whether ``state`` is a known state that is no I/O state (an unknown one is not healthy)."""
    st = State.of(state)
    return st is not None and not st.io


def accelerator_name(labels: Mapping[str, str]) -> str | None:
    """``gpu=0``, ``chip=0,npu=1`` from a series' labels; None when it carries no accelerator label."""
    parts = [f"{k}={labels[k]}" for k in ACCELERATOR_LABELS if labels.get(k) not in (None, "")]
    return ",".join(parts) if parts else None


def accelerator_labels(name: str) -> dict[str, str]:
    """``gpu=0`` -> {"gpu": "0"}; ``chip=0,npu=1`` -> {"chip": "0", "npu": "1"}."""
    out: dict[str, str] = {}
    for part in name.split(","):
        k, _, v = part.partition("=")
        if k:
            out[k] = v
    return out


def workload_key(labels: Mapping[str, str]) -> WorkloadKey:
    """(namespace, pod, container, workload) of a series' labels; empty strings when unknown."""
    g = labels.get
    return (g("namespace", ""), g("pod", ""), g("container", ""), g("workload", ""))


def workload_labels(key: WorkloadKey) -> dict[str, str]:
    return dict(zip(WORKLOAD_LABELS, key, strict=True))


AcceleratorOrder = tuple[bool, tuple[int, str], tuple[int, str]]
_SAFE = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def _num(v: str) -> tuple[int, str]:
    return (int(v), "") if v.isdigit() else (1 << 30, v)


@dataclass(frozen=True)
class AcceleratorId:
    """One accelerator of a node: a GPU by its NVML index, an NPU by ``npu`` id and ``chip``."""

    kind: str        # "gpu" or "npu"
    index: str
    chip: str = ""

    @classmethod
    def of(cls, labels: Mapping[str, str]) -> AcceleratorId | None:
        """The accelerator a series' labels name, None for a node-wide series."""
        g = labels.get("gpu")
        if g:
            return cls("gpu", str(g))
        n = labels.get("npu")
        if n:
            return cls("npu", str(n), str(labels.get("chip") or ""))
        return None

    @classmethod
    def parse(cls, name: str) -> AcceleratorId | None:
        """The accelerator ``accelerator_name`` wrote (``gpu=0``, ``chip=0,npu=1``, a verdict run's
        ``accelerator``); None for "" (the node's roll-up), ``node`` and anything else."""
        return cls.of(accelerator_labels(name)) if name else None

    @classmethod
    def from_query(cls, gpu: str | None = None, npu: str | None = None, chip: str | None = None) -> AcceleratorId | None:
        """The accelerator a page's ``?gpu=1`` / ``?npu=3&chip=0`` names (None: the whole node)."""
        if gpu and _SAFE.fullmatch(str(gpu)):
            return cls("gpu", str(gpu))
        if npu and _SAFE.fullmatch(str(npu)):
            return cls("npu", str(npu), str(chip) if chip and _SAFE.fullmatch(str(chip)) else "")
        return None

    @property
    def labels(self) -> dict[str, str]:
        return {"gpu": self.index} if self.kind == "gpu" else {"npu": self.index, "chip": self.chip}

    @property
    def key(self) -> str:
        """``gpu=0``, ``chip=0,npu=1``: its ``accelerator_name``."""
        return accelerator_name(self.labels) or ""

    @property
    def name(self) -> str:
        """How the pages name it: ``GPU 0``, ``NPU 1/0``."""
        if self.kind == "gpu":
            return f"GPU {self.index}"
        return f"NPU {self.index}/{self.chip}" if self.chip else f"NPU {self.index}"

    @property
    def query(self) -> str:
        """The page's URL parameters for it: ``gpu=1``, ``npu=3&chip=0``."""
        if self.kind == "gpu":
            return f"gpu={self.index}"
        return f"npu={self.index}" + (f"&chip={self.chip}" if self.chip else "")

    @property
    def sort_key(self) -> AcceleratorOrder:
        """GPUs first, by index (numeric), then NPUs by id and chip."""
        return (self.kind != "gpu", _num(self.index), _num(self.chip))

    def __lt__(self, other: AcceleratorId) -> bool:
        return self.sort_key < other.sort_key

    def matches(self, labels: Mapping[str, str]) -> bool:
        return AcceleratorId.of(labels) == self
