"""A preprocessing sidecar: decodes JPEGs into batches for the GPU container of its pod.

    python -m examples.hostlab.feeder --name lab-b-prep --transport unix --socket /run/feed/feed.sock --batch 16 --image 640
    python -m examples.hostlab.feeder --name lab-b-prep --transport tcp --port 47830 --batch 8 --image 800

The shape of a pod with a decode sidecar (a container of its own, its own CPU limit) in front of a
GPU container (``fed_service.py``).  The sidecar decodes ``--image`` pixel JPEGs with PIL, resizes
them to 224x224 and hands the GPU container uint8 batches of ``--batch``, as fast as it can and as
far ahead as the consumer lets it:

* ``unix``: a ring of ``--slots`` batches in POSIX shared memory (``multiprocessing.shared_memory``),
  announced one line per batch over a Unix stream socket (``batch <slot> <seq>``); the consumer
  answers ``done <slot>`` when it has copied a slot to the GPU, and the sidecar waits for a free slot.
* ``tcp``: the batch's bytes over a loopback TCP connection, a 16-byte header (``!IIQ``: images, bytes,
  sequence) before each; TCP's own window is the flow control.

One consumer at a time; the sidecar names itself ``--name`` and prints ``ready`` once it listens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import struct
import sys
from typing import Any

from .backend import IMAGE, decode, jpegs, set_comm

HEADER = struct.Struct("!IIQ")


def fill(out: Any, images: list[bytes], seq: int) -> None:
    """Batch ``seq``: ``len(out)`` images decoded into ``out`` (uint8, N x 224 x 224 x 3)."""
    n = len(out)
    for k in range(n):
        out[k] = decode(images[(seq * n + k) % len(images)])


def serve_unix(args: argparse.Namespace, images: list[bytes]) -> None:
    from multiprocessing import shared_memory

    import numpy as np

    shape = (args.batch, IMAGE, IMAGE, 3)
    slot_bytes = int(np.prod(shape))
    shm = shared_memory.SharedMemory(create=True, size=slot_bytes * args.slots, name=f"lab-feed-{os.getpid()}")
    ring = np.ndarray((args.slots, *shape), dtype=np.uint8, buffer=shm.buf)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.socket)
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(args.socket)
    lst.listen(1)
    os.chmod(args.socket, 0o666)
    print("ready", flush=True)
    try:
        while True:
            conn, _ = lst.accept()
            with conn:
                hello = {"shm": shm.name, "slots": args.slots, "shape": list(shape)}
                conn.sendall((json.dumps(hello) + "\n").encode())
                free = list(range(args.slots))
                reader = conn.makefile("rb")
                seq = 0
                try:
                    while True:
                        while not free:                       # every slot with the consumer: wait for one
                            line = reader.readline()
                            if not line:
                                raise ConnectionError("consumer gone")
                            free.append(int(line.split()[1]))
                        slot = free.pop(0)
                        fill(ring[slot], images, seq)
                        conn.sendall(f"batch {slot} {seq}\n".encode())
                        seq += 1
                except (ConnectionError, OSError):
                    pass
    finally:
        del ring
        shm.close()
        shm.unlink()


def serve_tcp(args: argparse.Namespace, images: list[bytes]) -> None:
    import numpy as np

    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", args.port))
    lst.listen(1)
    print("ready", flush=True)
    out = np.empty((args.batch, IMAGE, IMAGE, 3), dtype=np.uint8)
    while True:
        conn, _ = lst.accept()
        with conn:
            seq = 0
            try:
                while True:
                    fill(out, images, seq)
                    conn.sendall(HEADER.pack(args.batch, out.nbytes, seq))
                    conn.sendall(out.data)
                    seq += 1
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--transport", choices=("unix", "tcp"), default="unix")
    ap.add_argument("--socket", default="/tmp/lab-feed.sock", help="unix: the socket the consumer connects to")
    ap.add_argument("--port", type=int, default=47830, help="tcp: the loopback port")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--image", type=int, default=640, help="side of the JPEGs decoded")
    ap.add_argument("--slots", type=int, default=4, help="unix: batches in the shared-memory ring")
    args = ap.parse_args(argv)
    set_comm(args.name)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))     # the shared memory unlinked on the way out
    images = jpegs(args.image)
    if args.transport == "unix":
        serve_unix(args, images)
    else:
        serve_tcp(args, images)
    return 0


if __name__ == "__main__":
    sys.exit(main())
