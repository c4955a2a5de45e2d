"""Keep the agent's hot memory on transparent huge pages: fewer pages touched per tick.

A tick runs for a few milliseconds once a second, and most of that time is not computation but
first touches: the interpreter's code and the Python heap are spread over a few hundred 4 KiB
pages, each reached through its own TLB entry, and on a VM each page is also reached through
the host's (EPT) page tables.  Where the host ages guest memory, a page left alone for a second
is expensive to touch again: measured on this project's CI VMs, 2.5-9 µs per 4 KiB page after a
1 s pause (growing with the pause, also when the vCPU stays busy), 0.5 µs per page inside a
2 MiB huge page (``bench/bench_ebpf.py``, row ``agent memory``, prints both).  Three steps move the
agent's working set onto 2 MiB pages:

- ``advise_heap()``: ``madvise(MADV_HUGEPAGE)`` on the densely used 2 MiB ranges of the
  anonymous read-write mappings (the C heap and the interpreter's object arenas: at least 3/4 of
  their pages resident, so a sparse mapping such as a thread stack does not grow to whole huge
  pages) and, on kernels from 6.1, ``MADV_COLLAPSE`` to move them onto huge pages now instead of
  waiting for khugepaged.  Works with the system's THP mode ``madvise`` (Debian's default) and
  ``always``; does nothing with ``never``.
- ``remap_text()``: the interpreter's machine code (the ``python3.11`` executable or
  ``libpython``) is file-backed, and Debian kernels cannot put file pages of an executable on
  huge pages (no ``CONFIG_READ_ONLY_THP_FOR_FS``).  It is copied into anonymous huge pages and
  swapped in place with one ``mremap`` at the same addresses, with the same bytes: the technique
  of libhugetlbfs' ``HUGETLB_ELFMAP`` and Chromium's text remapping.  Only whole 2 MiB-aligned
  pages inside the object's read-only span are moved; they become read+execute as one mapping
  (a huge page has one protection), so the ELF header and part of the read-only data in those
  pages become executable.  It runs only while the process has a single thread.
- ``reexec_for_heap()``: CPython's own allocator (pymalloc) keeps small objects in 1 MiB arenas,
  each its own ``mmap`` at an address no 2 MiB page covers, so they stay on 4 KiB pages (about
  half of the pages a tick touched).  ``triscope agent`` starts itself again, once, in the same
  process (``execve``: same PID; the name ``ps`` shows is set back) with ``PYTHONMALLOC=malloc``
  and ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1``: every object then lives
  in glibc's one heap, which glibc grows in huge-page steps and marks ``MADV_HUGEPAGE``.  Skipped
  when the operator set ``PYTHONMALLOC`` or a ``glibc.malloc`` tunable, before glibc 2.35, off
  glibc, under ``python -E``/``-I``, and when ``triscope.cli.main()`` runs inside another program.

Costs: the moved code (4 MiB for Debian's ``python3.11``) becomes private memory of the process
(charged to its cgroup, kept without swap, written to core dumps) while the file's page-cache
copy stays; the agent's RSS grew by 1-2 MB, as the file pages it replaces were resident too.  The
heap grows by at most the unused quarter of the ranges it collapses.  The moved code shows as an
anonymous mapping in ``/proc/PID/maps``, so ``perf`` and ``gdb`` cannot name the interpreter's C
functions in it, and uprobes on the interpreter no longer fire in the agent (Python-level tools
are not affected).  ``triscope agent --no-huge-pages`` turns all three steps off.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import platform
import sys
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25          # Linux 6.1+
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
MAP_FAILED = ctypes.c_void_p(-1).value
PR_SET_NAME = 15

THP_DIR = "/sys/kernel/mm/transparent_hugepage"
PAGE = os.sysconf("SC_PAGE_SIZE")
DENSE = 0.75   # a 2 MiB range is advised when at least this share of its pages is resident


@dataclass
class Mapping:
    start: int
    end: int
    perms: str
    path: str


def read_maps(path: str = "/proc/self/maps") -> list[Mapping]:
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, _, hi = parts[0].partition("-")
            out.append(Mapping(int(lo, 16), int(hi, 16), parts[1], parts[5].strip() if len(parts) > 5 else ""))
    return out


def thp_mode(thp_dir: str = THP_DIR) -> str:
    """The system's THP mode (``always``, ``madvise``, ``never``), or ``unavailable``."""
    try:
        with open(os.path.join(thp_dir, "enabled")) as f:
            text = f.read()
    except OSError:
        return "unavailable"
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return "unavailable"


