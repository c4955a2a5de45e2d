"""A bounded on-disk spool for ticks the store could not take.

Ticks are appended as JSON lines to segment files; ``drain()`` hands them back oldest first.
When the spool would exceed ``max_bytes`` the oldest segment is dropped and its samples counted
as dropped (the only way samples are ever lost, and it is counted and exported).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from triscope.samples import EventRecord, Sample, Tick

log = logging.getLogger(__name__)

SEGMENT_BYTES = 1 << 20


def tick_to_json(t: Tick) -> str:
    return json.dumps({
        "ts": t.ts,
        "s": [[s.name, dict(s.labels), s.value, s.kind] for s in t.samples],
        "e": [[e.kind, e.message, e.severity, e.details, e.ts] for e in t.events],
    }, separators=(",", ":"), default=str)


def tick_from_json(line: str) -> Tick:
    d = json.loads(line)
    return Tick(
        float(d["ts"]),
        [Sample(n, float(v), lab, k) for n, lab, v, k in d["s"]],
        [EventRecord(k, m, sev, det, ts) for k, m, sev, det, ts in d["e"]],
    )


class Spool:
    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 256 << 20) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.dropped_samples = 0
        self.spooled_samples_total = 0
        self._lock = threading.Lock()
        self._pending = sum(self._count_samples(p) for p in self._segments())

    def _segments(self) -> list[Path]:
        return sorted(self.dir.glob("seg-*.jsonl"))

    @staticmethod
    def _count_samples(path: Path) -> int:
        try:
            return sum(len(json.loads(line)["s"]) for line in path.read_text().splitlines() if line.strip())
        except (OSError, ValueError):
            return 0

    @property
    def pending_samples(self) -> int:
        return self._pending

    def __len__(self) -> int:
        return len(self._segments())

    def empty(self) -> bool:
        return not self._segments()

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self._segments() if p.exists())

    def append(self, ticks: list[Tick]) -> None:
        data = "".join(tick_to_json(t) + "\n" for t in ticks)
        n = sum(len(t.samples) for t in ticks)
        with self._lock:
            segs = self._segments()
            cur = segs[-1] if segs and segs[-1].stat().st_size < SEGMENT_BYTES else None
            if cur is None:
                seq = int(segs[-1].stem.split("-")[1]) + 1 if segs else 1
                cur = self.dir / f"seg-{seq:09d}.jsonl"
            with open(cur, "a") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            self._pending += n
            self.spooled_samples_total += n
            while self.size_bytes() > self.max_bytes and len(self._segments()) > 1:
                oldest = self._segments()[0]
                lost = self._count_samples(oldest)
                oldest.unlink()
                self._pending -= lost
                self.dropped_samples += lost
                log.error("spool over %d bytes: dropped the oldest segment (%d samples)", self.max_bytes, lost)

    def segments(self) -> Iterator[tuple[Path, list[Tick]]]:
        """Oldest segment first; the caller calls ``commit(path)`` after writing it to the store."""
        for p in self._segments():
            try:
                lines = p.read_text().splitlines()
            except FileNotFoundError:
                continue
            ticks = []
            for i, line in enumerate(lines):
                if not line.strip():
                    continue
                try:
                    ticks.append(tick_from_json(line))
                except (ValueError, KeyError, TypeError):
                    log.error("spool segment %s line %d is corrupt; skipped", p.name, i + 1)
            yield p, ticks

    def commit(self, path: Path, ticks: list[Tick]) -> None:
        with self._lock:
            path.unlink(missing_ok=True)
            self._pending -= sum(len(t.samples) for t in ticks)
