"""Loopback: whether a listen address is loopback (one answer for every part that refuses a
non-loopback bind without authentication), and real TCP retransmits on loopback, without root
tricks (tests, benchmarks, demos).

A listener with a backlog of 0 that never accepts: once its queue is full the kernel drops new
SYNs, and the connecting sockets retransmit them (1 s, 3 s, 7 s ... after the first try).
``/proc/net/snmp`` ``Tcp: RetransSegs`` moves by the same amount.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

LOOPBACK_NAMES = frozenset(("localhost", "ip6-localhost", "ip6-loopback"))


def is_loopback(host: str) -> bool:
    """True for a loopback listen address: ``127.0.0.0/8``, ``::1`` (also bracketed, ``[::1]``, or
    with a zone), an IPv4-mapped loopback (``::ffff:127.0.0.1``) and the names Debian's
    ``/etc/hosts`` gives loopback (``localhost``, ``ip6-localhost``, ``ip6-loopback``; any case, a
    trailing dot).  ``0.0.0.0`` / ``::`` (every address) and any other name are not: a name is not
    resolved, since what it resolves to may change after the check."""
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if h.lower().rstrip(".") in LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def read_retranssegs(proc: str = "/proc") -> int:
    with open(f"{proc}/net/snmp") as f:
        lines = [line.split() for line in f if line.startswith("Tcp:")]
    header, values = lines[0], lines[1]
    return int(values[header.index("RetransSegs")])


@contextmanager
def syn_retransmits(connections: int = 8, host: str = "127.0.0.1") -> Iterator[tuple[str, int]]:
    """Open a never-accepting listener and ``connections`` non-blocking connects to it.

    Yields the listener's (host, port): the peer that retransmits are aimed at.  SYN retransmits
    keep coming (exponential backoff) until the context exits and the sockets are closed.
    """

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    clients: list[socket.socket] = []
    try:
        for _ in range(connections):
            c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            c.setblocking(False)
            with suppress(BlockingIOError):
                c.connect((host, port))
            clients.append(c)
        yield host, port
    finally:
        for c in clients:
            c.close()
        listener.close()


if __name__ == "__main__":  # quick manual check: python -m triscope.web.loopback
    before = read_retranssegs()
    with syn_retransmits(8):
        time.sleep(4)
    print("RetransSegs delta:", read_retranssegs() - before)
