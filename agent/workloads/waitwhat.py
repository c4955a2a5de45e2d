"""What a wait was on: the descriptor a thread blocked in, the interrupt that ended it, the process
that did — named for people, cheaply, off the kernel's numbers.

* ``FdIndex``: ``(pid, fd)`` -> what the descriptor is (``/proc/PID/fd/N``: a socket and its inode,
  a pipe, an eventfd, an epoll set and its members, the accelerator's device node, a file),
  remembered for ``ttl`` seconds (a descriptor number is reused after a close).
* ``SocketIndex``: a TCP socket's addresses, from the keys the per-workload TCP reader already holds
  (sock_diag), whether it is the server's side of its connection (an inbound request) or the
  client's (an upstream), and, for a loopback connection, which process holds its other end (a
  feeder in another container speaking TCP to 127.0.0.1 is a producer, not the network).
* ``Irqs``: a hardware IRQ's name (``/proc/irq/N/<action>``): the accelerator's driver, a NIC, a disk.
* ``Procs``: a process's comm, cgroup and workload labels (the agent's own attribution), cached.

Every lookup degrades to "not known" and never raises: a process gone, a descriptor closed, a
file unreadable.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from triscope.agent.workloads.attribution import PodDir, ProcessInfo, Workload, attribute, read_process

# x86_64 syscall numbers (what waitfor.bpf.c records); the sleep family and futexes by number
SLEEP_SYSCALLS = frozenset({34, 35, 230})                 # pause, nanosleep, clock_nanosleep
FUTEX_SYSCALLS = frozenset({202, 449})                    # futex, futex_waitv
ACCEPT_SYSCALLS = frozenset({43, 288})                    # accept, accept4
CHILD_SYSCALLS = frozenset({61, 247})                     # wait4, waitid
IO_SYSCALLS = frozenset({74, 75, 208, 209, 426})          # fsync, fdatasync, io_getevents, io_submit, io_uring_enter
SELECT_SYSCALLS = frozenset({23, 270})                    # select, pselect6: their descriptors are not read
ACCEL_DEVICES = ("/dev/nvidia", "/dev/davinci", "/dev/devmm_svm", "/dev/hisi_hdc", "/dev/accel/", "/dev/dri/")
ACCEL_IRQ_NAMES = ("nvidia", "davinci", "ascend", "amdgpu")
DISK_IRQ_NAMES = ("nvme", "virtio-blk", "virtio_blk", "ahci", "megasas", "mpt3sas", "scsi")


@dataclass(frozen=True, slots=True)
class Fd:
    """What one descriptor is.  ``kind``: socket, pipe, eventfd, epoll, accel, file, timerfd,
    signalfd, other, gone."""

    kind: str
    inode: int = 0
    target: str = ""
    members: tuple[int, ...] = ()      # an epoll set: the descriptors it watches


@dataclass(frozen=True, slots=True)
class Sock:
    """A TCP socket: its addresses (``ip:port``), the server's side or the client's, loopback."""

    inode: int
    local: str
    remote: str
    inbound: bool         # the server's side: what arrives on it is a request
    loopback: bool
    key: tuple[int, bytes] | None = None      # the per-workload TCP reader's lookup key


class FdIndex:
    def __init__(self, proc: str = "/proc", ttl: float = 15.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[tuple[int, int], tuple[Fd, float]] = {}

    def get(self, pid: int, fd: int) -> Fd:
        if fd < 0:
            return Fd("other")
        now = self.clock()
        hit = self._cache.get((pid, fd))
        if hit is not None and now - hit[1] < self.ttl:
            return hit[0]
        got = self._read(pid, fd)
        if len(self._cache) > 8192:
            self._cache.clear()
        self._cache[(pid, fd)] = (got, now)
        return got

    def _read(self, pid: int, fd: int) -> Fd:
        try:
            link = os.readlink(f"{self.proc}/{pid}/fd/{fd}")
        except OSError:
            return Fd("gone")
        if link.startswith("socket:["):
            return Fd("socket", _inode(link))
        if link.startswith("pipe:["):
            return Fd("pipe", _inode(link))
        if link.startswith("anon_inode:"):
            what = link[len("anon_inode:"):].strip("[]")
            if what == "eventpoll":
                return Fd("epoll", 0, link, self._epoll_members(pid, fd))
            if what in ("eventfd", "timerfd", "signalfd"):
                return Fd(what, 0, link)
            return Fd("other", 0, link)
        if link.startswith(ACCEL_DEVICES):
            return Fd("accel", 0, link)
        if link.startswith("/"):
            return Fd("file", 0, link)
        return Fd("other", 0, link)

    def _epoll_members(self, pid: int, fd: int) -> tuple[int, ...]:
        """The descriptors an epoll set watches (``tfd:`` lines of its fdinfo), at most 64."""
        out: list[int] = []
        with contextlib.suppress(OSError, ValueError), open(f"{self.proc}/{pid}/fdinfo/{fd}", "rb") as f:
            for ln in f.read(1 << 16).split(b"\n"):
                if ln.startswith(b"tfd:"):
                    out.append(int(ln.split()[1]))
                    if len(out) >= 64:
                        break
        return tuple(out)


def _inode(link: str) -> int:
    try:
        return int(link[link.index("[") + 1:-1])
    except ValueError:
        return 0


def _port_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in open(path).read().split()[:2])  # noqa: SIM115 - read at once
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _addr(family: int, raw: bytes) -> str:
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(raw[:4] if family == 2 else raw[:16]))
    return "?"


def sock_from_key(inode: int, key: tuple[int, bytes], ephemeral: tuple[int, int],
                  listening: set[int] | frozenset[int] = frozenset()) -> Sock:
    """A socket from its sock_diag key (``inet_diag_sockid``: sport, dport big-endian, src, dst).
    The server's side: its local port is one a socket here listens on (``listening``); where that
    says nothing (both or neither), the side without the ephemeral port, else the lower port."""
    family, sockid = key
    sport, dport = struct.unpack_from(">HH", sockid, 0)
    src, dst = _addr(family, sockid[4:20]), _addr(family, sockid[20:36])
    lo, hi = ephemeral
    s_eph, d_eph = lo <= sport <= hi, lo <= dport <= hi
    if (sport in listening) != (dport in listening):
        inbound = sport in listening
    else:
        inbound = (not s_eph and d_eph) or (s_eph == d_eph and sport < dport)
    loop = _is_loopback(dst) or dst == src
    fmt = "[{}]:{}" if family == 10 else "{}:{}"
    return Sock(inode, fmt.format(src, sport), fmt.format(dst, dport), inbound, loop, key)


NOCOOKIE = b"\xff" * 8     # INET_DIAG_NOCOOKIE: an exact lookup that does not check the socket's cookie


def peer_key(key: tuple[int, bytes]) -> tuple[int, bytes]:
    """The sock_diag key of a loopback connection's other end: ports and addresses swapped, no cookie."""
    fam, sid = key
    return fam, sid[2:4] + sid[0:2] + sid[20:36] + sid[4:20] + sid[36:40] + NOCOOKIE


