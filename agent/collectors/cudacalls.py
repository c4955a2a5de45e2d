"""Calls into the CUDA driver (uprobes on libcuda): which threads drive the GPU and where their time goes.

The kernel side is ``agent/ebpf/cuda.bpf.c`` (its own compile, in the loader child like the other
probes: this process never imports bcc).  What ``read()`` gives, per thread of the tracked
processes, since the last read:

* **which threads drive the accelerator**: every thread that called a probed driver entry point
  (or is inside a synchronisation call) is in the answer; the others of the process are not;
* **time inside synchronisation** (``cuCtxSynchronize``, ``cuStreamSynchronize[_ptsz]``,
  ``cuEventSynchronize``): CUDA's default synchronisation spins in user space, so the scheduler
  shows this time as running; it is time waiting on the accelerator.  A call still in progress
  counts as it goes (a sync of a minute shows in every read, not all at once when it returns);
* **host-to-device copies, pinned and pageable told apart**: each copy is an event (source
  address, bytes, time inside); the agent keeps each process's pinned host ranges from the
  ``cuMemHostAlloc`` / ``cuMemAllocHost_v2`` / ``cuMemHostRegister[_v2]`` / ``cuMemFreeHost`` /
  ``cuMemHostUnregister`` events, in the order the ring buffer delivers them, and classifies each
  copy by whether its source lies in one.  Time inside a pageable copy is the CPU staging it
  through the driver's pinned buffers (the synchronous variants first wait for the stream); an
  async pinned copy returns at once.  Ranges are complete for a process that started after its
  library was attached (``pinned_ranges_complete``); for one that was already running, the
  driver's device-file mappings in ``/proc/PID/maps`` (``/dev/nvidia*``: memory the driver
  allocated, hence pinned) are added, and memory it registered before the attach is not known;
* the unified ``cuMemcpy`` / ``cuMemcpyAsync`` (direction from unified addressing): a source in a
  pinned range counts as a pinned H2D copy; any other is reported apart (``unified_*``): a
  pageable source cannot be told from a device one without the driver's own tables;
* device-to-host copies (time, bytes) and, with ``launch_probe=True``, kernel launches.

Libraries are found in ``/proc/PID/maps`` of the tracked processes (a mapped file named
``libcuda.so*``, opened through ``/proc/PID/root`` so a container's copy resolves to its inode);
one inode is attached once, for every process using it (uprobes live on the file); a new one is
attached by a new loader run with maps of its own, read together with the others.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import re
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from triscope.agent.ebpf.bpfsys import BpfError, BpfMap, RingBuffer, sum_u64_percpu
from triscope.agent.ebpf.discover import DEFAULT_BCC_PATH, HINT_BCC, HINT_PERM, bpf_privileges, classify_error
from triscope.agent.ebpf.loader import LoadResult, run_loader

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent.parent / "ebpf" / "cuda.bpf.c"
MAPS = ["cu_tgids", "cu_threads", "cu_inflight", "cu_sym_calls", "cu_counters", "cu_events"]

# kinds (cuda.bpf.c CU_*) and the entry handler each kind is probed with
SYNC, H2D, D2H, UNIFIED, PIN_ALLOC, PIN_REGISTER, PIN_FREE, PIN_UNREGISTER, LAUNCH = range(1, 10)
HANDLER_KIND = {"cu_sync_enter": SYNC, "cu_h2d_enter": H2D, "cu_d2h_enter": D2H, "cu_unified_enter": UNIFIED,
                "cu_pin_alloc_enter": PIN_ALLOC, "cu_pin_register_enter": PIN_REGISTER,
                "cu_pin_free_enter": PIN_FREE, "cu_pin_unregister_enter": PIN_UNREGISTER, "cu_launch_enter": LAUNCH}
KIND_NAME = {SYNC: "sync", H2D: "h2d", D2H: "d2h", UNIFIED: "unified", LAUNCH: "launch"}   # else "pinned"

# struct cu_thread: u64 calls, sync_ns, sync_calls, last_sync_start, d2h_ns, d2h_bytes, d2h_calls, launches,
# lost_ns, lost_bytes, lost_calls; u32 tgid, pad
CU_THREAD = struct.Struct("<11QII")
# struct cu_call: u64 since, a, b, bytes; u32 kind, sym, depth, tgid, tracked, pad
CU_CALL = struct.Struct("<4Q6I")
# struct cu_event: u64 start, ns, src, dst, bytes; u32 tgid, tid, kind, sym
CU_EVENT = struct.Struct("<5Q4I")
_U32 = struct.Struct("<I")

# What the launch probe (one uprobe per cuLaunchKernel of a tracked process) adds to each launch,
# measured with bench/bench_cuda_uprobes.py on the 2-core CPU VM (kernel 6.18): 950-1,300 ns where
# the kernel emulates the probed instruction (push), 12-24 us where it single-steps it (sub, endbr64):
# 1 % of a core at 10,000 launches/s at best, so the probe stays off unless asked for.
LAUNCH_PROBE_NS = 1000.0
HOST_DRIVER_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib",
                    "/usr/local/nvidia/lib64", "/run/nvidia/driver/usr/lib/x86_64-linux-gnu")
HINT_UPROBES = "a kernel with CONFIG_UPROBE_EVENTS (uprobe PMU or tracefs uprobe_events); nothing to install"
RANGES_MAX = 1 << 16          # pinned ranges kept per process
RESCAN_S = 10.0               # how often a tracked process without a known library is looked at again
RETRY_S = 300.0               # how long a library that failed to attach is left alone


def _symbol_table(source: Path = SOURCE) -> list[tuple[int, str, int]]:
    """(id, symbol, kind) of every probed entry point, read from the program's CU_ENTRY table."""
    rows = re.findall(r"^CU_ENTRY\((\d+), (\w+), (\w+)\)", source.read_text(), re.M)
    return [(int(i), name, HANDLER_KIND[how]) for i, name, how in rows]


