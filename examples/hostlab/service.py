"""A stand-in inference service for the host lab: a real host side, a simulated GPU.

    python -m examples.hostlab.service --name lab-b --busy-file /tmp/b.busy --workers 1 --item-ms 40

The host side is what stock PyTorch serving code does: requests (a fixed rate, or as fast as the
pipeline takes them) are fetched over TCP when ``--fetch`` is given (one persistent connection to a
blob server, ``--fetch-bytes`` per request), handed to ``--workers`` worker *processes* forked like
``torch.utils.data.DataLoader``'s (no GPU in them), each burning ``--item-ms`` of CPU per item (the
decode), and batched (``--batch``) for the "GPU" — a sleep of ``--gpu-ms`` per batch in the main
process, the only part that is simulated.  The share of wall time spent in that sleep over the last
second is written to ``--busy-file`` four times a second: what the lab's GPU stand-in publishes as SM
activity.  The process names itself ``--name`` (its comm), which is how the agent labels it off
Kubernetes (``cmd:<name>``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import hashlib
import multiprocessing as mp
import os
import queue
import socket
import sys
import threading
import time


def set_comm(name: str) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)       # PR_SET_NAME


def burn(ms: float) -> None:
    """``ms`` of this thread's CPU (sha256 over 64 KiB until the thread clock has moved that much)."""
    end = time.thread_time() + ms / 1000.0
    buf = b"x" * 65536
    while time.thread_time() < end:
        hashlib.sha256(buf).digest()


def worker(inq: mp.Queue, outq: mp.Queue, item_ms: float) -> None:   # type: ignore[type-arg]
    while True:
        item = inq.get()
        if item is None:
            return
        burn(item_ms)
        outq.put(item)


class Busy:
    """The simulated GPU's busy intervals; ``share()`` over the last second."""

    def __init__(self) -> None:
        self.spans: collections.deque[tuple[float, float]] = collections.deque()
        self.lock = threading.Lock()

    def add(self, a: float, b: float) -> None:
        with self.lock:
            self.spans.append((a, b))

    def share(self, now: float, window: float = 1.0) -> float:
        lo = now - window
        with self.lock:
            while self.spans and self.spans[0][1] < lo:
                self.spans.popleft()
            busy = sum(min(b, now) - max(a, lo) for a, b in self.spans if b > lo)
        return max(0.0, min(1.0, busy / window))


def publish(busy: Busy, path: str, stop: threading.Event) -> None:
    tmp = path + ".tmp"
    while not stop.wait(0.25):
        with open(tmp, "w") as f:
            f.write(f"{busy.share(time.monotonic()):.4f}\n")
        os.replace(tmp, path)


def fetcher(addr: tuple[str, int], size: int) -> socket.socket:
    s = socket.create_connection(addr, timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def fetch(s: socket.socket, size: int) -> None:
    s.sendall(f"{size}\n".encode())
    got = 0
    while got < size:
        chunk = s.recv(min(65536, size - got))
        if not chunk:
            raise ConnectionError("blob server closed the connection")
        got += len(chunk)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--busy-file", required=True)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--item-ms", type=float, default=5.0)
    ap.add_argument("--gpu-ms", type=float, default=10.0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rate", type=float, default=0.0, help="requests/s (0: as fast as the pipeline takes them)")
    ap.add_argument("--fetch", default="", help="HOST:PORT of a blob server to fetch each request's payload from")
    ap.add_argument("--fetch-bytes", type=int, default=32768)
    args = ap.parse_args(argv)
    set_comm(args.name)
    ctx = mp.get_context("fork")
    inq: mp.Queue = ctx.Queue()      # type: ignore[type-arg]
    outq: mp.Queue = ctx.Queue()     # type: ignore[type-arg]
    procs = [ctx.Process(target=worker, args=(inq, outq, args.item_ms), daemon=True) for _ in range(args.workers)]
    for p in procs:
        p.start()
    busy = Busy()
    stop = threading.Event()
    threading.Thread(target=publish, args=(busy, args.busy_file, stop), daemon=True).start()
    outstanding = threading.Semaphore(max(2, 2 * args.workers)) if args.rate <= 0 else None
    sock = None
    if args.fetch:
        host, _, port = args.fetch.rpartition(":")
        sock = fetcher((host, int(port)), args.fetch_bytes)

    def feed() -> None:
        n = 0
        t0 = time.monotonic()
        while not stop.is_set():
            if outstanding is not None:
                outstanding.acquire()
            else:
                delay = t0 + n / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if sock is not None:
                fetch(sock, args.fetch_bytes)
            inq.put(n)
            n += 1

    threading.Thread(target=feed, daemon=True).start()
    print("ready", flush=True)
    try:
        while True:
            items = [outq.get()]
            while len(items) < args.batch:
                try:
                    items.append(outq.get_nowait())
                except queue.Empty:
                    break
            a = time.monotonic()
            time.sleep(args.gpu_ms / 1000.0)        # the simulated GPU: its work for this batch
            # the GPU works gpu_ms whatever the host does: a throttled or descheduled process wakes
            # late from the wait, and that delay is the host's, not GPU time
            busy.add(a, a + args.gpu_ms / 1000.0)
            if outstanding is not None:
                for _ in items:
                    outstanding.release()
    except KeyboardInterrupt:
        return 0
    finally:
        stop.set()


if __name__ == "__main__":
    sys.exit(main())
