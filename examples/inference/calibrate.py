"""Find this host's "full load": drive a running service at rising rates and print, for each, what the
client saw and what the server spent its time on (from /metrics).

    python -m examples.inference.calibrate --url http://127.0.0.1:8000 --rates 10,20,40,80 --seconds 15

One JSON line per rate: achieved rate, p50/p99, errors, and the server's mean stage times, model-stage
seconds per second (the GPU's busy share, summed over the models' streams), mean batch and H2D GB/s.
"Full" for the scenario runner is the highest rate whose p99 stays within the deadline with the
model stage the busiest (``--rate-full``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .loadgen import LoadSpec, make_payloads, parse_mix, run_load
from .scenarios import server_delta, server_snapshot


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--rates", default="10,20,40,80")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--mix", default="image=0.45,audio=0.35,text=0.2")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--audio-seconds", default="5,30")
    args = ap.parse_args(argv)
    lo, hi = (float(x) for x in args.audio_seconds.split(","))
    payloads = make_payloads(seed=9, audio_seconds=(lo, hi))
    for rate in (float(r) for r in args.rates.split(",") if r):
        before = server_snapshot(args.url)
        t0 = time.time()
        rep = run_load(LoadSpec(url=args.url, rate=rate, duration=args.seconds, mix=parse_mix(args.mix),
                                concurrency=args.concurrency, image_model="mixed"), payloads).to_dict()
        wall = time.time() - t0
        srv = server_delta(before, server_snapshot(args.url), wall)
        print(json.dumps({"rate": rate, "achieved_rps": rep["achieved_rps"], "p50_ms": rep["p50_ms"],
                          "p99_ms": rep["p99_ms"], "errors": rep["errors"], "server": srv}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
