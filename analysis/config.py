"""Thresholds of the coordination-mismatch detector: one dataclass, documented defaults.

Override them from a YAML file (``load_thresholds(path)``, keys are the field names, optionally
under a top-level ``mismatch:`` key) and/or from the environment: ``TRISCOPE_MISMATCH_<FIELD>``
(upper case), e.g. ``TRISCOPE_MISMATCH_IO_SATURATED_LINK=0.7``.  Environment wins over the file.
Unknown keys and values that are not numbers are errors (one clear line, ``FILE:LINE: ...``), not
silently ignored; the file is read with ``triscope.yamlsafe`` (size, depth and alias bounds).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

ENV_PREFIX = "TRISCOPE_MISMATCH_"


class ConfigError(ValueError):
    """A bad threshold file or environment value."""


@dataclass(frozen=True, slots=True)
class MismatchThresholds:
    """Every number the classifier uses.  Ratios are 0..1, rates per second.

    Defaults were chosen against what DESIGN.md reports for the H200 (PCIe Gen5 x16): pinned
    copies run at ~50-60 GB/s (~0.85-0.95 of the link), pageable copies at 5-23 GB/s, a bf16
    matmul keeps SM activity at ~0.90-0.96, re-pinning host buffers maps ~55-1,100 regions/s.
    """

    window_s: float = 10.0
    """Sliding window the state is computed over (seconds)."""
    compute_busy: float = 0.70
    """Accelerator busy (GPM SM activity / AICore) at or above this: ``compute-bound``."""
    starved_busy: float = 0.30
    """Accelerator busy below this counts as starved (the I/O states need a starved accelerator)."""
    idle_busy: float = 0.05
    """Accelerator busy below this, with a quiet link and no host/network trouble: ``idle``."""
    idle_link: float = 0.03
    """Link utilisation below this counts as a quiet link."""
    io_saturated_link: float = 0.75
    """Link utilisation at or above this (of the effective ceiling): ``io-saturated``."""
    link_efficiency: float = 0.85
    """Share of the negotiated gen x width capacity a real link can carry (TLP/DLLP overhead).  The
    effective ceiling is max(negotiated x efficiency, highest rate observed on the link)."""
    fallback_link_bytes_per_second: float = 0.0
    """Ceiling used when the link's generation and width are unknown (0: only the highest observed
    rate, floored at ``min_ceiling_bytes_per_second``)."""
    min_ceiling_bytes_per_second: float = 1e9
    """Never treat a link as saturated below this rate (1 GB/s) when the ceiling is only observed."""
    cpu_busy: float = 0.50
    """Host CPU busy (all CPUs) at or above this is host staging evidence."""
    cpu_pressure: float = 0.10
    """PSI ``cpu some`` / ``memory some`` avg10 at or above this is host staging evidence."""
    pin_churn_rate: float = 10.0
    """DMA map operations per second (on the accelerators' own PCI devices when known) at or above
    this: the pin-churn flag.  Maps happen when host memory is pinned, not per copy, so a healthy
    steady state (cached pinned buffers) maps ~0/s; the H200 trace's pin-churn phase (a fresh
    64 MiB buffer registered per request) maps ~55/s, pinning page by page ~1,100/s."""
    retransmit_rate: float = 5.0
    """TCP retransmits per second at or above this: network trouble."""
    state_dwell_s: float = 2.0
    """Per-tick tracker: a new state is reported once the window has shown it this long in a row
    (0: at once).  Transition ticks (a GPM sample half idle, half copying) do not make states."""
    min_coverage: float = 0.5
    """A window needs accelerator data for at least this share of its ticks to be classified."""

    def with_overrides(self, values: Mapping[str, Any], source: str = "overrides") -> MismatchThresholds:
        known = {f.name for f in fields(self)}
        changes: dict[str, float] = {}
        for key, raw in values.items():
            if key not in known:
                raise ConfigError(f"{source}: unknown mismatch threshold {key!r} (known: {', '.join(sorted(known))})")
            try:
                val = float(raw)
            except (TypeError, ValueError):
                raise ConfigError(f"{source}: {key} must be a number, got {raw!r}") from None
            if not math.isfinite(val) or val < 0:
                raise ConfigError(f"{source}: {key} must be a finite number >= 0, got {raw!r}")
            changes[key] = val
        return replace(self, **changes)


def thresholds_from_env(base: MismatchThresholds | None = None,
                        environ: Mapping[str, str] | None = None) -> MismatchThresholds:
    env = os.environ if environ is None else environ
    base = base or MismatchThresholds()
    known = {f.name for f in fields(base)}
    values = {}
    for k, v in env.items():
        if k.startswith(ENV_PREFIX) and k != "TRISCOPE_MISMATCH_FILE":
            name = k[len(ENV_PREFIX):].lower()
            if name not in known:
                raise ConfigError(f"environment {k}: unknown mismatch threshold {name!r}")
            values[name] = v
    return base.with_overrides(values, "environment") if values else base


def load_thresholds(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> MismatchThresholds:
    """Defaults, then the YAML file (if given), then ``TRISCOPE_MISMATCH_*`` environment variables."""
    th = MismatchThresholds()
    if path is not None:
        from triscope import yamlsafe

        try:
            doc = yamlsafe.load(path)
        except yamlsafe.YAMLFileError as e:
            raise ConfigError(str(e)) from None
        data: Any = doc.root
        base: tuple[str, ...] = ()
        if isinstance(data, dict) and "mismatch" in data:
            data, base = data["mismatch"], ("mismatch",)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{doc.where(base)}: expected a mapping of threshold names to numbers")
        for key, value in data.items():   # one at a time: an error names the key's line
            th = th.with_overrides({key: value}, doc.where(base + (key,)))
    return thresholds_from_env(th, environ)


ENV_FILE = "TRISCOPE_MISMATCH_FILE"


def default_thresholds() -> MismatchThresholds:
    """What the detector uses when no thresholds are passed: the defaults, then the YAML file named
    by ``$TRISCOPE_MISMATCH_FILE`` (if set), then ``TRISCOPE_MISMATCH_*`` variables."""
    return load_thresholds(os.environ.get(ENV_FILE) or None)
