"""The inference container of a video-analytics pod: raw frames read from a named pipe, batched, run.

    python -m examples.hostlab.video_service --name lab-a --fifo /run/frames/frames.fifo --model convnext_base --batch 16
    python -m examples.hostlab.video_service --name lab-a --fifo /run/frames/frames.fifo --backend sim

The reader end of ``framedecoder.py``'s pipe: frames of 224x224x3 uint8 read whole off the FIFO into
a batch buffer, ``--batch`` frames a batch (a stream's detector runs on fixed-size batches), the
model run on each (``backend.py``: a torchvision model on the GPU, or the CPU lab's simulated one)
and its classes kept as a tracker would.  The main thread drives the GPU and, between batches,
waits on the pipe.  Loads the model, opens the pipe (waiting for the decoder), prints ``ready``;
reports frames per second on stderr every 10 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from . import backend
from .framedecoder import FRAME_BYTES, make_fifo


def read_into(fd: int, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        n = os.readv(fd, [buf[got:]])
        if n == 0:
            raise EOFError("the decoder closed the pipe")
        got += n


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--fifo", required=True)
    ap.add_argument("--batch", type=int, default=16)
    backend.add_args(ap, model="convnext_base")
    args = ap.parse_args(argv)
    backend.set_comm(args.name)
    model = backend.load(args, args.batch)
    make_fifo(args.fifo)
    fd = os.open(args.fifo, os.O_RDONLY)              # waits for the decoder
    batch = np.empty((args.batch, backend.IMAGE, backend.IMAGE, 3), dtype=np.uint8)
    raw = memoryview(batch.reshape(-1).data)
    assert len(raw) == args.batch * FRAME_BYTES
    print("ready", flush=True)
    seen: dict[int, int] = {}
    n, t = 0, time.monotonic()
    while True:
        read_into(fd, raw)
        for c in model.infer(batch):
            seen[c] = seen.get(c, 0) + 1
        n += args.batch
        now = time.monotonic()
        if now - t >= 10.0:
            print(f"video_service: {n / (now - t):.1f} frames/s", file=sys.stderr, flush=True)
            n, t = 0, now


if __name__ == "__main__":
    sys.exit(main())
