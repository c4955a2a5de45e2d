"""Find this host's "full load": drive a running service at rising rates and print, for each, what the
client saw and what the server spent its time on (from /metrics).

    python -m examples.inference.calibrate --url http://127.0.0.1:8000 --rates 10,20,40,80 --seconds 15

One JSON line per rate: achieved rate, p50/p99, errors, and the server's mean stage times, model-stage
seconds per second (the GPU's busy share, summed over the models' streams), mean batch and H2D GB/s.
"Full" for the scenario runner is the highest rate whose p99 stays within the deadline with the
model stage the busiest (``--rate-full``).

    python -m examples.inference.calibrate --prep --workers 4 --rate 20 --seconds 10

``--prep``: no service, no GPU: the preprocessing alone (the server's own ``_prepare``, the load
generator's payloads and mix) on ``--workers`` threads at ``--rate`` requests/s, and the CPU it cost
(this process's user+system time over the wall time: cores, and core-milliseconds per request).  Run it
under different BLAS settings (``OPENBLAS_NUM_THREADS``) to see what the thread pools cost.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from .loadgen import LoadSpec, make_payloads, parse_mix, run_load
from .scenarios import server_delta, server_snapshot


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def prep_cost(workers: int, rate: float, seconds: float, mix: dict[str, float],
              audio_seconds: tuple[float, float]) -> dict[str, object]:
    """Requests prepared at ``rate`` on ``workers`` threads for ``seconds``: the CPU they cost."""
    from .server import ROUTES, InferenceService
    payloads = make_payloads(seed=9, audio_seconds=audio_seconds)
    routes, weights = list(mix), list(mix.values())
    rng = random.Random(9)
    for route in ROUTES:      # warm up (lazy imports, cached filters)
        InferenceService._prepare(route, ROUTES[route][0], payloads.get(route, 0))
    done = 0
    c0, t0 = _cpu_s(), time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        futs = []
        i = 0
        while time.perf_counter() - t0 < seconds:
            route = rng.choices(routes, weights)[0]
            futs.append(pool.submit(InferenceService._prepare, route, ROUTES[route][0], payloads.get(route, i)))
            i += 1
            time.sleep(max(0.0, i / rate - (time.perf_counter() - t0)))
        for f in futs:
            f.result()
            done += 1
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    return {"workers": workers, "rate": rate, "requests": done, "wall_s": round(wall, 2),
            "cores": round(cpu / wall, 3), "cpu_ms_per_request": round(1e3 * cpu / max(done, 1), 2),
            "blas_threads": {v: os.environ.get(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
            "cpus": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--rates", default="10,20,40,80")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--mix", default="image=0.45,audio=0.35,text=0.2")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--audio-seconds", default="5,30")
    ap.add_argument("--prep", action="store_true", help="measure the preprocessing's CPU cost alone (no service)")
    ap.add_argument("--workers", type=int, default=4, help="--prep: worker threads (the service's default)")
    ap.add_argument("--rate", type=float, default=20.0, help="--prep: requests per second")
    args = ap.parse_args(argv)
    lo, hi = (float(x) for x in args.audio_seconds.split(","))
    if args.prep:
        print(json.dumps(prep_cost(args.workers, args.rate, args.seconds, parse_mix(args.mix), (lo, hi))), flush=True)
        return 0
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
