"""The spool writes whole records or none, on a real filesystem that fills up (a tmpfs of a few
hundred KiB the test mounts, fills with a file of its own and empties again).

A tick written as the disk fills is not left half on disk, the first tick after space returns is
not glued onto a torn one, every tick handed to the spool is either in its files or counted as
dropped (once), and the pending-samples figure is the samples in its files.  A torn tail a crash
left is cut at the last whole record when the spool starts.
"""

from __future__ import annotations

import json
from pathlib import Path

from small_fs import fill, free_bytes, small_tmpfs

from triscope.agent.spool import Spool
from triscope.core.samples import Sample, Tick

T0 = 1_800_000_000.0
WIDE = 150


def tick(i: int) -> Tick:
    return Tick(T0 + i, [Sample("triscope_ticks_total", float(i + 1), kind="counter")]
                + [Sample("triscope_wide", float(i), {"k": str(j)}) for j in range(WIDE)])


def in_files(spool: Spool) -> tuple[list[int], int, int]:
    """(tick numbers, samples, corrupt lines) in the spool's segment files, read straight from disk."""
    got: list[int] = []
    samples = corrupt = 0
    for p in sorted(spool.dir.glob("seg-*.jsonl")):
        raw = p.read_bytes()
        assert not raw or raw.endswith(b"\n"), f"{p.name} ends in a torn record: ...{raw[-40:]!r}"
        for line in raw.decode(errors="replace").splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                corrupt += 1
                continue
            got.append(int(d["s"][0][2]) - 1)
            samples += len(d["s"])
    return got, samples, corrupt


def test_a_full_disk_never_tears_a_record_and_every_tick_is_counted_once(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small", 512 << 10) as fs:
        spool = Spool(fs / "spool", 64 << 20)
        taken = kept = 0
        for i in range(5):                       # some ticks on disk before it fills
            assert spool.append([tick(i)])
            taken += 1
            kept += 1
        seg = sorted(spool.dir.glob("seg-*.jsonl"))[-1]
        size_before = seg.stat().st_size
        assert size_before % 4096, "the segment's last page must have room for a torn write"
        filler = fill(fs)
        assert free_bytes(fs) == 0
        refused = 0
        for i in range(5, 9):                    # the disk is full: each is refused whole
            ok = spool.append([tick(i)])
            taken += 1
            refused += not ok
            assert seg.stat().st_size == size_before, "a refused tick left bytes behind (a torn record)"
        assert refused == 4
        ticks, samples, corrupt = in_files(spool)
        assert (ticks, corrupt) == (list(range(5)), 0)
        assert spool.pending_samples == samples == 5 * (WIDE + 1)
        assert spool.dropped_samples == 4 * (WIDE + 1)
        filler.unlink()                          # space again: the next tick is stored whole
        for i in range(9, 12):
            assert spool.append([tick(i)])
            taken += 1
            kept += 1
        ticks, samples, corrupt = in_files(spool)
        assert corrupt == 0 and ticks == [0, 1, 2, 3, 4, 9, 10, 11]
        assert spool.pending_samples == samples
        assert len(ticks) + spool.dropped_samples // (WIDE + 1) == taken     # each tick once
        # a spool started on these files reads the same, and a reader gets every tick back
        again = Spool(fs / "spool", 64 << 20)
        assert again.pending_samples == samples
        back = [int(t.samples[0].value) - 1 for _p, ts in again.segments() for t in ts]
        assert back == ticks


def test_a_full_disk_with_several_segments_sheds_whole_segments_and_counts_them(tmp_path: Path) -> None:
    import triscope.agent.spool as spool_mod

    with small_tmpfs(tmp_path / "small", 256 << 10) as fs:
        old = spool_mod.SEGMENT_BYTES
        spool_mod.SEGMENT_BYTES = 20 << 10        # several small segments on the small disk
        try:
            spool = Spool(fs / "spool", 64 << 20)
            taken = 0
            while free_bytes(fs) > 0 and taken < 400:
                spool.append([tick(taken)])
                taken += 1
            for _k in range(20):                 # on a full disk: shed the oldest, keep the newest
                spool.append([tick(taken)])
                taken += 1
            ticks, samples, corrupt = in_files(spool)
            assert corrupt == 0
            assert spool.pending_samples == samples
            assert len(ticks) + spool.dropped_samples // (WIDE + 1) == taken
            assert spool.dropped_samples % (WIDE + 1) == 0
            assert ticks == sorted(ticks) and ticks[-1] == taken - 1, "the newest tick was kept"
        finally:
            spool_mod.SEGMENT_BYTES = old


def test_a_torn_tail_left_by_a_crash_is_cut_at_start(tmp_path: Path) -> None:
    from triscope.agent.spool import tick_to_json

    d = tmp_path / "spool"
    d.mkdir()
    whole = "".join(tick_to_json(tick(i)) + "\n" for i in range(3))
    torn = tick_to_json(tick(3))[:700]
    (d / "seg-000000001.jsonl").write_text(whole + torn)
    spool = Spool(d, 64 << 20)
    assert (d / "seg-000000001.jsonl").read_text() == whole
    assert spool.pending_samples == 3 * (WIDE + 1)
    assert spool.append([tick(4)])
    ticks, samples, corrupt = in_files(spool)
    assert (ticks, corrupt) == ([0, 1, 2, 4], 0)
    assert spool.pending_samples == samples