SYMBOLS = _symbol_table()
SYMBOL_BY_ID = {i: (name, kind) for i, name, kind in SYMBOLS}
SYMBOL_KIND = {name: kind for _i, name, kind in SYMBOLS}
LAUNCH_SYMBOLS = frozenset(name for _i, name, kind in SYMBOLS if kind == LAUNCH)


@dataclass(slots=True)
class ApiTime:
    """One thread's calls into the CUDA driver since the last read: seconds inside the calls,
    bytes, calls.  ``launches`` is None while the launch probe is off.  ``h2d_unclassified_*``:
    copies whose event the ring buffer had no room for (H2D or unified, classes unknown)."""

    tid: int
    tgid: int
    calls: int = 0                      # probed calls that returned (launches included)
    sync_seconds: float = 0.0
    sync_calls: int = 0
    sync_open: bool = False             # inside a synchronisation call at the read
    h2d_pageable_seconds: float = 0.0
    h2d_pageable_bytes: int = 0
    h2d_pageable_calls: int = 0
    h2d_pinned_seconds: float = 0.0
    h2d_pinned_bytes: int = 0
    h2d_pinned_calls: int = 0
    h2d_unclassified_seconds: float = 0.0
    h2d_unclassified_bytes: int = 0
    h2d_unclassified_calls: int = 0
    unified_seconds: float = 0.0        # cuMemcpy[Async] from no known pinned range: direction unknown
    unified_bytes: int = 0
    unified_calls: int = 0
    d2h_seconds: float = 0.0
    d2h_bytes: int = 0
    d2h_calls: int = 0
    launches: int | None = None
    pinned_ranges_complete: bool = False

    @property
    def driving(self) -> bool:
        """The thread issues the accelerator's work: it called the driver (or is inside a sync)."""
        return self.calls > 0 or self.sync_open


