"""A scrape target for ``bench_scrape``: prometheus_client's exposition of about N series.

``python -m bench.scrape_target N PORT`` serves ``http://127.0.0.1:PORT/metrics`` from a fresh
registry: half the samples in labelled histograms (5 bounds: 6 buckets, ``_count``, ``_sum``, and
prometheus_client's ``_created``), a quarter labelled counters (with their ``_created``), the rest
labelled gauges, spread over several families.  Every series moves each ``--every`` seconds (0.5 by
default), so no scrape sees the exposition of the one before: a target's worst case.  Prints
``ready <samples stored>`` once it serves.

By default the exposition is rendered by prometheus_client (``generate_latest``) after each move
and served from memory, so the target answers at once however loaded the machine is;
``--live`` serves it with prometheus_client's own HTTP exporter instead, which renders at each
scrape (0.2-0.3 s for 10,000 series on a busy 2-core machine: past the agent's 0.25 s wait for a
target, so the target flaps down and up -- a cost of its own, the writer storing events).
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

BOUNDS = (0.01, 0.05, 0.1, 0.5, 1.0)
HIST_SAMPLES = len(BOUNDS) + 3          # buckets with +Inf, _count, _sum
FAMILIES = 10


def shape(n: int) -> tuple[int, int, int]:
    """(histogram series, counter series, gauge series) for about ``n`` stored samples."""
    hist = max(1, round(n * 0.5 / HIST_SAMPLES))
    counters = round(n * 0.25)
    gauges = max(0, n - hist * HIST_SAMPLES - counters)
    return hist, counters, gauges


def build(n: int, reg: CollectorRegistry) -> tuple[list, list, list]:
    hist, counters, gauges = shape(n)
    fams = min(FAMILIES, max(1, n // 100))
    hs = [Histogram(f"app_stage_{i}_seconds", "Stage latency", ["model", "route"], registry=reg, buckets=BOUNDS)
          for i in range(fams)]
    cs = [Counter(f"app_requests_{i}", "Requests", ["model", "code"], registry=reg) for i in range(fams)]
    gs = [Gauge(f"app_queue_{i}", "Queue", ["model", "slot"], registry=reg) for i in range(fams)]
    h = [hs[k % fams].labels(f"model-{k}", f"/v1/{k % 7}") for k in range(hist)]
    c = [cs[k % fams].labels(f"model-{k}", str(200 + k % 5)) for k in range(counters)]
    g = [gs[k % fams].labels(f"model-{k}", str(k)) for k in range(gauges)]
    return h, c, g


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("n", type=int)
    p.add_argument("port", type=int)
    p.add_argument("--every", type=float, default=0.5)
    p.add_argument("--live", action="store_true", help="prometheus_client's own exporter, rendering at each scrape")
    a = p.parse_args()
    reg = CollectorRegistry()
    h, c, g = build(a.n, reg)
    rendered = [generate_latest(reg)]
    if a.live:
        start_http_server(a.port, addr="127.0.0.1", registry=reg)
    else:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = rendered[0]
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    rnd = random.Random(1)

    def move() -> None:
        while True:
            for x in h:
                x.observe(rnd.random())
            for x in c:
                x.inc()
            for x in g:
                x.set(rnd.random())
            if not a.live:
                rendered[0] = generate_latest(reg)
            time.sleep(a.every)

    threading.Thread(target=move, daemon=True).start()
    print("ready", len(h) * HIST_SAMPLES + len(c) + len(g), flush=True)
    sys.stdin.read()      # until the bench closes our stdin
    return 0


if __name__ == "__main__":
    sys.exit(main())
