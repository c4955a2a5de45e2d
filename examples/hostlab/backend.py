"""The model behind the fourth set's services: a torchvision model on CUDA, or the CPU lab's simulated GPU.

``--backend torch`` (the GPU machine): a torchvision classification model with random weights on
``cuda``, channels-last, bf16 autocast, as ``torch_service.py`` runs it (without its cudnn
autotuner: batches here come in every size); each batch is a uint8
``(N, 224, 224, 3)`` array copied to the device, normalised there, run, and its top-1 classes
brought back (``.tolist()``: the synchronisation a server's reply needs).

``--backend sim`` (the CPU lab): the stand-in CUDA driver (``fakecuda.py``'s ``libcuda.so.1``)
through ctypes: the batch's bytes copied with ``cuMemcpyHtoDAsync_v2`` from pageable memory (the
library stages them on the calling thread), the model's work queued with ``cuLaunchKernel`` (a
grid of ``block_ns`` blocks: ``--sim-batch-us`` per batch plus ``--sim-item-us`` per image, one
launch per "layer") and waited for with ``cuStreamSynchronize`` (which spins, as CUDA's default
does).  The process's simulated busy share (``SimGpu.busy_ratio``: the device time it queued over
the last second) is written to ``--busy-file`` four times a second: what the CPU lab publishes as
the GPU's SM activity.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

IMAGE = 224
FAKECUDA_DIR = Path(tempfile.gettempdir()) / "triscope-fakecuda"


def add_args(ap: argparse.ArgumentParser, model: str = "resnet18") -> None:
    ap.add_argument("--backend", choices=("torch", "sim"), default="torch")
    ap.add_argument("--model", default=model, help="torchvision classification model (random weights)")
    ap.add_argument("--sim-batch-us", type=float, default=2000.0, help="sim: GPU time per batch")
    ap.add_argument("--sim-item-us", type=float, default=500.0, help="sim: GPU time per image")
    ap.add_argument("--sim-layers", type=int, default=20, help="sim: launches per batch")
    ap.add_argument("--busy-file", default="", help="sim: where the simulated busy share goes")
    ap.add_argument("--libcuda", default="", help="sim: the stand-in libcuda.so.1 (default: built into a temp dir)")


class SimGpu:
    """One process's simulated GPU through the stand-in driver library: copies, launches, syncs."""

    BLOCK_NS = 1000

    def __init__(self, libcuda: str = "", busy_file: str = "") -> None:
        from .fakecuda import FakeCuda, build

        self.cu = FakeCuda(libcuda or build(FAKECUDA_DIR))
        self.cu.check(self.cu.cuInit(0), "cuInit")
        self.cu.fake_set_block_ns(self.BLOCK_NS)
        self.dev = ctypes.c_ulonglong()
        self.cu.check(self.cu.cuMemAlloc_v2(ctypes.byref(self.dev), 256 << 20), "cuMemAlloc_v2")
        self.lock = threading.Lock()
        self._work: collections.deque[tuple[float, float]] = collections.deque()    # (when, seconds queued)
        self._work_lock = threading.Lock()
        if busy_file:
            threading.Thread(target=self._publish, args=(busy_file,), daemon=True, name="busy").start()

    def busy_ratio(self) -> float:
        """The device's busy share over the last second: the work queued in it (the simulated device
        runs it in order, so what was queued a second ago is done or nearly).  Counted here rather
        than read from ``fake_busy_ratio``, whose ring of 8,192 busy intervals covers only part of a
        second when thousands of tiny kernels run apart from each other."""
        lo = time.monotonic() - 1.0
        with self._work_lock:
            while self._work and self._work[0][0] < lo:
                self._work.popleft()
            return min(1.0, sum(s for _, s in self._work))

    def _publish(self, path: str) -> None:
        tmp = path + ".tmp"
        while True:
            time.sleep(0.25)
            with open(tmp, "w") as f:
                f.write(f"{self.busy_ratio():.4f}\n")
            os.replace(tmp, path)

    def _queued(self, seconds: float) -> None:
        with self._work_lock:
            self._work.append((time.monotonic(), seconds))

    def copy_in(self, buf: Any) -> None:
        """Host -> device from pageable memory (a numpy array or bytes-like)."""
        mv = memoryview(buf).cast("B")
        n = mv.nbytes
        if n == 0:
            return
        if mv.readonly:
            mv = memoryview(bytearray(mv))
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mv))
        self.cu.check(self.cu.cuMemcpyHtoDAsync_v2(self.dev.value, ctypes.c_void_p(addr), n, None),
                      "cuMemcpyHtoDAsync_v2")
        self._queued(n / 25e9)                         # the library's default DMA rate

    def launch(self, us: float) -> None:
        blocks = max(1, int(us * 1000 / self.BLOCK_NS))
        self.cu.check(self.cu.cuLaunchKernel(None, blocks, 1, 1, 128, 1, 1, 0, None, None, None), "cuLaunchKernel")
        self._queued(blocks * self.BLOCK_NS / 1e9)

    def sync(self) -> None:
        self.cu.check(self.cu.cuStreamSynchronize(None), "cuStreamSynchronize")