class _Ranges:
    """One process's pinned host ranges: from the driver's events (non-overlapping, by start) and
    from its device-file mappings (``/dev/nvidia*``, which may hold the event ranges)."""

    __slots__ = ("started", "starts", "ends", "mapped", "complete")

    def __init__(self, started: float | None, complete: bool) -> None:
        self.started = started          # the process's start: a pid reused is another process
        self.starts: list[int] = []
        self.ends: dict[int, int] = {}
        self.mapped: list[tuple[int, int]] = []
        self.complete = complete

    def add(self, start: int, length: int) -> None:
        if start in self.ends:
            self.ends[start] = start + length
        elif len(self.starts) < RANGES_MAX:
            bisect.insort(self.starts, start)
            self.ends[start] = start + length
        else:
            self.complete = False

    def remove(self, start: int) -> None:
        if self.ends.pop(start, None) is not None:
            del self.starts[bisect.bisect_left(self.starts, start)]

    def __contains__(self, addr: int) -> bool:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.ends[self.starts[i]]:
            return True
        return any(a <= addr < b for a, b in self.mapped)


@dataclass
class _Library:
    key: tuple[int, int]                # (st_dev, st_ino) of the file: what a uprobe lives on
    path: str                           # as the first process that mapped it names it
    attach_path: str
    attached: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)      # not exported by this library
    failed: dict[str, str] = field(default_factory=dict)
    launch: list[str] = field(default_factory=list)
    past_endbr64: set[str] = field(default_factory=set)    # probed just past their endbr64
    boottime: float = 0.0               # CLOCK_BOOTTIME when attached
    reason: str = "not attached"
    hint: str = ""
    failed_at: float | None = None


class _Instance:
    """One loader run: its program's maps and the uprobes it attached."""

    def __init__(self, res: LoadResult, libs: list[_Library]) -> None:
        self.res = res
        self.libs = libs
        self.tgids = BpfMap(res.maps.pop("cu_tgids"))
        self.threads = BpfMap(res.maps.pop("cu_threads"))
        self.inflight = BpfMap(res.maps.pop("cu_inflight"))
        self.sym_calls = BpfMap(res.maps.pop("cu_sym_calls"))
        self.counters = BpfMap(res.maps.pop("cu_counters"))
        self.ring = RingBuffer(res.maps.pop("cu_events"))
        for m, s in ((self.threads, CU_THREAD), (self.inflight, CU_CALL)):
            if m.value_size != s.size:
                raise BpfError(22, f"map {m.info.name}: values of {m.value_size} bytes, expected {s.size}")
        self.prev: dict[int, tuple[int, ...]] = {}
        self.open: dict[int, list[int]] = {}     # tid -> [since, ns reported while open]
        self.pin_lost = 0

    def close(self) -> None:
        for m in (self.tgids, self.threads, self.inflight, self.sym_calls, self.counters):
            with contextlib.suppress(OSError):
                m.close()
        with contextlib.suppress(OSError):
            self.ring.close()
        self.res.close()


def find_libraries(pid: int, proc: str = "/proc") -> list[tuple[str, str, tuple[int, int]]]:
    """(path as mapped, a path this process can open, (dev, inode)) of each ``libcuda.so*`` a process maps."""
    out: dict[tuple[int, int], tuple[str, str, tuple[int, int]]] = {}
    paths: set[str] = set()
    with contextlib.suppress(OSError), open(f"{proc}/{pid}/maps") as f:
        paths = {p[5].strip() for ln in f if "libcuda.so" in ln and len(p := ln.split(None, 5)) == 6}
    for path in sorted(paths):
        if path.endswith("(deleted)") or not os.path.basename(path).startswith("libcuda.so"):
            continue
        via_root = f"{proc}/{pid}/root{path}"
        try:
            st = os.stat(via_root)
            key = (st.st_dev, st.st_ino)
            same = os.stat(path) if os.path.exists(path) else None
        except OSError:
            continue
        opener = path if same is not None and (same.st_dev, same.st_ino) == key else via_root
        out.setdefault(key, (path, opener, key))
    return list(out.values())


def host_driver_libraries(dirs: Iterable[str] = HOST_DRIVER_DIRS) -> list[str]:
    """The node's own ``libcuda.so.1`` where the driver installs it (attached at start, so pinned
    memory of processes started later is seen from their first allocation)."""
    return [str(Path(d, "libcuda.so.1")) for d in dirs if Path(d, "libcuda.so.1").exists()]


def uprobes_supported(tracefs_dirs: Iterable[str] = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"),
                      pmu: str = "/sys/bus/event_source/devices/uprobe/type") -> bool:
    return os.path.exists(pmu) or any(os.path.exists(os.path.join(d, "uprobe_events")) for d in tracefs_dirs)


