"""A batch-1 loop of many tiny kernels on GPU-resident tensors: the driving thread busy launching.

    python -m examples.hostlab.launchloop --name lab-b --depth 48 --width 768
    python -m examples.hostlab.launchloop --name lab-b --backend sim --launches 150 --kernel-us 4

What a small model served one request at a time looks like (a decoder step, a small MLP scorer):
no input pipeline at all, the input already on the GPU, ``--depth`` blocks of
Linear(width, width) + LayerNorm + GELU + a residual add at batch 1 under bf16 autocast, and the
result read back (``.item()``) after every forward, as a server replying per request would.  Each
kernel is a few microseconds of GPU work while launching it costs the host more: the GPU is partly
busy and the thread that drives it is busy launching, with nothing to wait for but the GPU.

``--backend sim`` (the CPU lab): ``--launches`` ``cuLaunchKernel`` calls of ``--kernel-us`` each, then
``cuStreamSynchronize``, through the stand-in driver (``backend.SimGpu``), with ``--host-us`` of Python
work before each launch, as a framework's dispatcher spends.  Names itself ``--name``; prints ``ready`` once warm.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from . import backend


def torch_loop(args: argparse.Namespace) -> None:
    import torch
    from torch import nn

    dev = torch.device("cuda")

    class Block(nn.Module):
        def __init__(self, w: int) -> None:
            super().__init__()
            self.fc, self.norm = nn.Linear(w, w), nn.LayerNorm(w)

        def forward(self, x: Any) -> Any:
            return x + nn.functional.gelu(self.norm(self.fc(x)))

    model = nn.Sequential(*[Block(args.width) for _ in range(args.depth)], nn.Linear(args.width, 16)).to(dev).eval()
    x = torch.randn(1, args.width, device=dev)

    def step() -> float:
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            return float(model(x).float().softmax(-1).max().item())

    for _ in range(20):
        step()
    print("ready", flush=True)
    rate_loop(step)


def sim_loop(args: argparse.Namespace) -> None:
    gpu = backend.SimGpu(args.libcuda, args.busy_file)
    host = args.host_us / 1e6

    def step() -> float:
        acc = 0.0
        for _ in range(args.launches):
            end = time.perf_counter() + host      # the framework's dispatch per op (shape checks, autocast,
            while time.perf_counter() < end:      # the allocator) before the launch itself
                acc += 1.0
            gpu.launch(args.kernel_us)
        gpu.sync()
        return acc

    step()
    print("ready", flush=True)
    rate_loop(step)


def rate_loop(step: Any) -> None:
    n, t = 0, time.monotonic()
    while True:
        step()
        n += 1
        now = time.monotonic()
        if now - t >= 10.0:
            print(f"launchloop: {n / (now - t):.1f} steps/s", file=sys.stderr, flush=True)
            n, t = 0, now


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--depth", type=int, default=48)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--launches", type=int, default=150, help="sim: kernels per step")
    ap.add_argument("--kernel-us", type=float, default=4.0, help="sim: GPU time per kernel")
    ap.add_argument("--host-us", type=float, default=10.0, help="sim: the host's dispatch time per kernel")
    backend.add_args(ap)
    args = ap.parse_args(argv)
    backend.set_comm(args.name)
    if args.backend == "sim":
        sim_loop(args)
    else:
        torch_loop(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
