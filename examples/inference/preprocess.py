"""The CPU-side work of every request: JPEG decode and resize, WAV decode and Whisper's log-mel, token ids.

Images: Pillow decodes the JPEG (all of it: no DCT-domain draft scaling), the shorter side is resized
with a bicubic filter and the centre 224x224 cropped, then scaled to [0, 1] and normalised per
channel, as each model's published pre-processing does: ViT-L/16 (timm ``vit_large_patch16_224``:
resize to 248, crop 224, mean = std = 0.5) and CLIP (resize to 224, crop 224, OpenAI's mean/std).

Audio: stdlib ``wave`` (8/16/24/32-bit PCM, mono or several channels averaged), resampled to 16 kHz
by linear interpolation if it is not, then Whisper's 128-bin log-mel written in numpy: the waveform
padded or trimmed to 30 s, a centred STFT (reflect padding, periodic Hann window, n_fft 400, hop 160,
power 2, the last frame dropped: 3000 frames), a Slaney-style mel filterbank (Slaney's mel scale,
area-normalised triangles, 0-8 kHz), log10 of the energies floored at 1e-10, clamped to max - 8, then
(x + 4) / 4.  That is the recipe of Whisper-large-v3's feature extractor.

Text: no tokenizer that ships inside an installed package works offline here or on the GPU machine
(CLIP's BPE vocabulary is a download), so token ids are **synthetic**: the text is lower-cased and
split like CLIP's pre-tokenizer (words, numbers, punctuation), each piece hashed (BLAKE2b) into
CLIP's id range below its special tokens, framed by CLIP's start/end ids (49406/49407) and padded
with the end id to 77.  The ids are deterministic and have the right shape and range for the CLIP
text tower; they are not CLIP's BPE ids.
"""

from __future__ import annotations

import hashlib
import io
import re
import wave
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

IMAGE_SIZE = 224


class BadPayload(ValueError):
    """The request body cannot be decoded; ``str()`` is one line for the client."""


@dataclass(frozen=True, slots=True)
class ImageRecipe:
    resize: int
    crop: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


VIT_RECIPE = ImageRecipe(resize=248, crop=IMAGE_SIZE, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
CLIP_RECIPE = ImageRecipe(resize=IMAGE_SIZE, crop=IMAGE_SIZE, mean=(0.48145466, 0.4578275, 0.40821073),
                          std=(0.26862954, 0.26130258, 0.27577711))
IMAGE_RECIPES = {"vit": VIT_RECIPE, "clip_image": CLIP_RECIPE}

MAX_PIXELS = 40_000_000  # refuse decompression bombs beyond ~40 MP


# --------------------------------------------------------------------------------------------
# images
# --------------------------------------------------------------------------------------------
def decode_jpeg(data: bytes):  # -> PIL.Image.Image (Pillow imported lazily: the module loads without it)
    """Decode a JPEG body to an RGB Pillow image; BadPayload if it is not one."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise BadPayload("empty body: expected a JPEG image")
    try:
        img = Image.open(io.BytesIO(data))
        if img.format != "JPEG":
            raise BadPayload(f"expected a JPEG image, got {img.format or 'an unknown format'}")
        if img.width * img.height > MAX_PIXELS:
            raise BadPayload(f"image too large: {img.width}x{img.height} pixels (at most {MAX_PIXELS})")
        img = img.convert("RGB")  # forces the full decode
    except BadPayload:
        raise
    except UnidentifiedImageError:
        raise BadPayload("not an image Pillow can identify: expected a JPEG") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise BadPayload(f"not a decodable JPEG image: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None
    return img


def resize_crop_normalise(img, recipe: ImageRecipe = VIT_RECIPE) -> np.ndarray:
    """Shorter side to ``recipe.resize`` (bicubic), centre crop, [0, 1], normalise: float32 (3, crop, crop)."""
    from PIL import Image

    w, h = img.size
    scale = recipe.resize / min(w, h)
    nw, nh = max(recipe.crop, round(w * scale)), max(recipe.crop, round(h * scale))
    img = img.resize((nw, nh), Image.Resampling.BICUBIC)
    left, top = (nw - recipe.crop) // 2, (nh - recipe.crop) // 2
    img = img.crop((left, top, left + recipe.crop, top + recipe.crop))
    x = np.asarray(img, dtype=np.float32) * (1.0 / 255.0)
    x = (x - np.asarray(recipe.mean, dtype=np.float32)) / np.asarray(recipe.std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


# --------------------------------------------------------------------------------------------
# audio
# --------------------------------------------------------------------------------------------
SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160
CHUNK_S = 30
N_SAMPLES = SAMPLE_RATE * CHUNK_S   # 480 000
N_FRAMES = N_SAMPLES // HOP         # 3 000
N_MELS = 128
MAX_AUDIO_S = 120


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """PCM WAV body -> (mono float32 samples in [-1, 1], sample rate); BadPayload if it is not one."""
    if not data:
        raise BadPayload("empty body: expected a WAV file")
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            ch, width, rate, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if rate <= 0 or ch <= 0:
                raise BadPayload(f"WAV header: {ch} channels at {rate} Hz")
            if n > rate * MAX_AUDIO_S:
                raise BadPayload(f"audio too long: {n / rate:.1f} s (at most {MAX_AUDIO_S} s)")
            raw = w.readframes(n)
    except BadPayload:
        raise
    except (wave.Error, EOFError, ValueError) as e:
        raise BadPayload(f"not a PCM WAV file: {e}") from None
    if width == 1:
        x = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, dtype=np.uint8)
        b = b[: len(b) // 3 * 3].reshape(-1, 3)
        v = (b[:, 0].astype(np.int32) | (b[:, 1].astype(np.int32) << 8) | (b[:, 2].astype(np.int32) << 16))
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        x = v.astype(np.float32) / float(1 << 23)
    elif width == 4:
        x = np.frombuffer(raw, dtype="<i4").astype(np.float32) / float(1 << 31)
    else:
        raise BadPayload(f"unsupported WAV sample width: {width} bytes")
    x = x[: len(x) // ch * ch]
    if ch > 1:
        x = x.reshape(-1, ch).mean(axis=1)
    return np.ascontiguousarray(x, dtype=np.float32), rate


def resample_linear(x: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Linear-interpolation resampling (no anti-alias filter: load generators send 16 kHz)."""
    if rate == target or len(x) == 0:
        return x
    n = int(round(len(x) * target / rate))
    t = np.arange(n, dtype=np.float64) * (rate / target)
    return np.interp(t, np.arange(len(x), dtype=np.float64), x).astype(np.float32)


def hz_to_mel(f: np.ndarray | float) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per octave x log2(6.4))."""
    f = np.asarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    mels = f / f_sp
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-12) / min_log_hz) / logstep, mels)


def mel_to_hz(m: np.ndarray | float) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


@lru_cache(maxsize=8)
def mel_filters(n_mels: int = N_MELS, sr: int = SAMPLE_RATE, n_fft: int = N_FFT,
                fmin: float = 0.0, fmax: float | None = None) -> np.ndarray:
    """Slaney-style mel filterbank, (n_mels, 1 + n_fft // 2) float32, each triangle's area in Hz = 1."""
    fmax = sr / 2 if fmax is None else fmax
    fftfreqs = np.linspace(0.0, sr / 2, 1 + n_fft // 2)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fftfreqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2: n_mels + 2] - mel_f[:n_mels]))[:, None]
    out = weights.astype(np.float32)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=4)
def hann_window(n: int = N_FFT) -> np.ndarray:
    """Periodic Hann window (the STFT kind: ``torch.hann_window`` and Whisper use this one)."""
    w = (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)).astype(np.float32)
    w.flags.writeable = False
    return w


