"""TCP sockets' own counters, per socket, from the kernel's sock_diag netlink interface.

``tcp_counters()`` asks ``NETLINK_SOCK_DIAG`` for every TCP socket of the caller's network namespace
(IPv4 and IPv6, every state a process can hold: ``DUMP_STATES``) with ``INET_DIAG_INFO``, and returns, per socket inode, the two
``struct tcp_info`` counters the verdict reads: ``tcpi_total_retrans`` (segments this socket
retransmitted over its life) and ``tcpi_segs_out`` (segments it sent).  This is what ``ss -ti``
prints as ``retrans:x/<total>`` and ``segs_out``.  It needs no kprobe, no BPF and no privilege
beyond the namespace: a socket's owner is joined in user space from ``/proc/PID/fd``
(``socket_inodes``).  A dump asks only for what can carry counters (``DUMP_STATES``).
``TIME_WAIT`` sockets have no inode and no process holds them, yet a host that opens a connection per
request keeps thousands: the kernel would write each out and the agent parse it at every dump.
Listeners send no data to lose.  Sockets bound but never connected (``TCP_BOUND_INACTIVE``, 6.8+)
make the kernel walk its whole bind table as well, and they come back without ``tcp_info``
(``python -m bench --only workloads``, "workloads tcp").  Request sockets still come back:
the kernel adds them whenever ``SYN_RECV`` is asked for, which a Fast Open socket a process
accepted can be in.  They have no inode and are skipped.

``netns_tcp_totals(proc, pid)`` reads a network namespace's own totals (``/proc/PID/net/snmp``,
``Tcp: RetransSegs OutSegs``): the route for a process in a namespace of its own (a pod's), where
the namespace's sockets are its pod's.

Loss on the way **in** (a service downloading its inputs: the sender retransmits, not the
workload) shows as ``tcpi_rcv_ooopack``, packets that arrived after a gap, over
``tcpi_data_segs_in``.

Offsets of ``struct tcp_info`` (include/uapi/linux/tcp.h): ``tcpi_total_retrans`` at byte 100
(since 2.6), ``tcpi_segs_out`` at 136 (since 4.2), ``tcpi_data_segs_in`` at 152 (4.6),
``tcpi_rcv_ooopack`` at 224 (5.4); a shorter answer (an older kernel) gives 0 for what it lacks.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Container, Mapping

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
TCPDIAG_GETSOCK = 18                         # inet_diag's first request type: TCP, every family in one dump
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
INET_DIAG_INFO = 2
_NLMSG = struct.Struct("=IHHII")            # len, type, flags, seq, pid
_REQ = struct.Struct("=BBBxI48x")            # family, protocol, ext, pad, states, inet_diag_sockid (zeros)
_REQ_COMPAT = struct.Struct("=BBBB48xII")    # inet_diag_req: family, src_len, dst_len, ext, sockid, states, dbs
_SOCKID = 48                                 # struct inet_diag_sockid: ports, addresses, interface, cookie
_MSG_INODE = 4 + _SOCKID + 16                # inet_diag_msg: family..retrans, id, expires, rqueue, wqueue, uid
_REQ_EXACT = struct.Struct("=BBBxI")         # family, protocol, ext, pad, states; the sockid follows
LOOKUP_BATCH = 32                            # exact requests sent before their answers are read (~1.3 KB each)
LOOKUP_RCVBUF = 1 << 20                      # asked for on the lookup socket (the kernel caps it at rmem_max)
TCP_TIME_WAIT = 6
TCP_LISTEN = 10
TCP_NEW_SYN_RECV = 12
TCP_BOUND_INACTIVE = 13                      # kernel 6.8+: bound, neither connected nor listening
ALL_STATES = 0xFFFFFFFF
DUMP_STATES = ALL_STATES & ~((1 << TCP_TIME_WAIT) | (1 << TCP_LISTEN) | (1 << TCP_NEW_SYN_RECV)
                             | (1 << TCP_BOUND_INACTIVE))
"""The states a dump asks for (inet_diag's ``idiag_states``, a bit per state).  Left out:
``TIME_WAIT`` (no inode), ``LISTEN`` (no key, no data sent) and ``BOUND_INACTIVE`` (a walk of the
bind table for sockets without ``tcp_info``).  ``NEW_SYN_RECV`` is cleared too, but the kernel adds it
back with ``SYN_RECV``.  Kept: every state a connected socket a process holds can be in.  A
connection that ends in ``TIME_WAIT`` leaves its socket in ``CLOSE``, which is kept."""
_RTA = struct.Struct("=HH")
TOTAL_RETRANS_AT = 100
SEGS_OUT_AT = 136
DATA_SEGS_IN_AT = 152      # tcpi_data_segs_in (4.6)
RCV_OOOPACK_AT = 224       # tcpi_rcv_ooopack (5.4): packets that arrived out of order (a gap before them)
MAX_ANSWER = 64 << 20                        # a dump larger than this is cut (a host with millions of sockets)
_COUNTERS = struct.Struct(f"={TOTAL_RETRANS_AT}xI{SEGS_OUT_AT - TOTAL_RETRANS_AT - 4}xI"
                          f"{DATA_SEGS_IN_AT - SEGS_OUT_AT - 4}xI{RCV_OOOPACK_AT - DATA_SEGS_IN_AT - 4}xI")
"""The four counters of a ``tcp_info`` long enough to hold them all (5.4+), in one unpack."""
_INODE = struct.Struct("=I")


class SockDiagError(OSError):
    """sock_diag cannot be asked here (no netlink, a kernel without inet_diag)."""


def _request(family: int, seq: int, states: int = DUMP_STATES) -> bytes:
    body = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), states)
    return _NLMSG.pack(_NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def _request_both(seq: int, states: int = DUMP_STATES) -> bytes:
    """inet_diag's original request (``TCPDIAG_GETSOCK``): the kernel answers it for every address family
    (``AF_UNSPEC``) in **one** walk of the TCP hash tables.  Each walk visits every bucket of the
    established table, empty or not (262,144 here with 24 GiB, more on larger hosts): ~1 ms of the
    agent's CPU whatever the number of sockets, so two walks (one per family) cost twice that."""
    body = _REQ_COMPAT.pack(0, 0, 0, 1 << (INET_DIAG_INFO - 1), states, 0)
    return _NLMSG.pack(_NLMSG.size + len(body), TCPDIAG_GETSOCK, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


Counters = tuple[int, int, int, int]
"""(total_retrans, segs_out, rcv_ooopack, data_segs_in) of one socket (the last two 0 before 5.4)."""


SockKey = tuple[int, bytes]     # (address family, the socket's inet_diag_sockid as the kernel gave it)


def _message(data: bytes, off: int, length: int) -> tuple[int, SockKey | None, Counters | None]:
    """One ``inet_diag_msg`` at ``off``: (inode, its exact-lookup key, its counters or None).  A
    listener gets no key: under ``SO_REUSEPORT`` the lookup by its addresses finds a sibling of its
    group and the cookie check refuses it, and a listener sends no data to lose."""
    body = off + _NLMSG.size
    (inode,) = _INODE.unpack_from(data, body + _MSG_INODE)
    key = None if data[body + 1] == TCP_LISTEN else (data[body], bytes(data[body + 4:body + 4 + _SOCKID]))
    return inode, key, _info(data, body + _MSG_INODE + 4, off + length) if inode else None


def _info(data: bytes, a: int, end: int) -> Counters | None:
    """The counters of the ``INET_DIAG_INFO`` attribute among those from ``a`` to ``end``."""
    while a + _RTA.size <= end:
        alen, atype = _RTA.unpack_from(data, a)
        if alen < _RTA.size:
            return None
        if atype == INET_DIAG_INFO:
            info = a + _RTA.size
            size = alen - _RTA.size
            if size >= RCV_OOOPACK_AT + 4:
                retrans, segs, data_in, ooo = _COUNTERS.unpack_from(data, info)
                return retrans, segs, ooo, data_in
            if size < SEGS_OUT_AT + 4:
                return None
            (retrans,) = struct.unpack_from("=I", data, info + TOTAL_RETRANS_AT)
            (segs,) = struct.unpack_from("=I", data, info + SEGS_OUT_AT)
            return retrans, segs, 0, 0
        a += (alen + 3) & ~3
    return None


def parse_dump(data: bytes, out: dict[int, Counters], keys: dict[int, SockKey] | None = None,
               wanted: Container[int] | None = None, table: set[int] | None = None) -> bool:
    """Parse one buffer of a sock_diag answer into ``out`` (inode -> ``Counters``) and, when given,
    ``keys`` (inode -> the key ``tcp_lookup`` asks for it by); True once the dump's end
    (``NLMSG_DONE``) is in it.  ``wanted``: only these inodes are parsed past their inode (the rest
    of the table is stepped over); ``table``: filled with every inode in the answer.  Raises
    ``SockDiagError`` on an error answer."""
    off, n = 0, len(data)
    unpack = _NLMSG.unpack_from
    while off + _NLMSG.size <= n:
        length, mtype, _flags, _seq, _pid = unpack(data, off)
        if length < _NLMSG.size or off + length > n:
            return True         # malformed: stop here rather than loop
        if mtype == NLMSG_DONE:
            # a dump that failed says so here (a negative errno after the header), not in NLMSG_ERROR
            if length >= _NLMSG.size + 4:
                (err,) = struct.unpack_from("=i", data, off + _NLMSG.size)
                if err < 0:
                    raise SockDiagError(-err, os.strerror(-err))
            return True
        if mtype == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, off + _NLMSG.size)
            if err:
                raise SockDiagError(-err, os.strerror(-err))
            return True
        if mtype in (SOCK_DIAG_BY_FAMILY, TCPDIAG_GETSOCK) and length >= _NLMSG.size + _MSG_INODE + 4:
            if wanted is not None or table is not None:
                ino = _INODE.unpack_from(data, off + _NLMSG.size + _MSG_INODE)[0]
                if table is not None:
                    table.add(ino)
                if wanted is not None and ino not in wanted:
                    off += (length + 3) & ~3
                    continue
            inode, key, c = _message(data, off, length)
            if inode and c is not None:
                out[inode] = c
                if keys is not None and key is not None:
                    keys[inode] = key
        off += (length + 3) & ~3
    return False


def _dump(s: socket.socket, request: bytes, out: dict[int, Counters], keys: dict[int, SockKey] | None,
          wanted: Container[int] | None = None, table: set[int] | None = None) -> None:
    s.send(request)
    got = 0
    while True:
        data = s.recv(1 << 16)
        got += len(data)
        if not data or parse_dump(data, out, keys, wanted, table) or got > MAX_ANSWER:
            break


def _netlink() -> socket.socket:
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
    except OSError as e:
        raise SockDiagError(e.errno or 0, f"no sock_diag netlink socket: {e.strerror or e}") from None
    s.settimeout(2.0)
    return s


def tcp_counters(families: tuple[int, ...] = (socket.AF_INET, socket.AF_INET6),
                 keys: dict[int, SockKey] | None = None, states: int = DUMP_STATES,
                 wanted: Container[int] | None = None, table: set[int] | None = None) -> dict[int, Counters]:
    """Every TCP socket of this network namespace with an inode, in ``states`` (a bit per
    ``TCP_*`` state): inode -> ``Counters`` (and, into ``keys``, what ``tcp_lookup`` asks for each by).
    ``wanted``: only those sockets (the table is still walked whole: the kernel has no filter by
    inode); ``table``: filled with the inode of every socket in the answer.

    Both families in one dump (``TCPDIAG_GETSOCK``) where the kernel answers it; one dump per family
    (``SOCK_DIAG_BY_FAMILY``) where it refuses that request, or when ``families`` is not both."""
    out: dict[int, Counters] = {}
    with contextlib.closing(_netlink()) as s:
        if set(families) == {socket.AF_INET, socket.AF_INET6}:
            try:
                _dump(s, _request_both(1, states), out, keys, wanted, table)
                return out
            except SockDiagError:
                out.clear()         # a kernel without the old request: one dump per family below
                if keys is not None:
                    keys.clear()
                if table is not None:
                    table.clear()
        for seq, fam in enumerate(families, 2):
            _dump(s, _request(fam, seq, states), out, keys, wanted, table)
    return out


def listening_ports(inodes: set[int] | None = None) -> set[int]:
    """The TCP ports some socket of this network namespace listens on (one dump of the ``LISTEN``
    state only): the server's side of a connection is the one whose local port is among them.
    ``inodes``: filled with the listening sockets' inodes."""
    out: set[int] = set()
    with contextlib.closing(_netlink()) as s:
        s.send(_request_both(1, 1 << TCP_LISTEN))
        got = 0
        while got < MAX_ANSWER:
            data = s.recv(1 << 16)
            if not data:
                break
            got += len(data)
            off, done = 0, False
            while off + _NLMSG.size <= len(data):
                length, mtype, _f, _s, _p = _NLMSG.unpack_from(data, off)
                if length < _NLMSG.size or off + length > len(data) or mtype in (NLMSG_DONE, NLMSG_ERROR):
                    done = True
                    break
                if mtype in (SOCK_DIAG_BY_FAMILY, TCPDIAG_GETSOCK) and length >= _NLMSG.size + _MSG_INODE + 4:
                    out.add(struct.unpack_from(">H", data, off + _NLMSG.size + 4)[0])
                    if inodes is not None:
                        inodes.add(struct.unpack_from("=I", data, off + _NLMSG.size + _MSG_INODE)[0])
                off += (length + 3) & ~3
            if done:
                break
    return out


def tcp_lookup(keys: Mapping[int, SockKey], keys_out: dict[int, SockKey] | None = None) -> dict[int, Counters]:
    """The counters of the sockets named by ``keys`` (inode -> key from ``tcp_counters``), each asked
    for on its own (sock_diag's exact request: a hash lookup by its addresses and ports, checked
    against its cookie), so the cost is the sockets asked for, not the size of the host's tables.
    A socket that closed (or whose addresses a new one reuses) is not in the answer.  Raises
    ``OSError`` when the answers cannot be read (a receive buffer too small: ``ENOBUFS``).
    ``keys_out``: filled with each answering socket's key (its inode may not be the one asked by:
    a lookup of a connection's other end by its addresses, ``waitwhat.peer_key``)."""
    out: dict[int, Counters] = {}
    items = list(keys.items())
    ext = 1 << (INET_DIAG_INFO - 1)
    with contextlib.closing(_netlink()) as s:
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, LOOKUP_RCVBUF)
        for start in range(0, len(items), LOOKUP_BATCH):
            batch = items[start:start + LOOKUP_BATCH]
            for seq, (_ino, (family, sockid)) in enumerate(batch, start + 1):
                body = _REQ_EXACT.pack(family, socket.IPPROTO_TCP, ext, 0xFFFFFFFF) + sockid
                s.send(_NLMSG.pack(_NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, 0) + body)
            answered = 0
            while answered < len(batch):
                data = s.recv(1 << 16)
                if not data:
                    break
                off = 0
                while off + _NLMSG.size <= len(data):
                    length, mtype, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
                    if length < _NLMSG.size or off + length > len(data):
                        break
                    answered += 1            # an answer or an error (ENOENT, ESTALE: closed or reused)
                    if mtype == SOCK_DIAG_BY_FAMILY and length >= _NLMSG.size + _MSG_INODE + 4:
                        inode, key, c = _message(data, off, length)
                        if inode and c is not None:
                            out[inode] = c
                            if keys_out is not None and key is not None:
                                keys_out[inode] = key
                    off += (length + 3) & ~3
    return out


