"""The torch backend: the real models on one GPU, with the host-buffer knobs applied to every H2D copy.

Per model: its own CUDA stream (batches of different models overlap; a stage's time is that stream's),
a reused pinned input buffer and a pinned output buffer that grow with the batch size.

* ``pinned``: the batch is stacked into the reused pinned buffer and copied with ``non_blocking``;
  outputs come back into a pinned buffer.
* pageable (``pinned: false``): the stacked batch is copied from ordinary memory; the driver stages it
  through its own pinned buffers (about 40 % of the pinned rate on the H200, DESIGN.md).
* ``pin_churn``: a fresh host buffer per batch, page-locked with ``cudaHostRegister`` and released with
  ``cudaHostUnregister`` after the copy (as ``examples/workload/h200_phases.py``'s pin_churn phase):
  the kernel maps and unmaps it for DMA every time (the ``dma:dma_map_*`` tracepoints).  PyTorch's
  ``pin_memory=True`` would not do: its caching host allocator reuses pinned blocks.
* ``upload_mib``: that many more MiB copied host-to-device per batch, from a buffer of the same kind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .backends import MIB, MODELS, BatchResult
from .knobs import Knobs
from .models import build_models, parameter_count

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NP_TO_TORCH = {"float32": torch.float32, "int64": torch.int64}


class TorchBackend:
    name = "torch"

    def __init__(self, knobs: Callable[[], Knobs], gpu: int = 0, dtype: str = "bf16",
                 models: Sequence[str] | None = None, warmup: bool = True) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("the torch backend needs a CUDA GPU (torch.cuda.is_available() is False)")
        if gpu >= torch.cuda.device_count():
            raise RuntimeError(f"GPU {gpu} does not exist ({torch.cuda.device_count()} visible)")
        self._knobs = knobs
        self.gpu = gpu
        self.dev = torch.device(f"cuda:{gpu}")
        self.device = f"cuda:{gpu}"
        torch.cuda.set_device(self.dev)
        self.dtype = DTYPES[dtype]
        names = list(models or MODELS)
        t0 = time.perf_counter()
        self._models = build_models(names, self.dev, self.dtype)
        self.build_s = time.perf_counter() - t0
        self.params = {m: parameter_count(mod) for m, mod in self._models.items()}
        self._streams = {m: torch.cuda.Stream(self.dev) for m in names}
        self._locks = {m: threading.Lock() for m in names}
        self._pin_in: dict[str, torch.Tensor] = {}
        self._pin_out: dict[str, torch.Tensor] = {}
        self._extra_lock = threading.Lock()
        self._extra_dev: torch.Tensor | None = None
        self._extra_pinned: torch.Tensor | None = None
        self._extra_pageable: torch.Tensor | None = None
        self._cudart = torch.cuda.cudart()
        # pin churn's truth, to hold the agent's DMA-mapping bytes against: what was page-locked
        self.registered_bytes = 0
        self.registrations = 0
        if warmup:
            self.warmup()

    def info(self) -> dict[str, str]:
        return {"backend": "torch", "device": self.device, "models": ",".join(self._models),
                "gpu_name": torch.cuda.get_device_name(self.dev), "gpu_count": str(torch.cuda.device_count()),
                "dtype": str(self.dtype).replace("torch.", ""), "torch": torch.__version__}

    def warmup(self) -> None:
        """One batch of 1 and one of the current batch size per model: kernels chosen, buffers sized."""
        for m in self._models:
            spec = MODELS[m]
            for b in sorted({1, self._knobs().batch_size}):
                item = np.zeros(spec.input_shape, dtype=spec.input_dtype)
                if spec.input_dtype == "int64":
                    item[:] = 49407
                    item[0] = 49406
                self.run_batch(m, [item] * b)
        torch.cuda.synchronize(self.dev)

    # -- host buffers --------------------------------------------------------------------------
    def _pinned(self, store: dict[str, torch.Tensor], m: str, n: int, shape: tuple[int, ...],
                dtype: torch.dtype) -> torch.Tensor:
        buf = store.get(m)
        if buf is None or buf.shape[0] < n or tuple(buf.shape[1:]) != shape:
            buf = torch.empty((max(n, 1), *shape), dtype=dtype, pin_memory=True)
            store[m] = buf
        return buf[:n]

    def _register(self, t: torch.Tensor) -> None:
        n = t.numel() * t.element_size()
        rc = self._cudart.cudaHostRegister(t.data_ptr(), n, 0)
        if int(rc) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {rc}")
        self.registered_bytes += n      # under the model's lock or the upload lock; read racily by /metrics
        self.registrations += 1

    def _unregister(self, t: torch.Tensor) -> None:
        self._cudart.cudaHostUnregister(t.data_ptr())

    def _upload_extra(self, knobs: Knobs) -> int:
        n = knobs.upload_mib * MIB
        if n <= 0:
            return 0
        with self._extra_lock:
            if self._extra_dev is None or self._extra_dev.numel() < n:
                self._extra_dev = torch.empty(n, dtype=torch.uint8, device=self.dev)
            dst = self._extra_dev[:n]
            if knobs.pin_churn:
                src = torch.ones(n, dtype=torch.uint8)
                self._register(src)
                try:
                    dst.copy_(src, non_blocking=True)
                    torch.cuda.current_stream(self.dev).synchronize()
                finally:
                    self._unregister(src)
            elif knobs.pinned:
                if self._extra_pinned is None or self._extra_pinned.numel() < n:
                    self._extra_pinned = torch.ones(n, dtype=torch.uint8, pin_memory=True)
                dst.copy_(self._extra_pinned[:n], non_blocking=True)
            else:
                if self._extra_pageable is None or self._extra_pageable.numel() < n:
                    self._extra_pageable = torch.ones(n, dtype=torch.uint8)
                dst.copy_(self._extra_pageable[:n])
        return n

    # -- one batch -----------------------------------------------------------------------------
    def run_batch(self, model: str, items: Sequence[np.ndarray]) -> BatchResult:
        spec = MODELS[model]
        knobs = self._knobs()
        b = len(items)
        in_dtype = NP_TO_TORCH[spec.input_dtype]
        stream = self._streams[model]
        extra: dict[str, Any] = {}
        with self._locks[model], torch.cuda.stream(stream), torch.inference_mode():
            t0 = time.perf_counter()
            if knobs.pin_churn:
                host = torch.empty((b, *spec.input_shape), dtype=in_dtype)
                np.stack(items, out=host.numpy())
                self._register(host)
                try:
                    x = host.to(self.dev, non_blocking=True)
                    stream.synchronize()
                finally:
                    self._unregister(host)
                extra["pinned_fresh"] = True
            elif knobs.pinned:
                host = self._pinned(self._pin_in, model, b, spec.input_shape, in_dtype)
                np.stack(items, out=host.numpy())
                x = host.to(self.dev, non_blocking=True)
            else:
                host = torch.from_numpy(np.stack(items))
                x = host.to(self.dev)
            h2d_bytes = host.numel() * host.element_size() + self._upload_extra(knobs)
            stream.synchronize()
            t1 = time.perf_counter()
            if x.is_floating_point():
                x = x.to(self.dtype)
            y = self._models[model](x).float()
            stream.synchronize()
            t2 = time.perf_counter()
            if knobs.pinned and not knobs.pin_churn:
                out = self._pinned(self._pin_out, model, b, (spec.output_dim,), torch.float32)
                out.copy_(y, non_blocking=True)
                stream.synchronize()
                arr = out.numpy().copy()
            else:
                arr = y.cpu().numpy()
            t3 = time.perf_counter()
        return BatchResult(outputs=list(arr), h2d_s=t1 - t0, model_s=t2 - t1, d2h_s=t3 - t2,
                           h2d_bytes=h2d_bytes, d2h_bytes=arr.nbytes, extra=extra)

    def close(self) -> None:
        torch.cuda.synchronize(self.dev)
