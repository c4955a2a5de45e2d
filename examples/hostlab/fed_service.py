"""The GPU container of a pod whose batches come from a preprocessing sidecar (``feeder.py``).

    python -m examples.hostlab.fed_service --name lab-b --transport unix --socket /run/feed/feed.sock --model mobilenet_v3_large
    python -m examples.hostlab.fed_service --name lab-b --transport tcp --connect 127.0.0.1:47830 --backend sim

Batch inference the ordinary way: connect to the sidecar (retrying until it listens), then for
every batch it announces, run the model on it and go back for the next.  ``unix``: the batch is a
slot of the sidecar's shared-memory ring (attached by the name the sidecar's hello gives), handed
back with ``done <slot>`` once the model has its copy; ``tcp``: the batch's bytes read off the
socket.  The main thread is the one that drives the GPU, and between batches it waits on the
sidecar's socket.  Prints ``ready`` once the model is warm and the sidecar connected; reports
batches per second on stderr every 10 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
from typing import Any

from . import backend
from .feeder import HEADER


def connect(args: argparse.Namespace, deadline: float = 120.0) -> socket.socket:
    end = time.monotonic() + deadline
    while True:
        try:
            if args.transport == "unix":
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(args.socket)
                return s
            host, _, port = args.connect.rpartition(":")
            return socket.create_connection((host, int(port)))
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def recv_exact(s: socket.socket, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        n = s.recv_into(buf[got:])
        if n == 0:
            raise ConnectionError("sidecar closed the connection")
        got += n


def attach(name: str) -> Any:
    """The sidecar's shared memory, attached without this process's resource tracker taking it
    over (it is the sidecar's to unlink)."""
    from multiprocessing import resource_tracker, shared_memory

    shm = shared_memory.SharedMemory(name=name)
    with contextlib.suppress(AttributeError, KeyError):
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


class Rate:
    def __init__(self) -> None:
        self.n, self.t = 0, time.monotonic()

    def tick(self, items: int) -> None:
        self.n += items
        now = time.monotonic()
        if now - self.t >= 10.0:
            print(f"fed_service: {self.n / (now - self.t):.1f} images/s", file=sys.stderr, flush=True)
            self.n, self.t = 0, now


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--transport", choices=("unix", "tcp"), default="unix")
    ap.add_argument("--socket", default="/tmp/lab-feed.sock")
    ap.add_argument("--connect", default="127.0.0.1:47830")
    ap.add_argument("--batch", type=int, default=16, help="the batch size the model is warmed up for")
    backend.add_args(ap, model="mobilenet_v3_large")
    args = ap.parse_args(argv)
    backend.set_comm(args.name)
    model = backend.load(args, args.batch)
    s = connect(args)
    rate = Rate()
    if args.transport == "unix":
        reader = s.makefile("rb")
        hello = json.loads(reader.readline())
        shm = attach(hello["shm"])
        ring = np.ndarray((hello["slots"], *hello["shape"]), dtype=np.uint8, buffer=shm.buf)
        print("ready", flush=True)
        for line in reader:                      # "batch <slot> <seq>"
            slot = int(line.split()[1])
            batch = ring[slot]
            model.infer(batch)
            s.sendall(f"done {slot}\n".encode())
            rate.tick(len(batch))
        return 0
    print("ready", flush=True)
    head = bytearray(HEADER.size)
    buf = bytearray()
    while True:
        recv_exact(s, memoryview(head))
        n, nbytes, _seq = HEADER.unpack(head)
        if len(buf) != nbytes:
            buf = bytearray(nbytes)
        recv_exact(s, memoryview(buf))
        model.infer(np.frombuffer(buf, dtype=np.uint8).reshape(n, backend.IMAGE, backend.IMAGE, 3))
        rate.tick(n)


if __name__ == "__main__":
    sys.exit(main())