_libc = ctypes.CDLL(None, use_errno=True)
_NR_PIDFD_GETFD = 438


# key_of_fd's answer for a socket that is not TCP (UNIX, UDP, ...): no sock_diag dump of the TCP
# tables can find it
NOT_TCP: tuple[int, bytes] = (-1, b"")


def key_of_fd(pid: int, fd: int) -> tuple[int, bytes] | None:
    """A TCP socket's sock_diag key read from the socket itself: the descriptor duplicated from its
    process (``pidfd_getfd``, Linux 5.6+, root), its own and its peer's address, then closed.  For a
    socket no dump has seen yet (a connection per request).  ``NOT_TCP`` for another kind of socket;
    None when it cannot be read."""
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    try:
        dup = _libc.syscall(_NR_PIDFD_GETFD, pidfd, fd, 0)
        if dup < 0:
            return None
        try:
            s = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            return None
        try:
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                return NOT_TCP
            local, remote = s.getsockname(), s.getpeername()
        except OSError:
            return None
        finally:
            s.close()
    finally:
        os.close(pidfd)
    fam = 2 if s.family == socket.AF_INET else 10
    if fam == 2:
        src, dst = socket.inet_aton(local[0]) + bytes(12), socket.inet_aton(remote[0]) + bytes(12)
    else:
        src, dst = socket.inet_pton(socket.AF_INET6, local[0]), socket.inet_pton(socket.AF_INET6, remote[0])
    return fam, struct.pack(">HH", local[1], remote[1]) + src + dst + bytes(4) + NOCOOKIE


def _is_loopback(a: str) -> bool:
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