def huge_page_size(thp_dir: str = THP_DIR) -> int:
    try:
        with open(os.path.join(thp_dir, "hpage_pmd_size")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 << 20


def aligned_span(start: int, end: int, huge: int) -> tuple[int, int] | None:
    """The whole huge pages inside [start, end), or None."""
    lo = (start + huge - 1) // huge * huge
    hi = end // huge * huge
    return (lo, hi) if hi > lo else None


def text_span(maps: list[Mapping], address: int) -> tuple[Mapping, int, int] | None:
    """The contiguous non-writable mapped span of the file that holds ``address`` (its ELF header,
    code and read-only data): (the code mapping, span start, span end)."""
    hit = next((m for m in maps if m.start <= address < m.end and m.path.startswith("/")), None)
    if hit is None or "x" not in hit.perms:
        return None
    same = [m for m in maps if m.path == hit.path]
    i = same.index(hit)
    lo, hi = hit.start, hit.end
    def readonly(m: Mapping) -> bool:       # readable, not writable (not a ---p guard hole)
        return m.perms[0] == "r" and "w" not in m.perms

    for m in reversed(same[:i]):            # mappings of the same file right below, read-only
        if m.end != lo or not readonly(m):
            break
        lo = m.start
    for m in same[i + 1:]:                  # and right above
        if m.start != hi or not readonly(m):
            break
        hi = m.end
    return hit, lo, hi


class _Libc:
    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.madvise = libc.madvise
        self.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.mmap = libc.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        self.munmap = libc.munmap
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.mprotect = libc.mprotect
        self.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.mremap = libc.mremap
        self.mremap.restype = ctypes.c_void_p
        self.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        self.mincore = libc.mincore
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]

    def resident_pages(self, start: int, length: int) -> int:
        """How many base pages of [start, start + length) are resident (mincore)."""
        n = length // PAGE
        vec = ctypes.create_string_buffer(n)
        if self.mincore(start, length, vec) != 0:
            return 0
        return sum(b & 1 for b in vec.raw)


def _supported() -> str | None:
    """Why huge pages cannot be used here, or None."""
    if platform.system() != "Linux":
        return "not Linux"
    mode = thp_mode()
    if mode in ("never", "unavailable"):
        return f"transparent huge pages are {mode} on this host ({THP_DIR}/enabled)"
    return None


@dataclass
class HeapResult:
    advised: int = 0      # bytes of whole huge pages in the advised mappings
    collapsed: int = 0    # of which moved onto huge pages now (MADV_COLLAPSE)
    note: str = ""


