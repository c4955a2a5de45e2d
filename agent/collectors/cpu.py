"""Host CPU time and memory from ``/proc/stat`` and ``/proc/meminfo``.

- ``triscope_cpu_seconds_total{mode}``: the aggregate ``cpu`` row of ``/proc/stat`` (all CPUs, in
  USER_HZ ticks, converted to seconds).  ``guest``/``guest_nice`` are left out: the kernel already
  counts them inside ``user``/``nice``.
- ``triscope_cpu_busy_ratio``: 1 - (idle + iowait) / all, over the time since the previous tick
  (not emitted on the first tick: there is no previous one).
- ``triscope_memory_available_bytes`` / ``triscope_memory_total_bytes``: ``MemAvailable`` / ``MemTotal``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from triscope.agent.collectors.base import Availability, BaseCollector, CollectorUnavailable, OpenFiles
from triscope.core.samples import Sample

# /proc/stat "cpu" columns, in order (man 5 proc); guest and guest_nice follow but are not summed.
MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
IDLE_MODES = ("idle", "iowait")


def parse_stat_cpu(text: str) -> dict[str, int]:
    """The aggregate ``cpu`` row as ``{mode: ticks}`` (missing trailing columns on old kernels -> absent)."""

    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            return dict(zip(MODES, values, strict=False))
    raise ValueError("no aggregate 'cpu' line")


def parse_meminfo(text: str) -> dict[str, int]:
    """``{"MemAvailable": bytes, ...}`` (values in ``kB`` converted to bytes)."""

    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        words = rest.split()
        if not words:
            continue
        value = int(words[0])
        if len(words) > 1 and words[1] == "kB":
            value *= 1024
        out[key.strip()] = value
    return out


class CpuCollector(BaseCollector):
    name = "cpu"

    def __init__(self, proc: str = "/proc", clk_tck: int | None = None) -> None:
        self.proc = proc
        self.clk_tck = clk_tck or os.sysconf("SC_CLK_TCK")
        self._prev: dict[str, int] | None = None
        self._files = OpenFiles()

    def _read(self, rel: str) -> str:
        return self._files.read(os.path.join(self.proc, rel))

    def close(self) -> None:
        self._files.close()

    def check(self) -> Availability:
        try:
            parse_stat_cpu(self._read("stat"))
        except FileNotFoundError:
            return Availability(False, f"{self.proc}/stat not found (procfs not mounted at {self.proc}?)",
                                "mount procfs, or pass the host's /proc to the agent")
        except (OSError, ValueError) as e:
            return Availability(False, f"cannot parse {self.proc}/stat: {e}", "check procfs")
        return Availability(True)

    def collect(self, now: float) -> Iterator[Sample]:
        try:
            ticks = parse_stat_cpu(self._read("stat"))
        except (OSError, ValueError) as e:
            raise CollectorUnavailable(f"cannot read {self.proc}/stat: {e}", "check procfs") from e
        for mode, value in ticks.items():
            yield Sample("triscope_cpu_seconds_total", value / self.clk_tck, {"mode": mode}, "counter")
        prev, self._prev = self._prev, ticks
        if prev is not None:
            delta = {m: ticks[m] - prev.get(m, 0) for m in ticks}
            total = sum(delta.values())
            # a counter that went backwards (CPU hot-unplug) makes the delta meaningless: skip it
            if total > 0 and all(d >= 0 for d in delta.values()):
                idle = sum(delta.get(m, 0) for m in IDLE_MODES)
                yield Sample("triscope_cpu_busy_ratio", 1.0 - idle / total, {}, "gauge")
        try:
            mem = parse_meminfo(self._read("meminfo"))
        except (OSError, ValueError):
            return
        if "MemAvailable" in mem:
            yield Sample("triscope_memory_available_bytes", float(mem["MemAvailable"]), {}, "gauge")
        if "MemTotal" in mem:
            yield Sample("triscope_memory_total_bytes", float(mem["MemTotal"]), {}, "gauge")
