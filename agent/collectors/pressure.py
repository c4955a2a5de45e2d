"""Pressure stall information (PSI) from ``/proc/pressure/{cpu,memory,io}`` (and ``irq`` where present).

Each file has up to two lines::

    some avg10=4.69 avg60=1.30 avg300=1.70 total=11826793
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

``avg10`` (percent of wall time over the last 10 s) -> ``triscope_pressure_ratio{resource,kind}``
as 0..1; ``total`` (microseconds stalled) -> ``triscope_pressure_stalled_seconds_total``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from triscope.agent.collectors.base import Availability, BaseCollector, CollectorUnavailable, OpenFiles
from triscope.core.samples import Sample

RESOURCES = ("cpu", "memory", "io", "irq")

PSI_HINT = ("PSI needs a kernel with CONFIG_PSI=y; kernels built with CONFIG_PSI_DEFAULT_DISABLED "
            "need 'psi=1' on the kernel command line")


def parse_pressure(text: str) -> dict[str, dict[str, float]]:
    """``{"some": {"avg10": 4.69, "avg60": ..., "avg300": ..., "total": 11826793.0}, "full": {...}}``."""

    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        kind, fields = words[0], words[1:]
        if kind not in ("some", "full"):
            raise ValueError(f"unexpected PSI line {line!r}")
        values: dict[str, float] = {}
        for field in fields:
            key, sep, value = field.partition("=")
            if not sep:
                raise ValueError(f"unexpected PSI field {field!r}")
            values[key] = float(value)
        out[kind] = values
    return out


class PressureCollector(BaseCollector):
    name = "pressure"

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.dir = os.path.join(proc, "pressure")
        self._files = OpenFiles()
        self._resources: list[str] | None = None   # found on the first tick; looked for again after a failure

    def _present(self) -> list[str]:
        return [r for r in RESOURCES if os.path.exists(os.path.join(self.dir, r))]

    def check(self) -> Availability:
        present = self._present()
        if not present:
            return Availability(False, f"no pressure stall information ({self.dir} missing)", PSI_HINT)
        try:
            with open(os.path.join(self.dir, present[0])) as f:
                parse_pressure(f.read())
        except OSError as e:
            # /proc/pressure/* answers EOPNOTSUPP when PSI was disabled at boot
            return Availability(False, f"{self.dir}/{present[0]} not readable: {e.strerror or e}", PSI_HINT)
        except ValueError as e:
            return Availability(False, f"{self.dir}/{present[0]}: {e}", "unknown PSI format: report this kernel")
        return Availability(True)

    def close(self) -> None:
        self._files.close()

    def collect(self, now: float) -> Iterator[Sample]:
        present = self._resources if self._resources is not None else self._present()
        if not present:
            raise CollectorUnavailable(f"no pressure stall information ({self.dir} missing)", PSI_HINT)
        self._resources = present
        for resource in present:
            try:
                parsed = parse_pressure(self._files.read(os.path.join(self.dir, resource)))
            except (OSError, ValueError) as e:
                self._resources = None
                raise CollectorUnavailable(f"cannot read {self.dir}/{resource}: {e}", PSI_HINT) from e
            for kind, values in parsed.items():
                labels = {"resource": resource, "kind": kind}
                if "avg10" in values:
                    yield Sample("triscope_pressure_ratio", round(values["avg10"] / 100.0, 6), labels, "gauge")
                if "total" in values:
                    yield Sample("triscope_pressure_stalled_seconds_total", values["total"] / 1e6, labels, "counter")
