"""Users with think times: a closed-loop client whose requests trickle in, from another process.

    python -m examples.hostlab.thinkclient --name lab-b-users --port 47842 --users 3 --think 2.0

Each of ``--users`` simulated users opens a connection (HTTP/1.1, ``POST /infer`` with a JPEG of
``--image`` pixels), sends a session of requests (on average ``--session``, geometric), each after
the answer to the last and a think time (exponential, mean ``--think`` seconds), then closes the
connection, thinks, and opens a new one: the load of people using an app, not of a benchmark.  Seeded
(``--seed``) so a run can be repeated.  Prints ``ready`` after the first answer, and sent / ok /
failed / p50 / p99 on stderr every 10 s.
"""

from __future__ import annotations

import argparse
import http.client
import random
import sys
import threading
import time

from .backend import jpegs, set_comm
from .loadclient import Stats, post


def user(i: int, args: argparse.Namespace, images: list[bytes], stats: Stats) -> None:
    rng = random.Random(args.seed * 1000 + i)
    time.sleep(rng.expovariate(1.0 / args.think))
    k = i
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
        try:
            while True:
                t0 = time.monotonic()
                try:
                    ok = post(conn, images[k % len(images)])
                except (OSError, http.client.HTTPException):
                    ok = False
                stats.add(ok, time.monotonic() - t0)
                k += 1
                time.sleep(rng.expovariate(1.0 / args.think))
                if not ok or rng.random() < 1.0 / max(1.0, args.session):
                    break
        finally:
            conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--users", type=int, default=3)
    ap.add_argument("--think", type=float, default=2.0, help="mean think time between requests, seconds")
    ap.add_argument("--session", type=float, default=4.0, help="mean requests per connection")
    ap.add_argument("--image", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    set_comm(args.name)
    images = jpegs(args.image, seed=13)
    stats = Stats()
    for i in range(args.users):
        threading.Thread(target=user, args=(i, args, images, stats), daemon=True).start()
    if not stats.first.wait(180):
        print("thinkclient: no answer in 180 s", file=sys.stderr)
        return 1
    print("ready", flush=True)
    while True:
        time.sleep(10)
        print(f"thinkclient: {stats.report()}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
