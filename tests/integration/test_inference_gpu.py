"""The torch backend on a real GPU (the H200 machine): the three model families built from their
published configurations with random weights, one batch each from real preprocessed inputs, pinned
vs pageable H2D, pin churn, and the service end to end.  Skipped where torch or a CUDA GPU is missing.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="PyTorch is not installed here (the H200 machine has it)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to PyTorch here", allow_module_level=True)
pytest.importorskip("timm", reason="timm is not installed here (the H200 machine has it)")
pytest.importorskip("transformers", reason="transformers is not installed here (the H200 machine has it)")

from examples.inference import preprocess as pp  # noqa: E402
from examples.inference.backends import MIB, MODELS  # noqa: E402
from examples.inference.gpu import TorchBackend  # noqa: E402
from examples.inference.knobs import Knobs  # noqa: E402
from examples.inference.loadgen import LoadSpec, make_payloads, run_load, synth_audio, synth_image  # noqa: E402
from examples.inference.server import InferenceServer, build_service  # noqa: E402

KNOBS = {"k": Knobs(batch_size=4)}


@pytest.fixture(scope="module")
def backend():
    be = TorchBackend(lambda: KNOBS["k"], gpu=0, dtype="bf16", warmup=True)
    yield be
    be.close()


def _inputs(model: str, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    if model in ("vit", "clip_image"):
        return [pp.resize_crop_normalise(pp.decode_jpeg(synth_image(rng, 640, 480)), pp.IMAGE_RECIPES[model])
                for _ in range(n)]
    if model == "whisper":
        return [pp.audio_features(synth_audio(rng, 6.0 + 3 * i))[0] for i in range(n)]
    return [pp.tokenize(t) for t in ("a photo of a dog", "a diagram of a bridge at night", "rain")[:n]]


def test_models_build_from_published_configs(backend):
    p = backend.params
    print(json.dumps({"params": p, "build_s": round(backend.build_s, 1), "info": backend.info()}))
    assert 300e6 < p["vit"] < 310e6                # ViT-L/16: 304 M
    assert 85e6 < p["clip_image"] < 90e6           # CLIP ViT-B/16 vision tower + projection
    assert 62e6 < p["clip_text"] < 65e6            # CLIP text tower + projection
    assert 630e6 < p["whisper"] < 640e6            # Whisper-large-v3 encoder: 32 layers of width 1280
    enc = backend._models["whisper"].encoder
    assert enc.config.num_mel_bins == 128 and len(enc.layers) == 32 and enc.config.encoder_attention_heads == 20
    vit = backend._models["vit"].net
    assert len(vit.blocks) == 24 and vit.embed_dim == 1024
    for m in backend._models.values():
        assert next(m.parameters()).dtype == torch.bfloat16 and next(m.parameters()).device.type == "cuda"


@pytest.mark.parametrize("model", list(MODELS))
def test_each_model_runs_one_batch(backend, model):
    items = _inputs(model, 3)
    KNOBS["k"] = Knobs(batch_size=4)
    res = backend.run_batch(model, items)
    out = np.stack(res.outputs)
    assert out.shape == (3, MODELS[model].output_dim) and np.isfinite(out).all()
    assert res.h2d_bytes == sum(x.nbytes for x in items) and res.d2h_bytes == out.nbytes
    assert min(res.h2d_s, res.model_s, res.d2h_s) > 0
    assert not np.allclose(out[0], out[1])                  # different inputs, different outputs
    if model.startswith("clip"):      # CLIP embeddings are served normalised
        np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=2e-2)


def test_buffer_knobs_give_the_same_answer(backend):
    items = _inputs("clip_image", 2)
    outs = {}
    for name, k in {"pinned": Knobs(), "pageable": Knobs(pinned=False), "churn": Knobs(pin_churn=True)}.items():
        KNOBS["k"] = k
        res = backend.run_batch("clip_image", items)
        outs[name] = np.stack(res.outputs)
        if name == "churn":
            assert res.extra.get("pinned_fresh") is True
    KNOBS["k"] = Knobs(batch_size=4)
    np.testing.assert_allclose(outs["pageable"], outs["pinned"], atol=1e-2)
    np.testing.assert_allclose(outs["churn"], outs["pinned"], atol=1e-2)


def _h2d_gbps(src: torch.Tensor, dst: torch.Tensor, reps: int = 5) -> float:
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return src.numel() / best / 1e9


def test_pinned_and_pageable_h2d_differ():
    n = 256 * MIB
    dst = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    pinned = torch.ones(n, dtype=torch.uint8, pin_memory=True)
    pageable = torch.ones(n, dtype=torch.uint8)
    _h2d_gbps(pinned, dst, 1)
    _h2d_gbps(pageable, dst, 1)
    gp, gq = _h2d_gbps(pinned, dst), _h2d_gbps(pageable, dst)
    print(json.dumps({"pinned_h2d_gbps": round(gp, 1), "pageable_h2d_gbps": round(gq, 1)}))
    assert gp > 1.3 * gq


def test_upload_knob_shows_the_difference_in_the_h2d_stage(backend):
    items = _inputs("clip_text", 2)
    times = {}
    for name, k in {"pinned": Knobs(upload_mib=256), "pageable": Knobs(pinned=False, upload_mib=256),
                    "churn": Knobs(pin_churn=True, upload_mib=256)}.items():
        KNOBS["k"] = k
        backend.run_batch("clip_text", items)                       # buffers sized
        times[name] = min(backend.run_batch("clip_text", items).h2d_s for _ in range(3))
    KNOBS["k"] = Knobs(batch_size=4)
    print(json.dumps({"h2d_s_256mib": {k: round(v, 5) for k, v in times.items()}}))
    assert times["pageable"] > 1.2 * times["pinned"]
    assert times["churn"] > times["pinned"]       # pinning 256 MiB costs more than copying it


def test_torch_service_end_to_end():
    srv = InferenceServer()
    svc = build_service("torch", port=srv.port, net_tool="off", neighbour=False, gpu=0,
                        models=["clip_image", "clip_text", "whisper"], settings=["batch_size=8"])
    srv.attach(svc).start()
    try:
        payloads = make_payloads(seed=4, images=2, audios=2, texts=4, audio_seconds=(5, 8))
        d = run_load(LoadSpec(url=srv.url, rate=20, duration=3, concurrency=8, image_model="clip"), payloads).to_dict()
        assert d["ok"] == d["sent"] > 20 and d["error_count"] == 0
        text = urllib.request.urlopen(srv.url + "/metrics", timeout=10).read().decode()
        assert 'inference_backend_info{backend="torch"' in text
        assert 'inference_stage_duration_seconds_count{model="whisper",stage="h2d"}' in text
        print(json.dumps({"torch_service": {k: d[k] for k in ("sent", "ok", "p50_ms", "p99_ms")}}))
    finally:
        srv.stop()
