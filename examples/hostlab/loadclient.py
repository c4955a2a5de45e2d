"""The traffic of the fourth set's HTTP services: a steady or a bursty client, from another process.

    python -m examples.hostlab.loadclient --name lab-b-load --port 47841 --rate 2
    python -m examples.hostlab.loadclient --name lab-b-load --port 47841 --burst 32 --period 2 --conns 8

``--conns`` threads, each with its own kept-open ``http.client`` connection, ``POST /infer`` a JPEG of
``--image`` pixels.  Steady: request k is due at ``start + k / rate`` (a thread that falls behind
sends at once: an open loop as far as ``--conns`` allows).  Bursty (``--burst``): every ``--period``
seconds ``--burst`` requests at once, spread over the connections.  Prints ``ready`` after the first
answer, and sent / ok / failed / p50 / p99 on stderr every 10 s.
"""

from __future__ import annotations

import argparse
import http.client
import sys
import threading
import time

from .backend import jpegs, set_comm


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lat: list[float] = []
        self.sent = self.ok = self.failed = 0
        self.first = threading.Event()

    def add(self, ok: bool, seconds: float) -> None:
        with self.lock:
            self.sent += 1
            if ok:
                self.ok += 1
                self.lat.append(seconds)
                self.first.set()
            else:
                self.failed += 1

    def report(self) -> str:
        with self.lock:
            lat, self.lat = sorted(self.lat), []
            out = f"sent {self.sent} ok {self.ok} failed {self.failed}"
        if lat:
            out += f" p50 {1000 * lat[len(lat) // 2]:.1f} ms p99 {1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]:.1f} ms"
        return out


def post(conn: http.client.HTTPConnection, body: bytes) -> bool:
    conn.request("POST", "/infer", body=body, headers={"Content-Type": "image/jpeg"})
    r = conn.getresponse()
    r.read()
    return r.status == 200


def run(args: argparse.Namespace, stats: Stats) -> None:
    images = jpegs(args.image, seed=11)
    lock = threading.Lock()
    nxt = [0]
    start = time.monotonic()
    bursts: list[threading.Semaphore] = [threading.Semaphore(0) for _ in range(args.conns)]

    def due() -> float:
        with lock:
            k = nxt[0]
            nxt[0] += 1
        return start + k / args.rate

    def one(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
        k = i
        while True:
            if args.burst:
                bursts[i].acquire()
            else:
                delay = due() - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            t0 = time.monotonic()
            try:
                ok = post(conn, images[k % len(images)])
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
                time.sleep(0.1)
            stats.add(ok, time.monotonic() - t0)
            k += args.conns

    for i in range(args.conns):
        threading.Thread(target=one, args=(i,), daemon=True).start()
    if args.burst:
        while True:
            for k in range(args.burst):
                bursts[k % args.conns].release()
            time.sleep(args.period)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rate", type=float, default=2.0, help="requests/s (steady)")
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--image", type=int, default=384)
    ap.add_argument("--burst", type=int, default=0, help="requests per burst (0: steady)")
    ap.add_argument("--period", type=float, default=2.0, help="seconds between bursts")
    args = ap.parse_args(argv)
    set_comm(args.name)
    stats = Stats()
    threading.Thread(target=run, args=(args, stats), daemon=True).start()
    if not stats.first.wait(180):
        print("loadclient: no answer in 180 s", file=sys.stderr)
        return 1
    print("ready", flush=True)
    while True:
        time.sleep(10)
        print(f"loadclient: {stats.report()}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
