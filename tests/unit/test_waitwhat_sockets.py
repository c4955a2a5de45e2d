"""The wait-for chain's socket index (``waitwhat.SocketIndex``): a socket a thread waits on is read
from the socket itself through its holder; a whole-table TCP dump (costly on a node of many
connections) is only for a TCP socket that cannot be read so, never for a UNIX one."""

from __future__ import annotations

import os
import socket

import pytest

from triscope.agent.workloads.sockdiag import tcp_counters
from triscope.agent.workloads.waitwhat import NOT_TCP, SocketIndex, key_of_fd

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pidfd_getfd needs root")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _index(clock: Clock) -> tuple[SocketIndex, list[int]]:
    dumps: list[int] = []

    def dump(**kw: object) -> object:
        dumps.append(1)
        return tcp_counters(**kw)  # type: ignore[arg-type]

    return SocketIndex(dict, dump=dump, clock=clock), dumps


def test_a_unix_socket_never_costs_a_whole_table_dump() -> None:
    clock = Clock()
    idx, dumps = _index(clock)
    a, b = socket.socketpair()
    try:
        ino = os.fstat(a.fileno()).st_ino
        assert key_of_fd(os.getpid(), a.fileno()) is NOT_TCP
        for _ in range(3):                       # three reads 11 s apart (a dump may come every 10 s)
            assert idx.get(ino, holder=(os.getpid(), a.fileno())) is None
            clock.t += 11.0
        assert dumps == []
    finally:
        a.close()
        b.close()


def test_a_tcp_socket_read_from_its_holder_and_one_without_a_holder_dumped() -> None:
    clock = Clock()
    idx, dumps = _index(clock)
    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    acc, _ = srv.accept()
    try:
        ino = os.fstat(cli.fileno()).st_ino
        s = idx.get(ino, holder=(os.getpid(), cli.fileno()))
        assert s is not None and s.remote.endswith(str(srv.getsockname()[1])) and dumps == []
        other = os.fstat(acc.fileno()).st_ino
        assert idx.get(other) is not None        # no holder: the table is read
        assert dumps == [1]
    finally:
        for x in (cli, acc, srv):
            x.close()