class CudaCalls:
    """The CUDA driver's calls, per thread of the tracked processes.  Never raises into the agent:
    what cannot run says why in ``status()``.

    ``enabled``: the kill switch (False: nothing is attached, ``read()`` is empty).
    ``launch_probe``: a uprobe on every ``cuLaunchKernel*`` (off by default: see ``LAUNCH_PROBE_NS``).
    ``libraries``: library paths to attach at start; ``search_host``: also the node's own driver
    library (``host_driver_libraries``).  ``skip_endbr64``: probe a function that starts with
    ``endbr64`` just past it (emulated instead of single-stepped: see ``loader._past_endbr64``).
    ``proc``, ``clock_ns``: for tests and containers.  Called from one thread (the agent's tick)."""

    def __init__(self, *, enabled: bool = True, launch_probe: bool = False, libraries: Iterable[str] = (),
                 search_host: bool = True, proc: str = "/proc", bcc_path: str | None = DEFAULT_BCC_PATH,
                 python: str | None = None, load_timeout: float = 60.0, env: dict[str, str] | None = None,
                 clock_ns: Callable[[], int] = time.monotonic_ns, ring_pages: int = 64,
                 skip_endbr64: bool = True) -> None:
        self.enabled = enabled
        self.launch_probe = launch_probe
        self.proc = proc
        self.bcc_path = bcc_path
        self.python = python
        self.load_timeout = load_timeout
        self.env = env
        self.clock_ns = clock_ns
        self.ring_pages = ring_pages
        self.skip_endbr64 = skip_endbr64
        self.reason = "no library attached yet: no tracked process maps libcuda.so"
        self.hint = ""
        self.fatal = ""                                # a reason that stops every attach (BCC, kernel, rights)
        self.tracked: set[int] = set()
        self.libraries: dict[tuple[int, int], _Library] = {}
        self._instances: list[_Instance] = []
        self._ranges: dict[int, _Ranges] = {}
        self._proc_lib: dict[int, tuple[int, int]] = {}  # tgid -> the library it maps
        self._next_scan: dict[int, float] = {}
        self._seeded: set[int] = set()
        self._last = clock_ns()
        self._reads = 0
        if not enabled:
            self.reason = "disabled (enabled=False)"
            return
        self._safely("start", self._start, [*libraries, *(host_driver_libraries() if search_host else [])])

    # ------------------------------------------------------------------ attach
    def _safely(self, what: str, fn: Callable, *args: object) -> object:
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - a collector never stops the agent: told in status()
            log.exception("CUDA uprobes: %s failed", what)
            self.reason = f"{what} failed: {type(e).__name__}: {e}"
            return None

    def _start(self, paths: list[str]) -> None:
        if not uprobes_supported():
            self.fatal, self.hint = "this kernel has no uprobes", HINT_UPROBES
        else:
            ok, why = bpf_privileges()
            if not ok:
                self.fatal, self.hint = why, HINT_PERM
        if self.fatal:
            self.reason = self.fatal
            return
        libs: list[_Library] = []
        for p in paths:
            with contextlib.suppress(OSError):
                st = os.stat(p)
                key = (st.st_dev, st.st_ino)
                if key not in self.libraries and all(lb.key != key for lb in libs):
                    libs.append(_Library(key, p, p))
        if libs:
            self._attach(libs)

    def _entries(self, lib: _Library, launch_only: bool = False) -> list[dict[str, str]]:
        out = []
        for _i, name, kind in SYMBOLS:
            if (launch_only and kind != LAUNCH) or (kind == LAUNCH and not (launch_only or self.launch_probe)):
                continue
            base = {"probe": name, "tp": f"{lib.attach_path}:{name}", "path": lib.attach_path, "sym": name,
                    "skip_endbr64": "1" if self.skip_endbr64 else ""}
            out.append({**base, "kind": "uprobe", "fn": f"on_{name}"})
            if kind != LAUNCH:
                out.append({**base, "kind": "uretprobe", "fn": "on_cu_return"})
        return out

    def _attach(self, libs: list[_Library], launch_only: bool = False) -> None:
        """One loader run for these libraries; their symbols' outcome; a new instance of maps."""
        entries = [e for lb in libs for e in self._entries(lb, launch_only)]
        res = run_loader([f"CU_RING_PAGES={self.ring_pages}"], entries, python=self.python, bcc_path=self.bcc_path,
                         timeout=self.load_timeout, env=self.env, source=SOURCE, maps=MAPS)
        now = time.monotonic()
        for lb in libs:
            self.libraries[lb.key] = lb
        if res.fatal:
            first = res.error.strip().splitlines()[0] if res.error.strip() else res.fatal
            reason, hint = (f"BCC missing ({first})", HINT_BCC) if res.fatal == "bcc" else classify_error(res.error)
            if res.fatal == "bcc":
                self.fatal = reason
            for lb in libs:
                lb.reason, lb.hint, lb.failed_at = reason, hint, now
            self.reason, self.hint = reason, hint
            return
        self._outcomes(res, libs, now)
        if not any(a.ok for a in res.attachments):
            res.close()
            return
        try:
            inst = _Instance(res, libs)
        except (BpfError, OSError, KeyError) as e:
            res.close()
            for lb in libs:
                lb.reason, lb.failed_at = f"maps unreadable: {e}", now
            return
        self._instances.append(inst)
        for t in self.tracked:
            inst.tgids.update(_U32.pack(t), _U32.pack(1))
        self.reason, self.hint = "attached", ""

    def _outcomes(self, res: LoadResult, libs: list[_Library], now: float) -> None:
        """Each library's entry points: attached (past endbr64 or not), not exported, failed."""
        by_lib: dict[str, dict[str, list[bool | str]]] = {}
        for a in res.attachments:
            path = a.tracepoint.rsplit(":", 1)[0]
            by_lib.setdefault(path, {}).setdefault(a.probe, []).append(True if a.ok else a.error)
            if a.ok and a.tracepoint.endswith("+4"):
                for lb in libs:
                    if lb.attach_path == path:
                        lb.past_endbr64.add(a.probe)
        for lb in libs:
            for sym, outcomes in by_lib.get(lb.attach_path, {}).items():
                if all(o is True for o in outcomes):
                    (lb.launch if sym in LAUNCH_SYMBOLS else lb.attached).append(sym)
                elif any("could not determine address of symbol" in str(o) for o in outcomes):
                    lb.missing.append(sym)
                else:
                    lb.failed[sym] = "; ".join(str(o) for o in outcomes if o is not True)
            lb.boottime = lb.boottime or time.clock_gettime(time.CLOCK_BOOTTIME)
            lb.failed_at = None if lb.attached or lb.launch else now
            lb.reason = (f"{len(lb.attached)} entry points attached" if lb.attached or lb.launch
                         else "no entry point attached" + (f": {next(iter(lb.failed.values()))}" if lb.failed else ""))

    def set_launch_probe(self, on: bool) -> None:
        """Switch the per-launch probe: on attaches ``cuLaunchKernel*`` of every attached library
        (a loader run); off detaches them (their perf-event fds closed)."""
        if on == self.launch_probe:
            return
        self.launch_probe = on
        if on:
            libs = [lb for lb in self.libraries.values() if lb.attached and not lb.launch]
            if libs:
                self._safely("launch probe", self._attach, libs, True)
            return
        for inst in list(self._instances):
            for a in inst.res.attachments:
                if a.probe in LAUNCH_SYMBOLS and a.fd >= 0:
                    os.close(a.fd)
                    a.fd = -1
            if all(a.fd < 0 for a in inst.res.attachments):   # a launch-only run: nothing left
                inst.close()
                self._instances.remove(inst)
        for lb in self.libraries.values():
            lb.launch.clear()

    # ------------------------------------------------------------------ what to follow
    def track(self, tgids: Iterable[int]) -> None:
        """Follow exactly these processes; attach the driver library each maps, once per file."""
        if self.enabled:
            self._safely("track", self._track, set(tgids))
        else:
            self.tracked = set(tgids)

    def _track(self, want: set[int]) -> None:
        new, gone = want - self.tracked, self.tracked - want
        for inst in self._instances:
            for t in new:
                inst.tgids.update(_U32.pack(t), _U32.pack(1))
            for t in gone:
                inst.tgids.delete(_U32.pack(t))
        self.tracked = want
        if gone:
            self._forget(gone)
        if self.fatal:
            return
        mono = time.monotonic()
        fresh: dict[tuple[int, int], _Library] = {}
        for t in want:
            if t in self._proc_lib or self._next_scan.get(t, 0.0) > mono:
                continue
            self._next_scan[t] = mono + RESCAN_S
            for path, opener, key in find_libraries(t, self.proc):
                self._proc_lib[t] = key
                if key not in self.libraries:
                    fresh.setdefault(key, _Library(key, path, opener))
        for lb in self.libraries.values():            # failed long ago: try again
            if lb.failed_at is not None and mono - lb.failed_at > RETRY_S and not lb.attached:
                fresh.setdefault(lb.key, _Library(lb.key, lb.path, lb.attach_path))
        if fresh:
            self._attach(list(fresh.values()))
        for t in [t for t in want if t in self._proc_lib and t not in self._seeded]:
            self._seed(t)

    def _seed(self, tgid: int) -> None:
        """A process's pinned ranges: complete when it started after its library was attached;
        else what its device-file mappings show."""
        lb = self.libraries.get(self._proc_lib.get(tgid, (-1, -1)))
        if lb is None or not lb.attached:
            return
        self._seeded.add(tgid)
        r = self._ranges_of(tgid, lb.boottime)
        if not r.complete and not r.mapped:
            r.mapped = _device_mappings(self.proc, tgid)

    def _ranges_of(self, tgid: int, attached: float) -> _Ranges:
        """The process's ranges (new ones when the pid now names another process); complete when
        it started after ``attached`` (CLOCK_BOOTTIME of its library's attach)."""
        start = _start_seconds(self.proc, tgid)
        r = self._ranges.get(tgid)
        if r is None or r.started != start:
            r = self._ranges[tgid] = _Ranges(start, start is not None and start >= attached)
        return r

    def _forget(self, tgids: set[int]) -> None:
        for inst in self._instances:
            for k, v in inst.threads.items():
                tid = _U32.unpack_from(k)[0]
                if CU_THREAD.unpack(v)[11] in tgids:
                    inst.threads.delete(k)
                    inst.prev.pop(tid, None)
                    inst.open.pop(tid, None)
        for t in tgids:
            self._next_scan.pop(t, None)
            self._seeded.discard(t)

    # ------------------------------------------------------------------ reading
    def read(self) -> dict[int, ApiTime]:
        """Per thread that called the driver since the last read (the driving threads)."""
        if not self._instances:
            self._last = self.clock_ns()
            return {}
        out = self._safely("read", self._read)
        return out if isinstance(out, dict) else {}

    def _read(self) -> dict[int, ApiTime]:
        now = self.clock_ns()
        out: dict[int, ApiTime] = {}
        launch_on = any(lb.launch for lb in self.libraries.values())
        for inst in self._instances:
            self._drain(inst, out)
            self._threads(inst, out, now)
        for t in out.values():
            if launch_on and t.launches is None:
                t.launches = 0
            r = self._ranges.get(t.tgid)
            t.pinned_ranges_complete = r is not None and r.complete
        self._reads += 1
        if self._reads % 60 == 0:
            self._prune()
        self._last = now
        return {tid: t for tid, t in out.items() if t.driving}

    def _thread(self, out: dict[int, ApiTime], tid: int, tgid: int) -> ApiTime:
        t = out.get(tid)
        if t is None:
            t = out[tid] = ApiTime(tid, tgid)
        return t

    def _drain(self, inst: _Instance, out: dict[int, ApiTime]) -> None:
        """Ring-buffer events in order: pinned ranges kept, copies classified against them."""
        for raw in inst.ring.drain():
            if len(raw) < CU_EVENT.size:
                continue
            _start, ns, src, dst, nbytes, tgid, tid, kind, _sym = CU_EVENT.unpack_from(raw)
            if kind >= PIN_ALLOC:
                lb = self.libraries.get(self._proc_lib.get(tgid, (-1, -1)))
                r = self._ranges_of(tgid, lb.boottime if lb else max(x.boottime for x in inst.libs))
                if kind in (PIN_ALLOC, PIN_REGISTER):
                    r.add(src, nbytes)
                else:
                    r.remove(src)
                continue
            if tgid not in self.tracked:
                continue
            t = self._thread(out, tid, tgid)
            known = self._ranges.get(tgid)
            pinned = known is not None and src in known
            sec = ns / 1e9
            if pinned:
                t.h2d_pinned_seconds += sec
                t.h2d_pinned_bytes += nbytes
                t.h2d_pinned_calls += 1
            elif kind == H2D:
                t.h2d_pageable_seconds += sec
                t.h2d_pageable_bytes += nbytes
                t.h2d_pageable_calls += 1
            else:
                t.unified_seconds += sec
                t.unified_bytes += nbytes
                t.unified_calls += 1
        raw_lost = inst.counters.lookup(_U32.pack(0))
        lost = struct.unpack_from("<Q", raw_lost)[0] if raw_lost else 0
        if lost > inst.pin_lost:                # a pinned range may be missing: nobody's ranges are complete
            inst.pin_lost = lost
            for r in self._ranges.values():
                r.complete = False

    def _threads(self, inst: _Instance, out: dict[int, ApiTime], now: int) -> None:
        """Cumulative per-thread totals, less the last read's; syncs still in progress counted as
        they go (what was counted while open is taken off the call's total when it returns)."""
        open_syncs: dict[int, tuple[int, int]] = {}
        for k, v in inst.inflight.items():       # read before the totals: a call returning in between
            since, _a, _b, _n, kind, _sym, depth, tgid, _tr, _p = CU_CALL.unpack(v)   # shows in both
            if kind == SYNC and depth and tgid in self.tracked:
                open_syncs[_U32.unpack_from(k)[0]] = (since, tgid)
        for k, v in inst.threads.items():
            tid = _U32.unpack_from(k)[0]
            cur = CU_THREAD.unpack(v)
            tgid = cur[11]
            if tgid not in self.tracked:
                continue
            prev = inst.prev.get(tid)
            if prev is None or prev[11] != tgid or cur[0] < prev[0]:
                prev = (0,) * 11 + (tgid, 0)     # new, evicted and back, or a reused thread id
            inst.prev[tid] = cur
            if cur == prev:
                if not os.path.exists(f"{self.proc}/{tgid}/task/{tid}"):
                    inst.threads.delete(k)       # the thread is gone and everything it did was read
                    inst.prev.pop(tid, None)
                if tid not in open_syncs:
                    continue
            d = [c - p for c, p in zip(cur[:11], prev[:11], strict=True)]
            t = self._thread(out, tid, tgid)
            t.calls += d[0]
            sync_ns = d[1]
            o = inst.open.get(tid)
            if o is not None and cur[3] >= o[0]:  # the call counted while open has returned
                sync_ns = max(0, sync_ns - o[1])
                del inst.open[tid]
            t.sync_seconds += sync_ns / 1e9
            t.sync_calls += d[2]
            t.d2h_seconds += d[4] / 1e9
            t.d2h_bytes += d[5]
            t.d2h_calls += d[6]
            if d[7]:
                t.launches = (t.launches or 0) + d[7]
            t.h2d_unclassified_seconds += d[8] / 1e9
            t.h2d_unclassified_bytes += d[9]
            t.h2d_unclassified_calls += d[10]
        self._open_syncs(inst, out, now, open_syncs)

    def _open_syncs(self, inst: _Instance, out: dict[int, ApiTime], now: int,
                    open_syncs: dict[int, tuple[int, int]]) -> None:
        """The part of each sync still in progress since the last read (or its start)."""
        for tid, (since, tgid) in open_syncs.items():
            o = inst.open.get(tid)
            if o is not None and o[0] != since:
                del inst.open[tid]
                o = None
            cur_t = inst.prev.get(tid)
            if cur_t is not None and cur_t[3] >= since:
                continue                          # returned between the two reads: in the totals
            part = max(0, now - max(since, self._last))
            if o is None:
                o = inst.open[tid] = [since, 0]
            o[1] += part
            t = self._thread(out, tid, tgid)
            t.sync_seconds += part / 1e9
            t.sync_open = True

    def symbol_calls(self) -> dict[str, int]:
        """Calls per probed entry point by tracked processes since attach (nested calls included)."""
        totals: dict[str, int] = {}
        for inst in self._instances:
            with contextlib.suppress(BpfError, OSError):
                for k, v in inst.sym_calls.items():
                    n = sum_u64_percpu(inst.sym_calls, v, 1)[0]
                    name = SYMBOL_BY_ID.get(_U32.unpack_from(k)[0], ("?", 0))[0]
                    if n and name != "?":
                        totals[name] = totals.get(name, 0) + n
        return totals

    def _prune(self) -> None:
        for tgid in [t for t in self._ranges if t not in self.tracked]:
            if not os.path.exists(f"{self.proc}/{tgid}"):
                del self._ranges[tgid]
                self._proc_lib.pop(tgid, None)

    # ------------------------------------------------------------------ doctor
    def status(self) -> list[tuple[str, bool, str, str]]:
        """(probe, ok, reason, hint) rows for ``triscope doctor``: the probes as a whole, each
        library (which entry points attached, which it does not export), the launch probe."""
        rows: list[tuple[str, bool, str, str]] = []
        attached = [lb for lb in self.libraries.values() if lb.attached]
        if not self.enabled or self.fatal or not attached:
            why = self.reason if not self.fatal else self.fatal
            rows.append(("cuda_uprobes", False, why, self.hint))
        else:
            rows.append(("cuda_uprobes", True, f"attached to {len(attached)} driver "
                         f"librar{'y' if len(attached) == 1 else 'ies'}; {len(self.tracked)} processes tracked", ""))
        for lb in self.libraries.values():
            by_kind: dict[str, list[str]] = {}
            for sym in lb.attached:
                by_kind.setdefault(KIND_NAME.get(SYMBOL_KIND[sym], "pinned"), []).append(sym)
            text = "; ".join(f"{k}: {', '.join(v)}" for k, v in by_kind.items()) or lb.reason
            if lb.past_endbr64:
                text += f" ({len(lb.past_endbr64)} probed just past their endbr64)"
            if lb.missing:
                text += f" (not exported: {', '.join(lb.missing)})"
            if lb.failed:
                text += " (failed: " + "; ".join(f"{s}: {e[:120]}" for s, e in lb.failed.items()) + ")"
            rows.append((f"cuda_uprobes:{lb.path}", bool(lb.attached), text, lb.hint))
        launch = sorted({s for lb in self.libraries.values() for s in lb.launch})
        cost = (f"~{LAUNCH_PROBE_NS:.0f} ns a launch, {LAUNCH_PROBE_NS * 1e4 / 1e9 * 100:.1f} % of a core at 10,000/s "
                "where the probed instruction is emulated, ~10x where it is single-stepped")
        if launch:
            rows.append(("cuda_launch", True, f"on ({', '.join(launch)}): {cost} (bench_cuda_uprobes)", ""))
        else:
            why = "switched on, no library attached yet" if self.launch_probe else "off by default"
            rows.append(("cuda_launch", False, f"{why}: {cost} (bench_cuda_uprobes)",
                         "" if self.launch_probe else "launch_probe=True counts every kernel launch"))
        return rows

    def close(self) -> None:
        for inst in self._instances:
            inst.close()
        self._instances.clear()
        for lb in self.libraries.values():
            lb.attached.clear()
            lb.launch.clear()
            lb.reason = "closed"
        self.reason = "closed"


def _start_seconds(proc: str, pid: int) -> float | None:
    """A process's start, seconds since boot (CLOCK_BOOTTIME), rounded down to a clock tick."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _device_mappings(proc: str, pid: int) -> list[tuple[int, int]]:
    """Address ranges a process maps from the NVIDIA device files: memory the driver allocated."""
    out = []
    with contextlib.suppress(OSError), open(f"{proc}/{pid}/maps") as f:
        for ln in f:
            parts = ln.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/dev/nvidia"):
                a, b = parts[0].split("-")
                out.append((int(a, 16), int(b, 16)))
    return out
