"""A batch-scoring model container whose preprocessing is another container's (``prep_rpc.py``).

    python -m examples.hostlab.rpc_service --name lab-b --socket /run/prep/prep.sock --model regnet_x_800mf --batch 16
    python -m examples.hostlab.rpc_service --name lab-b --socket /run/prep/prep.sock --backend sim --rate 40

Works through a queue of encoded images (``--image`` pixel JPEGs, cycled), ``--batch`` at a time:
sends the batch to the preprocessing sidecar over its Unix socket, waits for the decoded array, runs
the model on it (``backend.py``: a torchvision model on the GPU, or the CPU lab's simulated one),
and goes on to the next; ``--rate`` paces images per second (0: as fast as it goes, a backfill job).
The main thread drives the GPU and waits on the sidecar's replies.  Connects to the sidecar
(retrying until it listens), prints ``ready`` after the first batch; images per second on stderr
every 10 s.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time

from . import backend
from .prep_rpc import REPLY, recv_exact, send_images


def connect(path: str, deadline: float = 120.0) -> socket.socket:
    end = time.monotonic() + deadline
    while True:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--image", type=int, default=256, help="side of the JPEGs in the queue")
    ap.add_argument("--rate", type=float, default=0.0, help="images/s (0: as fast as it goes)")
    backend.add_args(ap, model="regnet_x_800mf")
    args = ap.parse_args(argv)
    backend.set_comm(args.name)
    model = backend.load(args, args.batch)
    queue = backend.jpegs(args.image, count=24, seed=3)
    s = connect(args.socket)
    k = 0
    t0 = time.monotonic()
    n, t = 0, t0
    first = True
    while True:
        if args.rate > 0:
            delay = t0 + k / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        send_images(s, [queue[(k + i) % len(queue)] for i in range(args.batch)])
        count, nbytes = REPLY.unpack(recv_exact(s, REPLY.size))
        batch = np.frombuffer(recv_exact(s, nbytes), dtype=np.uint8).reshape(count, backend.IMAGE, backend.IMAGE, 3)
        model.infer(batch)
        k += count
        if first:
            print("ready", flush=True)
            first = False
        n += count
        now = time.monotonic()
        if now - t >= 10.0:
            print(f"rpc_service: {n / (now - t):.1f} images/s", file=sys.stderr, flush=True)
            n, t = 0, now


if __name__ == "__main__":
    sys.exit(main())