class SocketIndex:
    """TCP sockets by inode.  ``keys``: a callable giving the per-workload TCP reader's inode ->
    sock_diag key (``WorkloadTcp._keys``); ``dump``: a whole-table read (``sockdiag.tcp_counters``)
    used, at most every ``dump_every`` seconds, for sockets those keys lack and for the other end
    of loopback connections; ``proc``: where to find which process holds an inode."""

    def __init__(self, keys: Callable[[], Mapping[int, tuple[int, bytes]]], *,
                 dump: Callable[..., object] | None = None, listeners: Callable[..., set[int]] | None = None,
                 lookup: Callable[..., object] | None = None,
                 proc: str = "/proc", dump_every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.keys = keys
        self.dump = dump
        self.listeners = listeners
        self.lookup = lookup
        self._listening: set[int] = set()
        self._listeners: set[int] = set()          # the listening sockets' inodes
        self._not_listener: dict[int, float] = {}  # inodes found not listening, and when (asked again after 30 s)
        self._last_forced = -1e18
        self._next_listen = 0.0
        self.proc = proc
        self.dump_every = dump_every
        self.clock = clock
        self.ephemeral = _port_range()
        self._all: dict[int, tuple[int, bytes]] = {}      # the last whole-table read's keys
        self._by_tuple: dict[tuple[int, bytes], int] = {}  # (family, sport..dst) -> inode
        self._next_dump = 0.0
        self._probed: dict[int, tuple[int, bytes] | None] = {}   # inode -> key read from the socket (NOT_TCP, None: unreadable)
        self._owner: dict[int, tuple[int, float]] = {}     # inode -> (pid, when found)
        self._next_scan = 0.0

    def get(self, inode: int, allow_dump: bool = True, holder: tuple[int, int] | None = None) -> Sock | None:
        """The socket by its inode: from the keys known (the per-workload TCP reader's, the last
        whole-table read's, those read from sockets themselves), else read from the socket through
        ``holder`` (pid, fd) when given, else a whole-table read (at most every ``dump_every`` s)."""
        key = self.keys().get(inode) or self._all.get(inode) or self._probed.get(inode)
        if key is None and holder is not None and inode not in self._probed and not self.is_listener(inode):
            key = key_of_fd(*holder)          # remembered, NOT_TCP (UNIX, UDP, ...) and unreadable too
            if len(self._probed) > 4096:
                self._probed.clear()
            self._probed[inode] = key
        if key is NOT_TCP:
            # no dump of the TCP tables finds a UNIX socket: a whole-table read every 10 s for the
            # sidecar's socket a driving thread waits on was most of the agent's CPU in the host lab
            return None
        if key is None and allow_dump and self._refresh():
            key = self._all.get(inode)
        return None if key is None else sock_from_key(inode, key, self.ephemeral, self._listening_ports())

    def _listening_ports(self) -> set[int]:
        """The ports listened on here, read again at most every ``dump_every`` seconds."""
        now = self.clock()
        if self.listeners is not None and now >= self._next_listen:
            self._next_listen = now + self.dump_every
            inodes: set[int] = set()
            with contextlib.suppress(OSError):
                self._listening = self.listeners(inodes)
                self._listeners = inodes
        return self._listening

    def is_listener(self, inode: int) -> bool:
        """A listening socket: waiting on it is waiting for connections, for requests.  A socket
        not seen before has the listeners read again, at most once a second."""
        self._listening_ports()
        if inode in self._listeners:
            return True
        now = self.clock()
        if now - self._not_listener.get(inode, -1e18) < 30.0 or inode in self.keys():
            return False
        if self.listeners is not None and now - self._last_forced >= 1.0:
            self._last_forced = now
            self._next_listen = 0.0
            self._listening_ports()
        if inode in self._listeners:
            return True
        if len(self._not_listener) > 8192:
            self._not_listener.clear()
        self._not_listener[inode] = now
        return False

    def _refresh(self) -> bool:
        now = self.clock()
        if self.dump is None or now < self._next_dump:
            return False
        self._next_dump = now + self.dump_every
        keys: dict[int, tuple[int, bytes]] = {}
        try:
            self.dump(keys=keys)
        except OSError:
            return False
        self._all = keys
        self._by_tuple = {(k[0], k[1][:36]): ino for ino, k in keys.items()}
        return True

    def peer_owner(self, s: Sock, candidates: Callable[[], list[int]]) -> int | None:
        """The process holding the other end of loopback connection ``s``: its socket found by the
        reversed addresses, its holder among ``candidates()`` first (the processes the agent
        follows), then every process (at most every ``dump_every`` seconds)."""
        if s.key is None:
            return None
        fam, sid = s.key
        rev = (fam, sid[2:4] + sid[0:2] + sid[20:36] + sid[4:20])
        ino = self._by_tuple.get(rev)
        if ino is None and self.lookup is not None:
            # the other end asked for by its addresses (an exact lookup, not the whole table)
            answered: dict[int, tuple[int, bytes]] = {}
            with contextlib.suppress(OSError):
                self.lookup({0: peer_key(s.key)}, answered)
            ino = next(iter(answered), None)
            if ino is not None:
                self._by_tuple[rev] = ino
        if ino is None and self._refresh():
            ino = self._by_tuple.get(rev)
        if ino is None:
            return None
        got = self._owner.get(ino)
        now = self.clock()
        if got is not None and now - got[1] < 60.0:
            return got[0]
        pid = self._find_holder(ino, candidates(), everywhere=now >= self._next_scan)
        if pid is None:
            self._next_scan = now + self.dump_every
            return None
        self._owner[ino] = (pid, now)
        if len(self._owner) > 4096:
            self._owner.clear()
        return pid

    def _find_holder(self, inode: int, first: list[int], everywhere: bool) -> int | None:
        want = f"socket:[{inode}]"
        pids = list(first)
        if everywhere:
            with contextlib.suppress(OSError):
                pids += [int(p) for p in os.listdir(self.proc) if p.isdigit() and int(p) not in set(first)]
        for pid in pids:
            d = f"{self.proc}/{pid}/fd"
            try:
                names = os.listdir(d)
            except OSError:
                continue
            for n in names:
                with contextlib.suppress(OSError):
                    if os.readlink(f"{d}/{n}") == want:
                        return pid
        return None


class Irqs:
    """IRQ number -> its handlers' names (``/proc/irq/N/``: one directory per action)."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._names: dict[int, str] = {}

    def name(self, irq: int) -> str:
        got = self._names.get(irq)
        if got is None:
            try:
                got = ",".join(sorted(n for n in os.listdir(f"{self.proc}/irq/{irq}")
                                      if os.path.isdir(f"{self.proc}/irq/{irq}/{n}")))
            except OSError:
                got = ""
            self._names[irq] = got or f"irq{irq}"
        return got or f"irq{irq}"

    def kind(self, irq: int) -> str:
        """accel, disk or other."""
        n = self.name(irq).lower()
        if any(x in n for x in ACCEL_IRQ_NAMES):
            return "accel"
        if any(x in n for x in DISK_IRQ_NAMES):
            return "disk"
        return "other"


@dataclass(frozen=True, slots=True)
class ProcFacts:
    pid: int
    comm: str
    workload: Workload
    cpu_stat: tuple[str, str] | None       # its cgroup's cpu.stat (path, v1|v2), for throttling
    kernel: bool                            # a kernel thread (no user memory)


class Procs:
    """A process's facts, read once and again every ``ttl`` seconds.  ``pods``: the kubelet's log
    tree as the workloads collector read it (names a pod and container); ``cpu_stat``: a process's
    cgroup -> its cpu.stat (the workloads collector's ``_leader_dirs`` logic, passed in)."""

    def __init__(self, proc: str, pods: Callable[[], Mapping[str, PodDir] | None],
                 cpu_stat: Callable[[ProcessInfo], tuple[str, str] | None], ttl: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc
        self.pods = pods
        self.cpu_stat = cpu_stat
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[int, tuple[ProcFacts | None, float]] = {}
        self._tgid: dict[int, tuple[int, float]] = {}
        self._comm: dict[int, tuple[str, float]] = {}

    def get(self, pid: int) -> ProcFacts | None:
        now = self.clock()
        hit = self._cache.get(pid)
        if hit is not None and now - hit[1] < self.ttl:
            return hit[0]
        info = read_process(self.proc, pid)
        facts = None
        if info is not None:
            kernel = not os.path.exists(f"{self.proc}/{pid}/exe") and _is_kthread(self.proc, pid)
            facts = ProcFacts(pid, info.comm, attribute(info, (), self.pods()), self.cpu_stat(info), kernel)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[pid] = (facts, now)
        return facts

    def tgid(self, tid: int) -> int:
        """The process a thread belongs to (``/proc/TID/status``); 0 when gone."""
        now = self.clock()
        hit = self._tgid.get(tid)
        if hit is not None and now - hit[1] < self.ttl:
            return hit[0]
        tg = 0
        with contextlib.suppress(OSError, ValueError, StopIteration), open(f"{self.proc}/{tid}/status", "rb") as f:
            tg = int(next(ln for ln in f.read(2048).split(b"\n") if ln.startswith(b"Tgid:")).split()[1])
        if len(self._tgid) > 8192:
            self._tgid.clear()
        self._tgid[tid] = (tg, now)
        return tg

    def thread_comm(self, pid: int, tid: int) -> str:
        now = self.clock()
        hit = self._comm.get(tid)
        if hit is not None and now - hit[1] < self.ttl:
            return hit[0]
        name = ""
        with contextlib.suppress(OSError), open(f"{self.proc}/{pid}/task/{tid}/comm", "rb") as f:
            name = f.read(64).decode("utf-8", "replace").strip()
        if len(self._comm) > 8192:
            self._comm.clear()
        self._comm[tid] = (name, now)
        return name


def _is_kthread(proc: str, pid: int) -> bool:
    """A kernel thread: PF_KTHREAD (0x00200000) in the flags field of ``/proc/PID/stat``."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            data = f.read(1024)
        flags = int(data[data.rindex(b")") + 2:].split()[6])
    except (OSError, ValueError, IndexError):
        return False
    return bool(flags & 0x00200000)
