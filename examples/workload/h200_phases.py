#!/usr/bin/env python3
"""A small GPU "inference service" that walks through labelled phases, for validating triscope.

Each unit of work is a *request*: pre-process on the CPU, copy in (H2D), compute, copy out (D2H).
What a request does depends on the phase, so each phase stresses one part of the node:

=============  ==========================================================================
phase          what the requests do
=============  ==========================================================================
idle           nothing (baseline)
pinned_h2d     512 MiB host->device from a pinned buffer, back to back: PCIe RX near saturation
pinned_d2h     512 MiB device->host into a pinned buffer: PCIe TX near saturation
pageable_h2d   the same 512 MiB from pageable memory: the driver stages it through pinned buffers
compute_bf16   8 MiB in, a chain of 8192x8192 bf16 matrix products, 8 MiB out: SMs busy, PCIe idle
pin_churn      a fresh 64 MiB host buffer per request, pinned with cudaHostRegister, copied,
               unpinned and freed: the kernel maps/unmaps DMA (dma:dma_map_* tracepoints)
idle_end       nothing
=============  ==========================================================================

It serves its own Prometheus metrics (``--port``): ``inference_request_duration_seconds``
(histogram, by phase), ``inference_stage_duration_seconds`` (histogram, by stage: preprocess,
h2d, compute, d2h), ``inference_requests_total{phase,status}`` (status ok | deadline_exceeded),
``inference_request_errors_total{phase,reason}``, ``inference_transfer_bytes_total{direction}``
and ``inference_phase{phase}`` (1 for the running phase).

Phase boundaries go to ``--phases FILE`` (JSON lines: ts, phase, edge=start|end, plus the
phase's own figures at its end) so they can be written into the store as ``phase`` events
(``examples/workload/check_phases.py --record``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MIB = 1024 * 1024
PHASES = ["idle", "pinned_h2d", "pinned_d2h", "pageable_h2d", "compute_bf16", "pin_churn", "idle_end"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=9500, help="Prometheus endpoint port on 127.0.0.1 (0: none)")
    ap.add_argument("--phase-seconds", type=float, default=20.0, help="seconds per phase")
    ap.add_argument("--phases", type=Path, default=Path("phases.jsonl"), help="phase boundary log (JSON lines)")
    ap.add_argument("--only", default="", help="comma-separated subset of phases, in this order")
    ap.add_argument("--copy-mib", type=int, default=512, help="bytes per copy request in the copy phases")
    ap.add_argument("--churn-mib", type=int, default=64, help="fresh pinned buffer per pin_churn request")
    ap.add_argument("--matmuls", type=int, default=20, help="8192^3 bf16 products per compute request")
    ap.add_argument("--start-delay", type=float, default=0.0,
                    help="serve /metrics this many seconds before the first phase (lets a scraper attach)")
    ap.add_argument("--deadline", type=float, default=0.050,
                    help="request deadline in seconds; slower requests count as deadline_exceeded")
    return ap.parse_args(argv)


class Metrics:
    """The service's own Prometheus metrics (served on 127.0.0.1:``port`` unless 0)."""

    def __init__(self, port: int) -> None:
        from prometheus_client import Counter, Gauge, Histogram, start_http_server

        buckets = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
                   2.5)
        self.req_h = Histogram("inference_request_duration_seconds", "Request latency end to end.", ["phase"],
                               buckets=buckets)
        self.stage_h = Histogram("inference_stage_duration_seconds", "Request stage durations.", ["stage"],
                                 buckets=buckets)
        self.req_c = Counter("inference_requests", "Requests served by outcome.", ["phase", "status"])
        self.err_c = Counter("inference_request_errors", "Failed requests by reason.", ["phase", "reason"])
        self.bytes_c = Counter("inference_transfer_bytes", "Bytes copied between host and GPU.", ["direction"])
        self.phase_g = Gauge("inference_phase", "1 for the phase the workload is in.", ["phase"])
        for p in PHASES:
            self.phase_g.labels(p).set(0)
            self.req_c.labels(p, "ok")
            self.req_c.labels(p, "deadline_exceeded")
        for s in ("preprocess", "h2d", "compute", "d2h"):
            self.stage_h.labels(s)
        if port:
            start_http_server(port, addr="127.0.0.1")


