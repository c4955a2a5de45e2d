"""CUDA driver uprobes on this machine's real kernel: the stand-in libcuda (examples/hostlab/fakecuda.c,
the driver's signatures, a simulated GPU) loaded by real child processes, the probes compiled by
BCC in the loader child, read by ``CudaCalls`` through raw bpf() syscalls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.hostlab.fakecuda import Child, build
from triscope.agent.collectors.cudacalls import SYMBOLS, CudaCalls

pytestmark = pytest.mark.ebpf
MiB = 1 << 20


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("fakecuda"))


@pytest.fixture(scope="module")
def calls(lib: Path) -> Iterator[CudaCalls]:
    """Attached at start (the library given): every child below starts after the attach."""
    cc = CudaCalls(libraries=[str(lib)], search_host=False)
    rows = {name: (ok, reason) for name, ok, reason, _hint in cc.status()}
    assert rows["cuda_uprobes"][0], rows
    yield cc
    cc.close()


@pytest.fixture
def child(lib: Path, calls: CudaCalls) -> Iterator[Child]:
    with Child(lib) as c:
        c.call("config", block_ns=1_000_000, staging_bw=1e9, dma_bw=25e9, blocking=0)
        calls.track([c.pid])
        calls.read()                      # the window starts here
        yield c
    calls.track([])


def test_every_entry_point_the_stand_in_exports_is_attached(calls: CudaCalls, lib: Path) -> None:
    rows = {name: (ok, reason) for name, ok, reason, _hint in calls.status()}
    ok, text = rows[f"cuda_uprobes:{lib}"]
    assert ok, text
    lb = next(iter(calls.libraries.values()))
    # all but the launch entry points (launch probe off) and cuMemHostRegister, which the stand-in
    # does not export (the real driver keeps it beside _v2)
    want = {n for _i, n, _k in SYMBOLS if not n.startswith("cuLaunchKernel")} - {"cuMemHostRegister"}
    assert set(lb.attached) == want
    assert lb.missing == ["cuMemHostRegister"] and "not exported: cuMemHostRegister" in text
    assert not lb.launch


def test_the_thread_that_calls_the_driver_drives_and_its_sibling_does_not(calls: CudaCalls, child: Child) -> None:
    assert Path(f"/proc/{child.pid}/task/{child.idle_tid}").exists()    # the sibling is alive and runs
    child.call("launch", grid=20)
    child.call("sync", sym="cuStreamSynchronize")
    out = calls.read()
    assert set(out) == {child.tid}
    t = out[child.tid]
    assert t.driving and t.tgid == child.pid and t.sync_calls == 1 and t.calls == 1
    assert child.idle_tid not in out
    assert calls.read() == {}                                           # nothing since: nobody drives


def test_a_spinning_sync_counts_as_sync_time_while_the_thread_is_on_a_cpu(calls: CudaCalls, child: Child) -> None:
    child.call("launch", grid=400)                                      # 400 ms of queued work
    r = child.call("sync", sym="cuCtxSynchronize")
    t = calls.read()[child.tid]
    wall = r["ns"] / 1e9
    assert 0.35 <= wall <= 0.6, r
    assert r["cpu_ns"] >= 0.25 * r["ns"], r          # it spun: on a CPU whenever it got one (2 cores, shared)
    assert wall * 0.97 - 0.002 <= t.sync_seconds <= wall, (t.sync_seconds, wall)
    assert t.sync_calls == 1
    # the same wait, blocking instead of spinning: the same sync time, no CPU
    child.call("config", blocking=1)
    child.call("launch", grid=300)
    r = child.call("sync", sym="cuEventSynchronize")
    t = calls.read()[child.tid]
    assert r["cpu_ns"] < 0.05 * r["ns"], r
    assert r["ns"] / 1e9 * 0.97 - 0.002 <= t.sync_seconds <= r["ns"] / 1e9


def test_a_sync_in_progress_counts_as_it_goes_and_never_twice(calls: CudaCalls, child: Child) -> None:
    child.call("launch", grid=1500)
    done: dict = {}
    th = threading.Thread(target=lambda: done.update(child.call("sync", sym="cuStreamSynchronize_ptsz")))
    th.start()
    parts = []
    while th.is_alive():
        time.sleep(0.3)
        t = calls.read().get(child.tid)
        parts.append((t.sync_seconds, t.sync_open, t.sync_calls) if t else (0.0, False, 0))
    th.join()
    t = calls.read().get(child.tid)
    if t:
        parts.append((t.sync_seconds, t.sync_open, t.sync_calls))
    opened = [p for p in parts if p[1]]
    assert len(opened) >= 3, parts                                       # seen while still inside
    assert all(0.2 <= p[0] <= 0.45 for p in opened[1:]), parts         # each read: about its 0.3 s
    total = sum(p[0] for p in parts)
    assert done["ns"] / 1e9 * 0.97 - 0.002 <= total <= done["ns"] / 1e9 + 0.002, (total, done, parts)
    assert sum(p[2] for p in parts) == 1


def test_pageable_and_pinned_h2d_copies_are_told_apart(calls: CudaCalls, child: Child) -> None:
    pageable = child.call("alloc", kind="pageable", bytes=16 * MiB)
    hostalloc = child.call("alloc", kind="hostalloc", bytes=16 * MiB)
    allochost = child.call("alloc", kind="allochost", bytes=4 * MiB)
    registered = child.call("alloc", kind="register", bytes=8 * MiB)
    calls.read()
    slow = [child.call("h2d", id=pageable["id"], sym="cuMemcpyHtoDAsync_v2")]          # 16 MiB at 1 GB/s
    fast = [child.call("h2d", id=hostalloc["id"], sym="cuMemcpyHtoDAsync_v2_ptsz"),
            child.call("h2d", id=allochost["id"], sym="cuMemcpyHtoDAsync_v2"),
            child.call("h2d", id=registered["id"], offset=4096, bytes=4 * MiB, sym="cuMemcpyHtoDAsync_v2"),
            child.call("memcpy", id=hostalloc["id"], bytes=MiB, sym="cuMemcpyAsync")]   # unified, pinned source
    child.call("free", id=registered["id"])                            # unregistered: pageable again
    slow.append(child.call("h2d", id=registered["id"], bytes=4 * MiB, sym="cuMemcpyHtoD_v2"))
    child.call("memcpy", id=pageable["id"], bytes=MiB, sym="cuMemcpy")  # unified, source not pinned
    child.call("d2h", id=pageable["id"], bytes=2 * MiB, sym="cuMemcpyDtoH_v2_ptds")
    t = calls.read()[child.tid]
    assert t.pinned_ranges_complete
    assert (t.h2d_pageable_calls, t.h2d_pageable_bytes) == (2, 20 * MiB)
    assert (t.h2d_pinned_calls, t.h2d_pinned_bytes) == (4, 16 * MiB + 4 * MiB + 4 * MiB + MiB)
    assert (t.unified_calls, t.unified_bytes) == (1, MiB)
    assert (t.d2h_calls, t.d2h_bytes) == (1, 2 * MiB)
    assert t.h2d_unclassified_calls == 0
    slow_s = sum(r["ns"] for r in slow) / 1e9
    assert slow_s >= 0.02
    assert slow_s * 0.95 - 0.002 <= t.h2d_pageable_seconds <= slow_s, (t.h2d_pageable_seconds, slow_s)
    assert t.h2d_pinned_seconds <= sum(r["ns"] for r in fast) / 1e9 < 0.1 * slow_s
    # freed pinned memory is forgotten: a copy from the freed host allocation's range is pageable
    child.call("free", id=allochost["id"])
    again = child.call("alloc", kind="pageable", bytes=MiB)
    child.call("h2d", id=again["id"])
    t = calls.read()[child.tid]
    assert (t.h2d_pageable_calls, t.h2d_pinned_calls) == (1, 0)


def test_an_untracked_process_is_not_counted(calls: CudaCalls, child: Child, lib: Path) -> None:
    before = calls.symbol_calls()
    with Child(lib) as other:
        other.call("config", block_ns=1_000_000, staging_bw=1e9)
        other.call("launch", grid=50)
        other.call("sync", sym="cuEventSynchronize")
        buf = other.call("alloc", kind="pageable", bytes=4 * MiB)
        other.call("h2d", id=buf["id"])
        other.call("d2h", id=buf["id"], sym="cuMemcpyDtoHAsync_v2_ptsz")
        child.call("sync")
        out = calls.read()
        assert set(out) == {child.tid}
        assert all(t.tgid == child.pid for t in out.values())
        assert out[child.tid].sync_calls == 1 and out[child.tid].h2d_pageable_calls == 0
        after = calls.symbol_calls()
        assert after.get("cuEventSynchronize", 0) == before.get("cuEventSynchronize", 0)
        assert after.get("cuMemcpyDtoHAsync_v2_ptsz", 0) == before.get("cuMemcpyDtoHAsync_v2_ptsz", 0)
        assert after["cuCtxSynchronize"] == before.get("cuCtxSynchronize", 0) + 1
        # tracked from now on: counted
        calls.track([child.pid, other.pid])
        other.call("sync", sym="cuEventSynchronize")
        assert calls.read()[other.tid].sync_calls == 1


def test_the_launch_probe_is_off_by_default_and_counts_launches_when_on(lib: Path) -> None:
    cc = CudaCalls(libraries=[str(lib)], search_host=False)
    try:
        rows = {name: (ok, reason) for name, ok, reason, _hint in cc.status()}
        assert rows["cuda_launch"][0] is False and "off by default" in rows["cuda_launch"][1]
        assert "% of a core at 10,000/s" in rows["cuda_launch"][1]              # what it would cost, said
        with Child(lib) as c:
            cc.track([c.pid])
            c.call("launch", n=50)
            c.call("sync")
            t = cc.read()[c.tid]
            assert t.launches is None and t.calls == 1                  # only the sync was seen
            cc.set_launch_probe(True)
            assert {name: ok for name, ok, _r, _h in cc.status()}["cuda_launch"]
            c.call("launch", n=1234)
            c.call("launch", n=100, sym="cuLaunchKernel_ptsz")
            t = cc.read()[c.tid]
            assert t.launches == 1334 and t.calls == 1334
            assert cc.symbol_calls()["cuLaunchKernel"] == 1234
            cc.set_launch_probe(False)
            c.call("launch", n=10)
            c.call("sync")
            t = cc.read()[c.tid]
            assert t.launches is None and t.calls == 1
    finally:
        cc.close()


def test_a_process_already_running_at_attach_is_found_in_its_maps_and_flagged(lib: Path) -> None:
    """No library given: the one the tracked process maps is attached.  Memory it pinned before
    the attach is not known (its copies count as pageable): the reads say the ranges are incomplete."""
    with Child(lib) as c:
        early = c.call("alloc", kind="hostalloc", bytes=MiB)
        cc = CudaCalls(search_host=False)
        try:
            assert {name for name, *_ in cc.status()} == {"cuda_uprobes", "cuda_launch"}
            cc.track([c.pid])
            rows = {name: ok for name, ok, _r, _h in cc.status()}
            assert rows["cuda_uprobes"] and rows[f"cuda_uprobes:{lib}"], cc.status()
            late = c.call("alloc", kind="hostalloc", bytes=MiB)
            c.call("h2d", id=early["id"])
            c.call("h2d", id=late["id"])
            t = cc.read()[c.tid]
            assert not t.pinned_ranges_complete
            assert (t.h2d_pinned_calls, t.h2d_pageable_calls) == (1, 1)
        finally:
            cc.close()


def test_disabled_closed_or_without_bcc_nothing_is_read_and_status_says_why(lib: Path, tmp_path: Path) -> None:
    off = CudaCalls(enabled=False, libraries=[str(lib)], search_host=False)
    assert off.status()[0][:3] == ("cuda_uprobes", False, "disabled (enabled=False)")
    nobcc = CudaCalls(libraries=[str(lib)], search_host=False, bcc_path=str(tmp_path))
    assert nobcc.status()[0][1] is False and nobcc.status()[0][2].startswith("BCC missing"), nobcc.status()
    closed = CudaCalls(libraries=[str(lib)], search_host=False)
    closed.close()
    with Child(lib) as c:
        for cc in (off, nobcc, closed):
            cc.track([c.pid])
            c.call("sync")
            assert cc.read() == {}
    nobcc.close()


def test_what_a_uprobe_costs_a_call_is_measured(lib: Path, tmp_path: Path) -> None:
    """bench/bench_cuda_uprobes.py's measurement, short: the loop's calls all seen by the probes,
    each probed call slower than without (the figure the launch probe's default follows)."""
    from bench.bench_cuda_uprobes import BUILDS, uprobe_cost

    c = uprobe_cost(str(build(tmp_path, BUILDS["push"])), n=5000, reps=3)
    assert c.launches_counted == c.launches_made == 15_000
    assert c.syncs_counted == c.syncs_made == 15_000
    assert 100 < c.launch_ns < 100_000 and 100 < c.pair_ns < 100_000, c
    assert c.launch_core_pct_at_10k == pytest.approx(c.launch_ns / 1000)


def test_entry_points_that_start_with_endbr64_are_probed_just_past_it(tmp_path: Path) -> None:
    """Built with CET landing pads (-fcf-protection=full), each entry point starts with endbr64,
    which the kernel would single-step: the probes sit 4 bytes in and read the same arguments."""
    from bench.bench_cuda_uprobes import BUILDS

    cet = build(tmp_path, BUILDS["endbr64"])
    assert (cet.read_bytes().count(b"\xf3\x0f\x1e\xfa")) >= len(SYMBOLS)
    cc = CudaCalls(libraries=[str(cet)], search_host=False)
    try:
        lb = next(iter(cc.libraries.values()))
        assert lb.past_endbr64 == set(lb.attached), lb
        assert "probed just past their endbr64" in dict((n, r) for n, _ok, r, _h in cc.status())[f"cuda_uprobes:{cet}"]
        with Child(cet) as c:
            c.call("config", block_ns=1_000_000, staging_bw=1e9)
            cc.track([c.pid])
            pinned = c.call("alloc", kind="hostalloc", bytes=2 * MiB)
            pageable = c.call("alloc", kind="pageable", bytes=3 * MiB)
            c.call("h2d", id=pinned["id"])
            c.call("h2d", id=pageable["id"], sym="cuMemcpyHtoD_v2")
            c.call("launch", grid=100)
            r = c.call("sync", sym="cuStreamSynchronize")
            t = cc.read()[c.tid]
            assert (t.h2d_pinned_bytes, t.h2d_pageable_bytes, t.sync_calls) == (2 * MiB, 3 * MiB, 1)
            assert r["ns"] / 1e9 * 0.97 - 0.002 <= t.sync_seconds <= r["ns"] / 1e9
    finally:
        cc.close()
