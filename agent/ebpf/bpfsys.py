"""A tiny ``bpf()`` syscall layer (ctypes): read maps handed over by the loader child.

The long-lived agent never imports bcc (which would keep LLVM in memory); it holds the map and
attachment file descriptors and reads with ``BPF_MAP_LOOKUP_BATCH`` (one syscall per map per tick)
or, where the kernel has no batch ops for the map type, ``BPF_MAP_GET_NEXT_KEY`` +
``BPF_MAP_LOOKUP_ELEM``.  ``RingBuffer`` consumes a ``BPF_MAP_TYPE_RINGBUF`` through its mmap'd
pages, without syscalls.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import platform
import struct
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_NR_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}

BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_LOOKUP_BATCH = 24
BPF_MAP_LOOKUP_AND_DELETE_BATCH = 25
BPF_ANY = 0
BPF_NOEXIST = 1

MAP_TYPE_HASH = 1
MAP_TYPE_ARRAY = 2
MAP_TYPE_PERCPU_HASH = 5
MAP_TYPE_PERCPU_ARRAY = 6
MAP_TYPE_LRU_HASH = 9
MAP_TYPE_LRU_PERCPU_HASH = 10
MAP_TYPE_RINGBUF = 27
BPF_F_MMAPABLE = 1 << 10
PERCPU_TYPES = {MAP_TYPE_PERCPU_HASH, MAP_TYPE_PERCPU_ARRAY, MAP_TYPE_LRU_PERCPU_HASH}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(OSError):
    pass


class _MapElemAttr(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("key", ctypes.c_uint64),
                ("value", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class _BatchAttr(ctypes.Structure):
    _fields_ = [("in_batch", ctypes.c_uint64), ("out_batch", ctypes.c_uint64), ("keys", ctypes.c_uint64),
                ("values", ctypes.c_uint64), ("count", ctypes.c_uint32), ("map_fd", ctypes.c_uint32),
                ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


def _nr() -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise BpfError(errno.ENOSYS, f"bpf(): unknown syscall number on {platform.machine()}")
    return nr


_NR = _NR_BPF.get(platform.machine(), -1)


def bpf(cmd: int, attr: ctypes.Structure) -> int:
    """Call ``bpf(cmd, &attr, sizeof attr)``; raise ``BpfError`` with errno on failure."""

    nr = _NR if _NR >= 0 else _nr()
    ret = _libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        e = ctypes.get_errno()
        raise BpfError(e, f"bpf(cmd={cmd}): {os.strerror(e)}")
    return int(ret)


def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> int:
    """Number of possible CPUs: the stride of per-CPU map values (not os.cpu_count())."""

    with open(path) as f:
        text = f.read().strip()
    n = 0
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            n = max(n, int(b) + 1)
        elif part:
            n = max(n, int(part) + 1)
    return n


class MapInfo:
    __slots__ = ("type", "id", "key_size", "value_size", "max_entries", "flags", "name")

    def __init__(self, raw: bytes) -> None:
        (self.type, self.id, self.key_size, self.value_size, self.max_entries,
         self.flags) = struct.unpack_from("<6I", raw, 0)
        self.name = raw[24:40].split(b"\0", 1)[0].decode(errors="replace")


def map_info(fd: int) -> MapInfo:
    buf = ctypes.create_string_buffer(88)
    attr = _InfoAttr(bpf_fd=fd, info_len=88, info=ctypes.addressof(buf))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return MapInfo(buf.raw)


class BpfMap:
    """A map held by fd.  Values come back as raw bytes; per-CPU values as a list per CPU."""

    BATCH_CHUNK = 256

    def __init__(self, fd: int, ncpus: int | None = None) -> None:
        self.fd = fd
        info = map_info(fd)
        self.info = info
        self.type = info.type
        self.key_size = info.key_size
        self.value_size = info.value_size
        self.max_entries = info.max_entries
        self.percpu = info.type in PERCPU_TYPES
        self.ncpus = (ncpus or possible_cpus()) if self.percpu else 1
        self.stride = (info.value_size + 7) & ~7 if self.percpu else info.value_size
        self.value_total = self.stride * self.ncpus
        self._batch_ok: bool | None = None
        self._drain_ok: bool | None = None
        self._bufs: tuple[int, Any, Any, Any, Any] | None = None   # batch buffers, kept between reads
        self._kbuf = ctypes.create_string_buffer(max(self.key_size, 1))
        self._vbuf = ctypes.create_string_buffer(max(self.value_total, 1))
        self.syscalls = 0

    # --- single elements
    def lookup(self, key: bytes) -> bytes | None:
        kb = ctypes.create_string_buffer(key, self.key_size)
        attr = _MapElemAttr(map_fd=self.fd, key=ctypes.addressof(kb), value=ctypes.addressof(self._vbuf))
        self.syscalls += 1
        try:
            bpf(BPF_MAP_LOOKUP_ELEM, attr)
        except BpfError as e:
            if e.errno == errno.ENOENT:
                return None
            raise
        return self._vbuf.raw[: self.value_total]

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> bool:
        """Write one element; False when ``BPF_NOEXIST`` found it there already (EEXIST)."""
        kb = ctypes.create_string_buffer(key, self.key_size)
        vb = ctypes.create_string_buffer(value, self.value_total)
        attr = _MapElemAttr(map_fd=self.fd, key=ctypes.addressof(kb), value=ctypes.addressof(vb), flags=flags)
        self.syscalls += 1
        try:
            bpf(BPF_MAP_UPDATE_ELEM, attr)
        except BpfError as e:
            if e.errno == errno.EEXIST:
                return False
            raise
        return True

    def delete(self, key: bytes) -> bool:
        """Remove one element; False when it was not there."""
        kb = ctypes.create_string_buffer(key, self.key_size)
        attr = _MapElemAttr(map_fd=self.fd, key=ctypes.addressof(kb))
        self.syscalls += 1
        try:
            bpf(BPF_MAP_DELETE_ELEM, attr)
        except BpfError as e:
            if e.errno == errno.ENOENT:
                return False
            raise
        return True

    def drain(self) -> list[tuple[bytes, bytes]]:
        """Every (key, value), each removed as it is read (``BPF_MAP_LOOKUP_AND_DELETE_BATCH``, hash
        maps, Linux 5.6+; else key by key).  A program adding to an element the moment it is taken
        can lose that one addition."""
        got = self._drain_batch(self._batch)
        if got is not None:
            return got
        out = []
        for k in list(self.keys()):
            v = self.lookup(k)
            if v is not None and self.delete(k):
                out.append((k, v))
        return out

    def keys(self) -> Iterator[bytes]:
        nxt = ctypes.create_string_buffer(self.key_size)
        cur: ctypes.Array[ctypes.c_char] | None = None
        while True:
            attr = _MapElemAttr(map_fd=self.fd, key=ctypes.addressof(cur) if cur is not None else 0,
                                value=ctypes.addressof(nxt))
            self.syscalls += 1
            try:
                bpf(BPF_MAP_GET_NEXT_KEY, attr)
            except BpfError as e:
                if e.errno == errno.ENOENT:
                    return
                raise
            k = nxt.raw[: self.key_size]
            yield k
            cur = ctypes.create_string_buffer(k, self.key_size)

    # --- whole map
    def items(self) -> list[tuple[bytes, bytes]]:
        """All (key, value) pairs: one LOOKUP_BATCH call per chunk, else key-by-key."""

        if self._batch_ok is not False:
            try:
                out = self._items_batch()
                self._batch_ok = True
                return out
            except BpfError as e:
                if self._batch_ok is None and e.errno in (errno.EINVAL, errno.ENOTSUP, 524, errno.EPERM):
                    self._batch_ok = False
                else:
                    raise
        out = []
        for k in list(self.keys()):
            v = self.lookup(k)
            if v is not None:
                out.append((k, v))
        return out

    def _items_batch(self) -> list[tuple[bytes, bytes]]:
        return self._batch(BPF_MAP_LOOKUP_BATCH)

    def _batch(self, cmd: int) -> list[tuple[bytes, bytes]]:
        kr, vr, got = self._batch_raw(cmd)
        ks, vs = self.key_size, self.value_total
        return [(kr[i * ks:(i + 1) * ks], vr[i * vs:(i + 1) * vs]) for i in range(got)]

    def _drain_batch(self, batch: Callable[[int], T]) -> T | None:
        """``batch(BPF_MAP_LOOKUP_AND_DELETE_BATCH)``, or None where the kernel lacks the batch op
        (learnt at the first try and remembered: the caller then drains key by key)."""
        if self._drain_ok is False:
            return None
        try:
            out = batch(BPF_MAP_LOOKUP_AND_DELETE_BATCH)
        except BpfError as e:
            if self._drain_ok is None and e.errno in (errno.EINVAL, errno.ENOTSUP, 524, errno.EPERM):
                self._drain_ok = False
                return None
            raise
        self._drain_ok = True
        return out

    def items_raw(self) -> tuple[bytes, bytes, int]:
        """Every element as two buffers, keys and values back to back, and how many: one batch read
        (``BPF_MAP_LOOKUP_BATCH``), for a reader that unpacks them at once (``struct.iter_unpack``)."""
        return self._batch_raw(BPF_MAP_LOOKUP_BATCH)

    def drain_raw(self) -> tuple[bytes, bytes, int]:
        """``drain`` as two buffers (``items_raw``); falls back to ``drain`` on kernels without the batch op."""
        got = self._drain_batch(self._batch_raw)
        if got is not None:
            return got
        pairs = self.drain()
        return b"".join(k for k, _ in pairs), b"".join(v for _, v in pairs), len(pairs)

    def _batch_raw(self, cmd: int) -> tuple[bytes, bytes, int]:
        """Keys and values of every element (``cmd``: lookup or lookup-and-delete batch), read in
        chunks into buffers kept for the next call."""
        n = min(self.BATCH_CHUNK, max(self.max_entries, 1))
        ks, vs = self.key_size, self.value_total
        if self._bufs is None or self._bufs[0] < n:
            self._bufs = (n, ctypes.create_string_buffer(n * ks), ctypes.create_string_buffer(n * vs),
                          ctypes.create_string_buffer(max(ks, 8)), ctypes.create_string_buffer(max(ks, 8)))
        _n, keys, vals, token_in, token_out = self._bufs
        kparts: list[bytes] = []
        vparts: list[bytes] = []
        total = 0
        first = True
        while True:
            attr = _BatchAttr(in_batch=0 if first else ctypes.addressof(token_in),
                              out_batch=ctypes.addressof(token_out), keys=ctypes.addressof(keys),
                              values=ctypes.addressof(vals), count=n, map_fd=self.fd)
            done = False
            self.syscalls += 1
            try:
                bpf(cmd, attr)
            except BpfError as e:
                if e.errno == errno.ENOENT:
                    done = True
                elif e.errno == errno.ENOSPC and n < self.max_entries:  # a hash bucket larger than n
                    n = min(n * 4, self.max_entries)
                    self._bufs = (n, ctypes.create_string_buffer(n * ks), ctypes.create_string_buffer(n * vs),
                                  token_in, token_out)
                    _n, keys, vals, token_in, token_out = self._bufs
                    continue
                else:
                    raise
            got = attr.count
            if got:
                kparts.append(ctypes.string_at(keys, got * ks))
                vparts.append(ctypes.string_at(vals, got * vs))
                total += got
            if done or got == 0:
                break
            if got < n and self.type in (MAP_TYPE_ARRAY, MAP_TYPE_PERCPU_ARRAY):
                break   # arrays fill every request until their end
            ctypes.memmove(token_in, token_out, max(ks, 8))
            first = False
        return b"".join(kparts), b"".join(vparts), total

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def sum_u64_percpu(m: BpfMap, value: bytes, fields: int) -> tuple[int, ...]:
    """Sum ``fields`` u64 fields of a per-CPU value over all CPUs."""

    fmt = f"<{fields}Q"
    totals = [0] * fields
    for i in range(m.ncpus):
        vals = struct.unpack_from(fmt, value, i * m.stride)
        for j in range(fields):
            totals[j] += vals[j]
    return tuple(totals)


class Counters:
    """The program's ``counters``, summed over CPUs: ``read()`` -> one total per slot.

    Two layouts, told apart by the map itself:

    - a plain array with ``BPF_F_MMAPABLE``, one row of ``slots`` u64 per possible CPU: mapped
      into this process once, then read as memory (no syscall, no ctypes per tick; one
      ``BPF_MAP_LOOKUP_BATCH`` per read where the mapping is refused);
    - a per-CPU array of ``slots`` u64 (kernels before 5.5): one ``BPF_MAP_LOOKUP_BATCH`` per read.
    """

    def __init__(self, fd: int, slots: int, ncpus: int | None = None) -> None:
        self.map = BpfMap(fd, ncpus)
        self.slots = slots
        info = self.map.info
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        self.rows = info.type == MAP_TYPE_ARRAY
        if self.rows:
            if info.value_size != 8 * slots:
                raise BpfError(errno.EINVAL, f"counters rows are {info.value_size} bytes, expected {8 * slots}")
            size = info.value_size * info.max_entries
            length = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
            if info.flags & BPF_F_MMAPABLE:
                try:
                    self._mm = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ)
                    self._view = memoryview(self._mm)[:size].cast("Q")
                except OSError:   # e.g. refused by a security module: read the rows with a syscall
                    self._mm = None
        elif not (info.type == MAP_TYPE_PERCPU_ARRAY and info.value_size == 8):
            raise BpfError(errno.EINVAL, f"counters map of type {info.type} is neither layout")

    @property
    def mapped(self) -> bool:
        return self._view is not None

    def read(self) -> list[int]:
        v = self._view
        if v is not None:
            n = self.slots
            return [sum(v[i::n]) for i in range(n)]
        totals = [0] * self.slots
        if self.rows:
            fmt = f"<{self.slots}Q"
            for _k, val in self.map.items():
                for i, x in enumerate(struct.unpack_from(fmt, val)):
                    totals[i] += x
            return totals
        for k, val in self.map.items():
            idx = struct.unpack("<I", k)[0]
            if idx < self.slots:
                totals[idx] = sum_u64_percpu(self.map, val, 1)[0]
        return totals

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self.map.close()


class RingBuffer:
    """Consumer side of a BPF ring buffer map, through its mmap'd pages (no syscalls per read)."""

    BUSY = 1 << 31
    DISCARD = 1 << 30
    HDR = 8

    def __init__(self, fd: int, size: int | None = None) -> None:
        self.fd = fd
        if size is None:
            size = map_info(fd).max_entries
        self.size = size
        self.mask = size - 1
        self.page = mmap.PAGESIZE
        self._cons = mmap.mmap(fd, self.page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._prod = mmap.mmap(fd, self.page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=self.page)

    def drain(self, limit: int = 100_000) -> list[bytes]:
        """Every committed record not read yet (up to ``limit``); advances the consumer position."""

        out: list[bytes] = []
        cons = struct.unpack_from("<Q", self._cons, 0)[0]
        prod = struct.unpack_from("<Q", self._prod, 0)[0]
        while cons < prod and len(out) < limit:
            off = self.page + (cons & self.mask)
            length = struct.unpack_from("<I", self._prod, off)[0]
            if length & self.BUSY:
                break
            size = length & ~(self.BUSY | self.DISCARD)
            if not length & self.DISCARD:
                # the data area is mapped twice back to back, so a record that wraps reads straight
                out.append(bytes(self._prod[off + self.HDR: off + self.HDR + size]))
            cons += (size + self.HDR + 7) & ~7
            struct.pack_into("<Q", self._cons, 0, cons)
        return out

    def close(self) -> None:
        for m in (self._cons, self._prod):
            with contextlib.suppress(BufferError, ValueError):
                m.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