class SimModel:
    """A classification model on the simulated GPU: the batch copied in, ``layers`` launches, a sync."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.gpu = SimGpu(args.libcuda, args.busy_file)
        self.batch_us, self.item_us, self.layers = args.sim_batch_us, args.sim_item_us, max(1, args.sim_layers)

    def infer(self, images: Any) -> list[int]:
        n = len(images)
        with self.gpu.lock:
            self.gpu.copy_in(images)
            per = (self.batch_us + n * self.item_us) / self.layers
            for _ in range(self.layers):
                self.gpu.launch(per)
            self.gpu.sync()
        return [0] * n


class TorchModel:
    """A torchvision model on CUDA (random weights, channels-last, bf16 autocast)."""

    def __init__(self, args: argparse.Namespace, batch: int) -> None:
        import torch
        import torchvision

        self.torch = torch
        # cudnn's autotuner left off (the default): a server's batches come in every size from 1 to
        # ``batch``, and with it on each new size would stop the service for a round of tuning
        self.dev = torch.device("cuda")
        model: Any = getattr(torchvision.models, args.model)(weights=None)
        self.model = model.to(self.dev).eval().to(memory_format=torch.channels_last)
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=self.dev).view(1, 3, 1, 1) * 255
        self.std = torch.tensor([0.229, 0.224, 0.225], device=self.dev).view(1, 3, 1, 1) * 255
        import numpy as np

        self.np = np
        self.buckets = buckets(batch)
        for n in self.buckets:    # each batch shape run once before serving: cuDNN builds its plans per shape
            self.infer(np.zeros((n, IMAGE, IMAGE, 3), dtype=np.uint8))

    def infer(self, images: Any) -> list[int]:
        torch, n = self.torch, len(images)
        size = next((b for b in self.buckets if b >= n), n)
        if size > n:              # padded up to the next warmed-up shape, as servers bucket their batches
            images = self.np.concatenate([images, self.np.zeros((size - n, *images.shape[1:]), images.dtype)])
        x = torch.from_numpy(images).to(self.dev).permute(0, 3, 1, 2).float()
        x = ((x - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            out = self.model(x)
        return out.argmax(1).tolist()[:n]


def buckets(batch: int) -> list[int]:
    """The batch shapes a server runs: powers of two up to ``batch``, and ``batch`` itself."""
    out, b = [], 1
    while b < batch:
        out.append(b)
        b *= 2
    return [*out, batch]


def load(args: argparse.Namespace, batch: int) -> Any:
    """The model ``args`` ask for, warmed up."""
    if args.backend == "sim":
        return SimModel(args)
    return TorchModel(args, batch)


def set_comm(name: str) -> None:
    """The process's name (``/proc/PID/comm``; threads started after it inherit it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)       # PR_SET_NAME


def jpegs(side: int, count: int = 8, seed: int = 7) -> list[bytes]:
    """``count`` distinct JPEGs of ``side`` pixels (noise with a gradient: expensive to decode, as
    photographs are), quality 90."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    ramp = np.linspace(0, 96, side, dtype=np.float32)
    for _ in range(count):
        img = rng.integers(0, 160, (side, side, 3), dtype=np.uint8) + ramp[None, :, None].astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def decode(jpeg: bytes) -> Any:
    """A JPEG to a ``(224, 224, 3)`` uint8 array (PIL, bilinear resize)."""
    import io

    import numpy as np
    from PIL import Image

    img = Image.open(io.BytesIO(jpeg)).convert("RGB").resize((IMAGE, IMAGE), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.uint8)