def advise_heap(maps: list[Mapping] | None = None) -> HeapResult:
    """``MADV_HUGEPAGE`` (+ ``MADV_COLLAPSE``) on the dense huge-page ranges of the anonymous
    read-write mappings."""
    why = _supported()
    if why:
        return HeapResult(note=why)
    libc = _Libc()
    huge = huge_page_size()
    need = int(huge // PAGE * DENSE)
    ranges: list[list[int]] = []
    for m in maps if maps is not None else read_maps():
        if m.perms != "rw-p" or (m.path and m.path != "[heap]"):
            continue
        span = aligned_span(m.start, m.end, huge)
        if span is None:
            continue
        for chunk in range(span[0], span[1], huge):
            if libc.resident_pages(chunk, huge) < need:
                continue
            if ranges and ranges[-1][1] == chunk:
                ranges[-1][1] = chunk + huge
            else:
                ranges.append([chunk, chunk + huge])
    res = HeapResult()
    collapse_ok = True
    for lo, hi in ranges:
        if libc.madvise(lo, hi - lo, MADV_HUGEPAGE) != 0:
            continue
        res.advised += hi - lo
        if not collapse_ok:
            continue
        if libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            res.collapsed += hi - lo
        elif ctypes.get_errno() == 22 and not res.collapsed:   # EINVAL at once: a kernel before 6.1
            collapse_ok = False
            res.note = "no MADV_COLLAPSE in this kernel: khugepaged moves them in the background"
    return res


def anon_huge_bytes(start: int, end: int, smaps: str = "/proc/self/smaps") -> int:
    """AnonHugePages of the mappings inside [start, end): what is really on huge pages."""
    total, inside = 0, False
    with open(smaps) as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                lo, _, hi = head.partition("-")
                inside = start <= int(lo, 16) and int(hi, 16) <= end
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1]) * 1024
    return total


@dataclass
class TextResult:
    path: str = ""
    moved: int = 0        # bytes of code now in an anonymous mapping
    huge: int = 0         # of which on huge pages (the rest: 4 KiB pages, when none were free)
    note: str = ""


