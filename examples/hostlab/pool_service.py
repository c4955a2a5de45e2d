"""Stream scoring with a ``multiprocessing.Pool``: worker processes decode, the main process runs the model.

    python -m examples.hostlab.pool_service --name lab-a --model wide_resnet50_2 --batch 32 --workers 8 --image 512
    python -m examples.hostlab.pool_service --name lab-a --backend sim --workers 3 --rate 60

The shape of much hand-written inference code that outgrew a single process: the payloads (``--image``
pixel JPEGs, cycled, standing for a queue of uploads) go to a pool of ``--workers`` processes with
``Pool.imap`` (ordered, one item a task), which decode them with PIL to 224x224; the main process
stacks ``--batch`` results and runs the model (``backend.py``: a torchvision model on the GPU, or the
CPU lab's simulated one).  ``--rate`` paces the payloads (images/s; 0: as fast as the pool decodes, a
backfill).  The pool is made before the model is loaded (its workers never touch the GPU).  Prints
``ready`` after the first batch; images per second on stderr every 10 s.  At most ``--prefetch`` images
per worker (two batches if more) are in flight (handed out, not yet taken off the results), so a pool faster than the model
waits instead of piling decoded images up in the main process.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import threading
import time
from collections.abc import Iterator

from . import backend


def payloads(images: list[bytes], rate: float, room: threading.Semaphore) -> Iterator[bytes]:
    """The payloads, paced at ``rate``; each waits for ``room`` (a decoded image taken off the results)."""
    k, t0 = 0, time.monotonic()
    while True:
        room.acquire()
        if rate > 0:
            delay = t0 + k / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        yield images[k % len(images)]
        k += 1


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--image", type=int, default=512, help="side of the JPEGs decoded")
    ap.add_argument("--rate", type=float, default=0.0, help="images/s (0: as fast as the pool decodes)")
    ap.add_argument("--prefetch", type=int, default=4, help="images in flight per worker (as a DataLoader's prefetch)")
    backend.add_args(ap, model="wide_resnet50_2")
    args = ap.parse_args(argv)
    backend.set_comm(args.name)
    images = backend.jpegs(args.image, count=16, seed=9)
    pool = multiprocessing.get_context("fork").Pool(args.workers)
    model = backend.load(args, args.batch)
    room = threading.Semaphore(max(args.prefetch * args.workers, 2 * args.batch))   # images in flight, at most
    decoded = pool.imap(backend.decode, payloads(images, args.rate, room))
    n, t = 0, time.monotonic()
    first = True
    while True:
        batch = np.stack([next(decoded) for _ in range(args.batch)])
        for _ in range(args.batch):
            room.release()
        model.infer(batch)
        if first:
            print("ready", flush=True)
            first = False
        n += len(batch)
        now = time.monotonic()
        if now - t >= 10.0:
            print(f"pool_service: {n / (now - t):.1f} images/s", file=sys.stderr, flush=True)
            n, t = 0, now


if __name__ == "__main__":
    sys.exit(main())
