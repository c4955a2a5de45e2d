"""Backends run one batch: H2D, the model, D2H.  ``cpu`` is a numpy stand-in; ``torch`` (``gpu.py``) is real.

Both read the knobs in force before each batch: ``pinned`` (copy in from a reused pinned host
buffer, or from pageable memory), ``pin_churn`` (a fresh host buffer pinned and unpinned for every
batch), ``upload_mib`` (that many more MiB copied host-to-device with every batch, standing in for
large inputs: video frames, high-resolution tiles, feature caches).

The CPU stand-in does real host work with the same shape as the GPU path, so the server, batching,
knobs and metrics can be tested without torch: "H2D" copies the batch into a host staging buffer and
then into a "device" buffer (pageable: through 2 MiB staging chunks, like the driver's staging
buffers; pin churn: a fresh buffer, page-locked with ``mlock`` and unlocked, per batch); "model" is a
real matrix product of pooled inputs with fixed random weights plus a sleep of a configurable
per-batch cost (a GPU waits without holding the GIL too); "D2H" copies the outputs back.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .knobs import Knobs

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    route: str
    input_shape: tuple[int, ...]
    input_dtype: str
    output_dim: int
    title: str


MODELS: dict[str, ModelSpec] = {
    "vit": ModelSpec("vit", "image", (3, 224, 224), "float32", 1000, "ViT-L/16 (timm vit_large_patch16_224)"),
    "clip_image": ModelSpec("clip_image", "image", (3, 224, 224), "float32", 512, "CLIP ViT-B/16 image tower"),
    "clip_text": ModelSpec("clip_text", "text", (77,), "int64", 512, "CLIP ViT-B/16 text tower"),
    "whisper": ModelSpec("whisper", "audio", (128, 3000), "float32", 1280, "Whisper-large-v3 encoder"),
}


@dataclass(slots=True)
class BatchResult:
    outputs: list[np.ndarray]           # one float32 vector per item
    h2d_s: float
    model_s: float
    d2h_s: float
    h2d_bytes: int
    d2h_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    name: str
    device: str

    def run_batch(self, model: str, items: Sequence[np.ndarray]) -> BatchResult: ...

    def info(self) -> dict[str, str]: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------------
# page locking for the CPU stand-in (best effort: RLIMIT_MEMLOCK may forbid it)
# --------------------------------------------------------------------------------------------
try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _libc = None


def _mlock(a: np.ndarray) -> bool:
    if _libc is None or a.nbytes == 0:
        return False
    return int(_libc.mlock(ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(a.nbytes))) == 0


def _munlock(a: np.ndarray) -> None:
    if _libc is not None and a.nbytes:
        _libc.munlock(ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(a.nbytes))


# (base ms per batch, ms per item) of the stand-in "model": the shape of the real models' cost
DEFAULT_MODEL_MS = {"vit": (1.0, 0.4), "clip_image": (0.5, 0.1), "clip_text": (0.2, 0.02), "whisper": (1.0, 0.8)}
STAGING_CHUNK = 2 * MIB


class CpuBackend:
    """The numpy stand-in (see the module docstring).  Thread-safe: one lock per model."""

    name = "cpu"
    device = "cpu"

    def __init__(self, knobs: Callable[[], Knobs], model_ms: dict[str, tuple[float, float]] | None = None,
                 model_scale: float = 1.0, seed: int = 0) -> None:
        self._knobs = knobs
        self._ms = dict(DEFAULT_MODEL_MS, **(model_ms or {}))
        self._scale = model_scale
        rng = np.random.default_rng(seed)
        # pooled inputs: images (3, 28, 28) = 2352, log-mel (128, 30) = 3840, text: 64-d embedding mean
        self._w = {
            "vit": rng.standard_normal((2352, 1000), dtype=np.float32) / np.sqrt(2352),
            "clip_image": rng.standard_normal((2352, 512), dtype=np.float32) / np.sqrt(2352),
            "clip_text": rng.standard_normal((64, 512), dtype=np.float32) / 8.0,
            "whisper": rng.standard_normal((3840, 1280), dtype=np.float32) / np.sqrt(3840),
        }
        self._emb = rng.standard_normal((49408, 64), dtype=np.float32)
        self._locks = {m: threading.Lock() for m in MODELS}
        self._pinned: dict[str, np.ndarray] = {}       # reused, page-locked host staging buffers
        self._device: dict[str, np.ndarray] = {}       # the "device" side
        self._extra_pinned: np.ndarray | None = None
        self._extra_device: np.ndarray | None = None
        self._extra_lock = threading.Lock()
        self.mlock_ok = True

    def info(self) -> dict[str, str]:
        return {"backend": "cpu", "device": "cpu", "models": ",".join(MODELS), "mlock": str(self.mlock_ok).lower()}

    def _buffer(self, store: dict[str, np.ndarray], model: str, n: int, dtype: np.dtype[Any],
                shape: tuple[int, ...], lock_pages: bool) -> np.ndarray:
        buf = store.get(model)
        if buf is None or buf.shape[0] < n:
            if buf is not None and lock_pages:
                _munlock(buf)
            buf = np.empty((max(n, 1), *shape), dtype=dtype)
            buf.fill(0)
            if lock_pages and not _mlock(buf):
                self.mlock_ok = False
            store[model] = buf
        return buf

    def _h2d_extra(self, knobs: Knobs) -> int:
        n = knobs.upload_mib * MIB
        if n <= 0:
            return 0
        with self._extra_lock:
            if self._extra_device is None or self._extra_device.nbytes < n:
                self._extra_device = np.empty(n, dtype=np.uint8)
            dev = self._extra_device[:n]
            if knobs.pin_churn:
                src = np.empty(n, dtype=np.uint8)
                src.fill(1)
                locked = _mlock(src)
                np.copyto(dev, src)
                if locked:
                    _munlock(src)
            elif knobs.pinned:
                if self._extra_pinned is None or self._extra_pinned.nbytes < n:
                    if self._extra_pinned is not None:
                        _munlock(self._extra_pinned)
                    self._extra_pinned = np.ones(n, dtype=np.uint8)
                    _mlock(self._extra_pinned)
                np.copyto(dev, self._extra_pinned[:n])
            else:
                src = np.ones(n, dtype=np.uint8)
                for off in range(0, n, STAGING_CHUNK):
                    chunk = src[off: off + STAGING_CHUNK].copy()   # the driver's staging copy
                    dev[off: off + len(chunk)] = chunk
        return n

    def run_batch(self, model: str, items: Sequence[np.ndarray]) -> BatchResult:
        spec = MODELS[model]
        knobs = self._knobs()
        b = len(items)
        dtype = np.dtype(spec.input_dtype)
        with self._locks[model]:
            t0 = time.perf_counter()
            dev = self._buffer(self._device, model, b, dtype, spec.input_shape, lock_pages=False)[:b]
            if knobs.pin_churn:
                host = np.empty((b, *spec.input_shape), dtype=dtype)
                locked = _mlock(host)
                np.stack(items, out=host)
                np.copyto(dev, host)
                if locked:
                    _munlock(host)
            elif knobs.pinned:
                host = self._buffer(self._pinned, model, b, dtype, spec.input_shape, lock_pages=True)[:b]
                np.stack(items, out=host)
                np.copyto(dev, host)
            else:
                host = np.stack(items)
                flat_src, flat_dev = host.reshape(-1).view(np.uint8), dev.reshape(-1).view(np.uint8)
                for off in range(0, flat_src.nbytes, STAGING_CHUNK):
                    chunk = flat_src[off: off + STAGING_CHUNK].copy()
                    flat_dev[off: off + len(chunk)] = chunk
            h2d_bytes = dev.nbytes + self._h2d_extra(knobs)
            t1 = time.perf_counter()
            out = self._model(model, dev)
            base, per_item = self._ms[model]
            cost = (base + per_item * b) * self._scale / 1000.0
            left = cost - (time.perf_counter() - t1)
            if left > 0:
                time.sleep(left)
            t2 = time.perf_counter()
            host_out = np.array(out, dtype=np.float32, copy=True)
            t3 = time.perf_counter()
        return BatchResult(outputs=list(host_out), h2d_s=t1 - t0, model_s=t2 - t1, d2h_s=t3 - t2,
                           h2d_bytes=h2d_bytes, d2h_bytes=host_out.nbytes)

    def _model(self, model: str, x: np.ndarray) -> np.ndarray:
        b = x.shape[0]
        if model in ("vit", "clip_image"):
            pooled = x.reshape(b, 3, 28, 8, 28, 8).mean(axis=(3, 5)).reshape(b, -1)
            out = pooled @ self._w[model]
        elif model == "whisper":
            pooled = x.reshape(b, 128, 30, 100).mean(axis=3).reshape(b, -1)
            out = np.tanh(pooled @ self._w[model])
        else:
            emb = self._emb[x].mean(axis=1)
            out = emb @ self._w[model]
        if model != "vit":
            out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)
        return out.astype(np.float32)

    def close(self) -> None:
        for buf in self._pinned.values():
            _munlock(buf)
        if self._extra_pinned is not None:
            _munlock(self._extra_pinned)


def load_backend(name: str, knobs: Callable[[], Knobs], **kw: Any) -> Backend:
    """``cpu`` (no torch) or ``torch`` (imports gpu.py, which imports torch, timm and transformers)."""
    if name == "cpu":
        allowed = {"model_scale", "seed"}
        return CpuBackend(knobs, **{k: v for k, v in kw.items() if k in allowed})
    if name == "torch":
        from .gpu import TorchBackend

        allowed = {"gpu", "dtype", "models", "warmup"}
        return TorchBackend(knobs, **{k: v for k, v in kw.items() if k in allowed})
    raise ValueError(f"unknown backend {name!r}: cpu or torch")