def _os_threads() -> int:
    """Threads of this process as the kernel sees them (also those Python did not start)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _interpreter_address() -> int:
    fn = ctypes.pythonapi._PyEval_EvalFrameDefault
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def remap_text() -> TextResult:
    """Move the interpreter's code onto anonymous huge pages at the same addresses."""
    why = _supported()
    if why:
        return TextResult(note=why)
    if threading.active_count() != 1 or _os_threads() != 1:
        return TextResult(note="not single-threaded: code is only moved before the agent starts its threads")
    maps = read_maps()
    found = text_span(maps, _interpreter_address())
    if found is None:
        return TextResult(note="interpreter code not found in a file mapping")
    code, lo, hi = found
    huge = huge_page_size()
    span = aligned_span(lo, hi, huge)
    if span is None:
        return TextResult(code.path, note=f"{code.path}: no whole {huge >> 20} MiB page in its read-only span")
    start, end = span
    n = end - start
    libc = _Libc()
    raw = libc.mmap(None, n + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if raw in (None, MAP_FAILED):
        return TextResult(code.path, note=f"staging mmap failed: {os.strerror(ctypes.get_errno())}")
    stage = (raw + huge - 1) // huge * huge
    moved = False
    try:
        libc.madvise(stage, n, MADV_HUGEPAGE)
        ctypes.memmove(stage, start, n)
        if ctypes.string_at(stage, n) != ctypes.string_at(start, n):
            return TextResult(code.path, note="copy differs from the original: left in place")
        if libc.mprotect(stage, n, PROT_READ | PROT_EXEC) != 0:
            return TextResult(code.path, note=f"mprotect failed: {os.strerror(ctypes.get_errno())}")
        got = libc.mremap(stage, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, start)
        if got != start:
            return TextResult(code.path, note=f"mremap failed: {os.strerror(ctypes.get_errno())}")
        moved = True
    finally:
        # the staging area's unused head and tail (and all of it when nothing moved)
        if not moved:
            libc.munmap(raw, n + huge)
        else:
            if stage > raw:
                libc.munmap(raw, stage - raw)
            if raw + n + huge > stage + n:
                libc.munmap(stage + n, raw + n + huge - (stage + n))
    return TextResult(code.path, n, anon_huge_bytes(start, end))


HEAP_MALLOC = "malloc"
HEAP_TUNABLES = "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1"
HEAP_ENV = {"PYTHONMALLOC": HEAP_MALLOC, "GLIBC_TUNABLES": HEAP_TUNABLES}
REEXEC_MARK = "TRISCOPE_HEAP_REEXEC"   # set across the execv; removed again once the new image runs
GLIBC_HUGETLB = (2, 35)                # the first glibc with the glibc.malloc.hugetlb tunable


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library this process runs on when it is glibc, else None."""
    try:
        name, _, ver = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")   # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        return None
    if name != "glibc":
        return None
    try:
        major, minor = (int(x) for x in ver.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def heap_reexec_blocker(environ: os._Environ[str] | dict[str, str] | None = None) -> str | None:
    """Why the agent does not start itself again with the compact heap, or None."""
    env = os.environ if environ is None else environ
    if env.get(REEXEC_MARK):
        return "already started with the compact heap"
    if "PYTHONMALLOC" in env:
        return "PYTHONMALLOC already set by the operator: left as it is"
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES already sets glibc.malloc tunables: left as it is"
    why = _supported()
    if why:
        return why
    ver = glibc_version()
    if ver is None:
        return "not glibc: its malloc tunables are what put the heap on huge pages"
    if ver < GLIBC_HUGETLB:
        return f"glibc {ver[0]}.{ver[1]} has no glibc.malloc.hugetlb tunable (2.35 and later)"
    if sys.flags.ignore_environment:
        return "python runs with -E/-I: PYTHONMALLOC would be ignored"
    if not sys.executable or not getattr(sys, "orig_argv", None):
        return "cannot tell how this interpreter was started"
    return None


def reexec_for_heap() -> str:
    """Start this program again in the same process with every Python object on glibc's heap,
    which sits on huge pages (module docstring).  Returns (with the reason) only when it does not."""
    why = heap_reexec_blocker()
    if why:
        return why
    try:   # the name ps/pgrep show ("triscope", from the script): execve of the interpreter would say "python"
        with open("/proc/self/comm") as f:
            comm = f.read().strip()
    except OSError:
        comm = ""
    tunables = os.environ.get("GLIBC_TUNABLES")   # the operator's own (none of glibc.malloc): kept, ours appended
    mark = json.dumps({"comm": comm, "tunables": tunables})
    env = dict(os.environ, PYTHONMALLOC=HEAP_MALLOC, **{REEXEC_MARK: mark},
               GLIBC_TUNABLES=f"{tunables}:{HEAP_TUNABLES}" if tunables else HEAP_TUNABLES)
    for stream in (sys.stdout, sys.stderr):   # None when the agent was started with the descriptor closed
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError as e:
        return f"execve {sys.executable}: {e.strerror or e}"
    return "unreachable"   # pragma: no cover - execve does not return on success


def after_heap_reexec() -> bool:
    """In the restarted image: True when it runs with the compact heap.  The variables are set
    back to the operator's (PYTHONMALLOC removed, GLIBC_TUNABLES as it was), so the programs the
    agent starts (the probe loader, npu-smi) see the operator's environment."""
    raw = os.environ.pop(REEXEC_MARK, None)
    if not raw:
        return False
    try:
        mark = json.loads(raw)
    except ValueError:
        mark = {}
    os.environ.pop("PYTHONMALLOC", None)
    tunables = mark.get("tunables") if isinstance(mark, dict) else None
    if tunables:
        os.environ["GLIBC_TUNABLES"] = tunables
    else:
        os.environ.pop("GLIBC_TUNABLES", None)
    comm = mark.get("comm") if isinstance(mark, dict) else None
    if comm:
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_NAME, ctypes.c_char_p(comm.encode()[:15]), 0, 0, 0)
    return True


def describe(text: TextResult | None, heap: HeapResult | None) -> str:
    parts = []
    if text is not None:
        parts.append(f"interpreter code of {os.path.basename(text.path)}: {text.moved >> 20} MiB moved, "
                     f"{text.huge >> 20} MiB on huge pages" if text.moved
                     else f"interpreter code not moved: {text.note}")
    if heap is not None:
        parts.append(f"heap {heap.advised >> 20} MiB advised, {heap.collapsed >> 20} MiB collapsed"
                     + (f" ({heap.note})" if heap.note else ""))
    return "huge pages: " + "; ".join(parts)
