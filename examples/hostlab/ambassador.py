"""An ambassador sidecar: the model container talks to localhost, the sidecar holds the upstream connections.

    python -m examples.hostlab.ambassador --name lab-b-mesh --listen 47851 --upstream 127.0.0.1:47813

The shape of a pod whose outbound traffic goes through a proxy container (a service mesh's sidecar,
a connection-pooling ambassador): the application connects to ``127.0.0.1:--listen``; for each of
its connections the sidecar opens one to ``--upstream`` and copies bytes both ways, a thread each
way, until either side closes.  Plain TCP, no parsing.  Prints ``ready`` once it listens.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import threading

from .backend import set_comm


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def relay(client: socket.socket, upstream: tuple[str, int]) -> None:
    try:
        up = socket.create_connection(upstream, timeout=30)
        up.settimeout(None)
    except OSError:
        client.close()
        return
    back = threading.Thread(target=pump, args=(up, client), daemon=True)
    back.start()
    pump(client, up)
    back.join()
    client.close()
    up.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--listen", type=int, required=True, help="the loopback port the application connects to")
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the upstream service")
    args = ap.parse_args(argv)
    set_comm(args.name)
    host, _, port = args.upstream.rpartition(":")
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", args.listen))
    lst.listen(128)
    print("ready", flush=True)
    while True:
        client, _ = lst.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=relay, args=(client, (host, int(port))), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
