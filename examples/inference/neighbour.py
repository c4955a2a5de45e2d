"""The noisy neighbour: a separate process that hogs a GPU's copy engines or SMs (or, with the CPU
stand-in, host memory bandwidth or a core), started and stopped by the service's ``noisy_neighbour`` knob.

    python -m examples.inference.neighbour --backend torch --mode copy --gpu other --service-gpu 0

``--gpu other`` picks the next GPU after the service's when there are several, the service's own GPU
when there is one.  torch modes: ``copy`` moves ``--mib`` MiB host->device and device->host at once
(two streams) from pinned buffers without pause (both directions of PCIe near their ceiling, SMs
idle); ``compute`` chains 8192^3 bf16 matrix products (SMs busy, PCIe idle).  CPU modes: ``copy`` copies a ``--mib`` MiB array back and forth;
``compute`` multiplies 512x512 float32 matrices on one thread.  It prints one JSON line when it
starts and one every ``--report-s`` seconds (rates), and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

_stop = False


def _on_signal(signum: int, frame: object) -> None:
    global _stop
    _stop = True


def _report(kind: str, **kw: object) -> None:
    print(json.dumps({"neighbour": kind, "ts": time.time(), **kw}), flush=True)


def run_cpu(mode: str, mib: int, report_s: float) -> None:
    import numpy as np

    n = mib << 20
    a, b = np.ones(n, dtype=np.uint8), np.empty(n, dtype=np.uint8)
    x = np.random.default_rng(0).standard_normal((512, 512), dtype=np.float32)
    done, t_last = 0, time.monotonic()
    while not _stop:
        if mode == "copy":
            np.copyto(b, a)
            np.copyto(a, b)
            done += 2 * n
        else:
            x = np.tanh(x @ x)
            done += 2 * 512 ** 3
        now = time.monotonic()
        if now - t_last >= report_s:
            unit = "gb_per_s" if mode == "copy" else "gflop_per_s"
            _report("rate", mode=mode, **{unit: round(done / (now - t_last) / 1e9, 2)})
            done, t_last = 0, now


def run_torch(mode: str, gpu: int, mib: int, report_s: float) -> None:
    import torch

    dev = torch.device(f"cuda:{gpu}")
    torch.cuda.set_device(dev)
    done, t_last = 0, time.monotonic()
    if mode == "copy":
        n = mib << 20
        host = torch.ones(n, dtype=torch.uint8, pin_memory=True)
        back = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        d_in = torch.empty(n, dtype=torch.uint8, device=dev)
        d_out = torch.ones(n, dtype=torch.uint8, device=dev)
        # H2D and D2H on two streams at once: both directions of the link busy (one stream copying
        # one way and then the other keeps each direction busy half the time, ~28 GB/s on an H200)
        up, down = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
        while not _stop:
            with torch.cuda.stream(up):
                d_in.copy_(host, non_blocking=True)
            with torch.cuda.stream(down):
                back.copy_(d_out, non_blocking=True)
            torch.cuda.synchronize(dev)
            done += 2 * n
            now = time.monotonic()
            if now - t_last >= report_s:
                _report("rate", mode=mode, gpu=gpu, gb_per_s=round(done / (now - t_last) / 1e9, 2))
                done, t_last = 0, now
    else:
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        while not _stop:
            c = a
            for _ in range(8):
                c = torch.matmul(c, b)
            torch.cuda.synchronize(dev)
            done += 8 * 2 * 8192 ** 3
            now = time.monotonic()
            if now - t_last >= report_s:
                _report("rate", mode=mode, gpu=gpu, tflop_per_s=round(done / (now - t_last) / 1e12, 1))
                done, t_last = 0, now


def resolve_gpu(gpu: str, service_gpu: int) -> int:
    if gpu != "other":
        return int(gpu)
    import torch

    count = torch.cuda.device_count()
    return (service_gpu + 1) % count if count > 1 else service_gpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("cpu", "torch"), default="cpu")
    ap.add_argument("--mode", choices=("copy", "compute"), default="copy")
    ap.add_argument("--gpu", default="other", help="GPU index, or 'other' (see above)")
    ap.add_argument("--service-gpu", type=int, default=0)
    ap.add_argument("--mib", type=int, default=None, help="bytes per copy (torch 512, cpu 64)")
    ap.add_argument("--report-s", type=float, default=5.0)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    if args.backend == "cpu":
        mib = args.mib or 64
        _report("start", backend="cpu", mode=args.mode, pid=os.getpid(), mib=mib)
        run_cpu(args.mode, mib, args.report_s)
    else:
        gpu = resolve_gpu(args.gpu, args.service_gpu)
        mib = args.mib or 512
        _report("start", backend="torch", mode=args.mode, pid=os.getpid(), gpu=gpu, mib=mib)
        run_torch(args.mode, gpu, mib, args.report_s)
    _report("stop", mode=args.mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
