"""A TCP forwarder between a client and a real server, opened and closed by a test (a database
outage the client sees as the network would show it).  Subclasses decide what ``_relay`` does with
a connection (``tests/integration/test_store_silent_peer.py`` cuts one before its answer)."""

from __future__ import annotations

import contextlib
import socket
import threading


class Forwarder:
    """127.0.0.1:<port> -> the real server, while open."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.lst: socket.socket | None = None

    def open(self) -> None:
        lst = socket.socket()
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", self.port))
        lst.listen(16)
        self.lst = lst
        threading.Thread(target=self._accept, args=(lst,), daemon=True).start()

    def _accept(self, lst: socket.socket) -> None:
        while True:
            try:
                c, _ = lst.accept()
            except OSError:
                return
            self._relay(c, socket.create_connection(self.target))

    def _relay(self, c: socket.socket, u: socket.socket) -> None:
        """Copy both ways between the client ``c`` and the server ``u`` (a subclass may do otherwise)."""
        for a, b in ((c, u), (u, c)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self.lst is not None:
            self.lst.close()
            self.lst = None
