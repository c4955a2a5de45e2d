"""The kernel's CPU list format (``local_cpulist``, ``cpuset.cpus``: ``"0-55,112-167"``), shared by the
agent's topology and placement and the engine's knobs-file fallback."""

from __future__ import annotations


def parse_cpulist(text: str) -> list[int]:
    """``"0-55,112-167"`` -> the CPUs; an empty or malformed list -> []."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            return []
        cpus.extend(range(a, b + 1))
    return cpus