def pad_or_trim(x: np.ndarray, length: int = N_SAMPLES) -> np.ndarray:
    if len(x) >= length:
        return x[:length]
    return np.pad(x, (0, length - len(x)))


def stft_power(audio: np.ndarray, n_fft: int = N_FFT, hop: int = HOP) -> np.ndarray:
    """|STFT|^2 of a centred, reflect-padded signal with a periodic Hann window: (1 + n_fft // 2, frames)."""
    x = np.pad(np.asarray(audio, dtype=np.float32), (n_fft // 2, n_fft // 2), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop]
    spec = np.fft.rfft(frames * hann_window(n_fft), axis=-1)
    return (spec.real ** 2 + spec.imag ** 2).T


def log_mel_spectrogram(audio: np.ndarray, n_mels: int = N_MELS) -> np.ndarray:
    """Whisper's log-mel features of 16 kHz audio: float32 (n_mels, 3000)."""
    audio = pad_or_trim(np.asarray(audio, dtype=np.float32), N_SAMPLES)
    power = stft_power(audio)[:, :-1]                       # (201, 3000): the last frame is dropped
    mel = mel_filters(n_mels) @ power.astype(np.float32)
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


def audio_features(data: bytes) -> tuple[np.ndarray, float]:
    """WAV body -> (log-mel (128, 3000), duration in seconds)."""
    x, rate = decode_wav(data)
    x = resample_linear(x, rate)
    return log_mel_spectrogram(x), len(x) / SAMPLE_RATE


# --------------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------------
CONTEXT_LENGTH = 77
VOCAB_SIZE = 49408
BOS_ID = 49406
EOS_ID = 49407
MAX_TEXT_CHARS = 10_000
# CLIP's pre-tokenizer pattern, less its special tokens: contractions, letters, digits one by one, punctuation runs
_PIECES = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d|[^\W\d_]+|\d|[^\s\w]+", re.UNICODE)


def tokenize(text: str, context_length: int = CONTEXT_LENGTH) -> np.ndarray:
    """Synthetic CLIP-shaped ids (see the module docstring): int64 (context_length,)."""
    if not isinstance(text, str):
        raise BadPayload("text: must be a string")
    if len(text) > MAX_TEXT_CHARS:
        raise BadPayload(f"text too long: {len(text)} characters (at most {MAX_TEXT_CHARS})")
    pieces = _PIECES.findall(" ".join(text.lower().split()))
    ids = [BOS_ID]
    for p in pieces[: context_length - 2]:
        h = int.from_bytes(hashlib.blake2b(p.encode("utf-8"), digest_size=4).digest(), "little")
        ids.append(h % (BOS_ID - 1) + 1)
    ids.append(EOS_ID)
    out = np.full(context_length, EOS_ID, dtype=np.int64)
    out[: len(ids)] = ids
    return out