def socket_inodes(proc: str, pid: int) -> set[int] | None:
    """The socket inodes a process holds (``/proc/PID/fd`` links ``socket:[N]``); None when it is gone.
    Each link is read relative to the open directory (no path walk per descriptor: 15 % less CPU
    for a process of 10,000 sockets)."""
    try:
        fd = os.open(f"{proc}/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    out: set[int] = set()
    readlink = os.readlink
    try:
        for name in os.listdir(fd):
            try:
                link = readlink(name, dir_fd=fd)
            except OSError:
                continue
            if link[:8] == "socket:[":
                with contextlib.suppress(ValueError):
                    out.add(int(link[8:-1]))
    except OSError:
        return None
    finally:
        os.close(fd)
    return out


def netns_id(proc: str, pid: int) -> int | None:
    """The inode of a process's network namespace (``/proc/PID/ns/net``); None when unreadable."""
    try:
        return os.stat(f"{proc}/{pid}/ns/net").st_ino
    except OSError:
        return None


def _named(text: str, prefix: str) -> dict[str, str]:
    rows = [ln.split() for ln in text.splitlines() if ln.startswith(prefix)]
    return dict(zip(rows[0][1:], rows[1][1:], strict=False)) if len(rows) >= 2 else {}


def netns_tcp_totals(proc: str, pid: int) -> Counters | None:
    """(RetransSegs, OutSegs, TCPOFOQueue, InSegs) of the network namespace ``pid`` runs in
    (``/proc/PID/net/snmp`` and ``netstat``): a pod's own sockets, out-of-order arrivals included."""
    try:
        with open(f"{proc}/{pid}/net/snmp", "rb") as f:
            text = f.read(16384).decode("ascii", "replace")
    except OSError:
        return None
    named = _named(text, "Tcp:")
    try:
        rtx, out = int(named["RetransSegs"]), int(named["OutSegs"])
        segs_in = int(named.get("InSegs", 0))
    except (KeyError, ValueError):
        return None
    ofo = 0
    try:
        with open(f"{proc}/{pid}/net/netstat", "rb") as f:
            ofo = int(_named(f.read(65536).decode("ascii", "replace"), "TcpExt:").get("TCPOFOQueue", 0))
    except (OSError, ValueError):
        pass
    return rtx, out, ofo, segs_in
