"""The three model families, built from their published configurations with random weights (no downloads).

* ViT-L/16: ``timm.create_model("vit_large_patch16_224", pretrained=False)``: 24 layers, width 1024,
  16 heads, 1000 classes (the published ImageNet-1k head).
* CLIP ViT-B/16: ``transformers.CLIPModel`` from the values of ``openai/clip-vit-base-patch16``'s
  config.json (vision: 12 layers, width 768, 12 heads, patch 16, 224 px; text: 12 layers, width 512,
  8 heads, 77 positions, 49 408 ids; projection 512, quick-GELU).  Image and text towers are served
  apart, each through its projection.
* Whisper-large-v3, encoder only: ``transformers`` ``WhisperEncoder`` with large-v3's dimensions
  (128 mel bins, d_model 1280, 32 layers, 20 heads, FFN 5120, 1500 positions): input (B, 128, 3000),
  output (B, 1500, 1280), served mean-pooled over time.

Everything here imports torch; the rest of the service does not.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

CLIP_VIT_B16: dict[str, Any] = {
    "projection_dim": 512,
    "logit_scale_init_value": 2.6592,
    "text_config": {
        "vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
        "num_attention_heads": 8, "max_position_embeddings": 77, "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5, "projection_dim": 512, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1,
    },
    "vision_config": {
        "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
        "image_size": 224, "patch_size": 16, "num_channels": 3, "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5, "projection_dim": 512,
    },
}

WHISPER_LARGE_V3: dict[str, Any] = {
    "vocab_size": 51866, "num_mel_bins": 128, "d_model": 1280,
    "encoder_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
    "decoder_layers": 32, "decoder_attention_heads": 20, "decoder_ffn_dim": 5120,
    "max_source_positions": 1500, "max_target_positions": 448, "activation_function": "gelu",
    "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0, "scale_embedding": False,
    "pad_token_id": 50256, "bos_token_id": 50257, "eos_token_id": 50257, "decoder_start_token_id": 50258,
}


class VitL16(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import timm

        self.net = timm.create_model("vit_large_patch16_224", pretrained=False, num_classes=1000)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net(pixels)


def clip_model() -> nn.Module:
    from transformers import CLIPConfig, CLIPModel

    return CLIPModel(CLIPConfig(**CLIP_VIT_B16))


class ClipImage(nn.Module):
    def __init__(self, clip: nn.Module) -> None:
        super().__init__()
        self.vision_model = clip.vision_model
        self.visual_projection = clip.visual_projection

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        pooled = self.vision_model(pixel_values=pixels).pooler_output
        z = self.visual_projection(pooled)
        return z / z.norm(dim=-1, keepdim=True)


class ClipText(nn.Module):
    def __init__(self, clip: nn.Module) -> None:
        super().__init__()
        self.text_model = clip.text_model
        self.text_projection = clip.text_projection

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pooled = self.text_model(input_ids=ids).pooler_output
        z = self.text_projection(pooled)
        return z / z.norm(dim=-1, keepdim=True)


class WhisperEncoderPooled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import WhisperConfig
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        self.encoder = WhisperEncoder(WhisperConfig(**WHISPER_LARGE_V3))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_features=features).last_hidden_state.mean(dim=1)


def _on(device: torch.device, fn):  # type: ignore[no-untyped-def]
    """Build on the device directly (random init there is much faster); on the CPU if that fails."""
    try:
        with device:
            return fn()
    except (RuntimeError, TypeError, NotImplementedError):
        return fn().to(device)


def build_models(names: list[str], device: torch.device, dtype: torch.dtype) -> dict[str, nn.Module]:
    """``{"vit", "clip_image", "clip_text", "whisper"}`` subset -> eval modules on ``device`` in ``dtype``."""
    out: dict[str, nn.Module] = {}
    clip = None
    for name in names:
        if name == "vit":
            m: nn.Module = _on(device, VitL16)
        elif name in ("clip_image", "clip_text"):
            if clip is None:
                clip = _on(device, clip_model)
            m = ClipImage(clip) if name == "clip_image" else ClipText(clip)
        elif name == "whisper":
            m = _on(device, WhisperEncoderPooled)
        else:
            raise ValueError(f"unknown model {name!r}")
        m = m.to(device=device, dtype=dtype).eval()
        for p in m.parameters():
            p.requires_grad_(False)
        out[name] = m
    return out


def parameter_count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())