class Requests:
    """The buffers the phases copy and compute with, and one request of each phase."""

    def __init__(self, args: argparse.Namespace, metrics: Metrics) -> None:
        import torch

        self.torch = torch
        self.args = args
        self.metrics = metrics
        dev = torch.device("cuda:0")
        self.copy_n = copy_n = args.copy_mib * MIB
        self.pinned = torch.empty(copy_n, dtype=torch.uint8, pin_memory=True)
        self.pageable = torch.empty(copy_n, dtype=torch.uint8)
        self.pageable.fill_(1)
        self.pinned.fill_(1)
        self.dbuf = torch.empty(copy_n, dtype=torch.uint8, device=dev)
        self.small_h = torch.empty(8 * MIB, dtype=torch.uint8, pin_memory=True)
        self.small_d = torch.empty(8 * MIB, dtype=torch.uint8, device=dev)
        self.a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        self.b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        self.cudart = torch.cuda.cudart()
        torch.cuda.synchronize()
        # warm up the copy engines and cuBLAS outside the phases
        self.dbuf.copy_(self.pinned, non_blocking=True)
        (self.a @ self.b).sum().item()
        torch.cuda.synchronize()

    def timed(self, stage: str, fn):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        fn()
        self.torch.cuda.current_stream().synchronize()
        dt = time.perf_counter() - t0
        self.metrics.stage_h.labels(stage).observe(dt)
        return dt

    def __call__(self, phase: str) -> tuple[int, int]:
        """One request; returns (bytes h2d, bytes d2h)."""
        if phase in ("pinned_h2d", "pageable_h2d"):
            return self.copy_in(self.pinned if phase == "pinned_h2d" else self.pageable)
        if phase == "pinned_d2h":
            return self.copy_out()
        if phase == "compute_bf16":
            return self.compute()
        if phase == "pin_churn":
            return self.pin_churn()
        return 0, 0

    def copy_in(self, src):  # type: ignore[no-untyped-def]
        timed, dbuf, small_h, small_d = self.timed, self.dbuf, self.small_h, self.small_d
        timed("preprocess", lambda: src[:MIB].add_(1))
        timed("h2d", lambda: dbuf.copy_(src, non_blocking=True))
        timed("compute", lambda: dbuf[:MIB].add_(1))
        timed("d2h", lambda: small_h.copy_(small_d, non_blocking=True))
        return self.copy_n, small_h.numel()

    def copy_out(self) -> tuple[int, int]:
        timed, dbuf, small_h, small_d = self.timed, self.dbuf, self.small_h, self.small_d
        timed("preprocess", lambda: small_h[:MIB].add_(1))
        timed("h2d", lambda: small_d.copy_(small_h, non_blocking=True))
        timed("compute", lambda: dbuf[:MIB].add_(1))
        timed("d2h", lambda: self.pinned.copy_(dbuf, non_blocking=True))
        return small_h.numel(), self.copy_n

    def compute(self) -> tuple[int, int]:
        timed, small_h, small_d = self.timed, self.small_h, self.small_d
        timed("preprocess", lambda: small_h[:MIB].add_(1))
        timed("h2d", lambda: small_d.copy_(small_h, non_blocking=True))

        def chain() -> None:
            c = self.a
            for _ in range(self.args.matmuls):
                c = self.torch.matmul(c, self.b)
        timed("compute", chain)
        timed("d2h", lambda: small_h.copy_(small_d, non_blocking=True))
        return small_h.numel(), small_h.numel()

    def pin_churn(self) -> tuple[int, int]:
        timed, dbuf, cudart = self.timed, self.dbuf, self.cudart
        n = self.args.churn_mib * MIB
        buf = self.torch.empty(n, dtype=self.torch.uint8)  # > mmap threshold: fresh pages every time
        timed("preprocess", lambda: buf.fill_(7))
        rc = cudart.cudaHostRegister(buf.data_ptr(), n, 0)
        if int(rc) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {rc}")
        try:
            timed("h2d", lambda: dbuf[:n].copy_(buf, non_blocking=True))
            timed("compute", lambda: dbuf[:MIB].add_(1))
            timed("d2h", lambda: buf[: 8 * MIB].copy_(dbuf[: 8 * MIB], non_blocking=True))
        finally:
            cudart.cudaHostUnregister(buf.data_ptr())
        return n, 8 * MIB   # buf freed on return: the next request pins fresh pages


def run_phase(phase: str, args: argparse.Namespace, request: Requests, m: Metrics) -> dict[str, float]:
    """Serve ``phase`` for ``--phase-seconds``; returns its figures."""
    t_start = time.time()
    end = time.monotonic() + args.phase_seconds
    n_req = n_late = n_err = 0
    tot_h2d = tot_d2h = 0
    lat: list[float] = []
    while time.monotonic() < end:
        if phase.startswith("idle"):
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))
            continue
        t0 = time.perf_counter()
        try:
            h, d = request(phase)
        except Exception as e:  # noqa: BLE001 - a failed request is an error, the service keeps serving
            n_err += 1
            m.err_c.labels(phase, type(e).__name__).inc()
            print(f"request failed in {phase}: {e}", file=sys.stderr)
            time.sleep(0.01)
            continue
        dt = time.perf_counter() - t0
        lat.append(dt)
        n_req += 1
        tot_h2d += h
        tot_d2h += d
        m.bytes_c.labels("h2d").inc(h)
        m.bytes_c.labels("d2h").inc(d)
        m.req_h.labels(phase).observe(dt)
        late = dt > args.deadline
        n_late += late
        m.req_c.labels(phase, "deadline_exceeded" if late else "ok").inc()
    request.torch.cuda.synchronize()
    t_end = time.time()
    dur = t_end - t_start
    lat.sort()
    stats = {
        "start": t_start, "end": t_end, "requests": n_req, "deadline_exceeded": n_late, "errors": n_err,
        "h2d_bytes": tot_h2d, "d2h_bytes": tot_d2h,
        "h2d_gbps": tot_h2d / dur / 1e9, "d2h_gbps": tot_d2h / dur / 1e9,
        "p50_s": lat[len(lat) // 2] if lat else 0.0, "p99_s": lat[int(len(lat) * 0.99)] if lat else 0.0,
    }
    if phase == "compute_bf16" and n_req:
        stats["tflops"] = n_req * args.matmuls * 2 * 8192**3 / dur / 1e12
    return stats


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("h200_phases: no CUDA device", file=sys.stderr)
        return 2
    m = Metrics(args.port)
    request = Requests(args, m)

    time.sleep(args.start_delay)
    phases = [p for p in PHASES if not args.only or p in args.only.split(",")]
    args.phases.parent.mkdir(parents=True, exist_ok=True)
    log = args.phases.open("a", buffering=1)

    def mark(phase: str, edge: str, **extra: object) -> None:
        rec = {"ts": time.time(), "phase": phase, "edge": edge, **extra}
        log.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), flush=True)

    summary: dict[str, dict[str, float]] = {}
    for phase in phases:
        m.phase_g.labels(phase).set(1)
        mark(phase, "start")
        summary[phase] = stats = run_phase(phase, args, request, m)
        mark(phase, "end", **stats)
        m.phase_g.labels(phase).set(0)
    log.close()
    print(json.dumps({"summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
