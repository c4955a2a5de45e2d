"""The inference service's CPU-side work: JPEG decode and resize, WAV decode, Whisper's log-mel, token ids.

The log-mel is checked against facts that do not depend on this code: Slaney's mel scale at known
points, the filterbank's shape (triangles peaking at their centre frequencies, unit area in Hz), the
STFT against a direct DFT, and the exact energy a sine on an FFT bin puts into the mel filters (a
periodic Hann window has three non-zero DFT coefficients, so the expected value is closed-form).
librosa and torchaudio/transformers are not installed here: the comparisons with them
(``test_matches_*``) skip here and run on the H200 machine, which has transformers and torchaudio.
"""

from __future__ import annotations

import io
import json
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PIL = pytest.importorskip("PIL", reason="Pillow is in the test extras (pip install -e '.[test]')")
from PIL import Image  # noqa: E402

from examples.inference import preprocess as pp  # noqa: E402


def _jpeg(arr: np.ndarray, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _wav(samples: np.ndarray, rate: int, width: int = 2, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# images
# --------------------------------------------------------------------------------------------
def test_jpeg_round_trip_keeps_the_picture():
    h, w = 240, 320
    arr = np.zeros((h, w, 3), dtype=np.uint8)
    arr[:, : w // 2] = (220, 30, 30)       # left half red
    arr[:, w // 2:] = (20, 40, 200)        # right half blue
    img = pp.decode_jpeg(_jpeg(arr))
    assert img.size == (w, h) and img.mode == "RGB"
    back = np.asarray(img, dtype=np.int16)
    # away from the edge, JPEG at quality 95 stays within a few levels
    assert np.abs(back[20:-20, 20:140] - arr[20:-20, 20:140]).max() <= 6
    assert np.abs(back[20:-20, 180:-20] - arr[20:-20, 180:-20]).max() <= 6


def test_resize_crop_normalise_per_model_recipe():
    arr = np.zeros((300, 500, 3), dtype=np.uint8)
    arr[:] = (255, 0, 0)
    img = pp.decode_jpeg(_jpeg(arr, quality=100))
    x = pp.resize_crop_normalise(img, pp.VIT_RECIPE)
    assert x.shape == (3, 224, 224) and x.dtype == np.float32 and x.flags["C_CONTIGUOUS"]
    # mean = std = 0.5: red 1.0 -> +1, green/blue 0 -> -1 (JPEG chroma costs a little)
    assert abs(float(x[0].mean()) - 1.0) < 0.03
    assert abs(float(x[1].mean()) + 1.0) < 0.03 and abs(float(x[2].mean()) + 1.0) < 0.03
    c = pp.resize_crop_normalise(img, pp.CLIP_RECIPE)
    assert abs(float(c[0].mean()) - (1 - 0.48145466) / 0.26862954) < 0.06
    assert abs(float(c[2].mean()) - (0 - 0.40821073) / 0.27577711) < 0.06


def test_centre_crop_takes_the_middle():
    # a wide image: a white stripe in the middle third, black elsewhere; the crop sees mostly white
    arr = np.zeros((224, 672, 3), dtype=np.uint8)
    arr[:, 224:448] = 255
    x = pp.resize_crop_normalise(pp.decode_jpeg(_jpeg(arr, 100)), pp.CLIP_RECIPE)
    white = (1 - 0.48145466) / 0.26862954
    assert float(np.median(x[0])) == pytest.approx(white, abs=0.1)


@pytest.mark.parametrize("body, words", [
    (b"", "empty body"),
    (b"not an image at all", "expected a JPEG"),
])
def test_bad_image_bodies_refused_with_one_line(body, words):
    with pytest.raises(pp.BadPayload) as e:
        pp.decode_jpeg(body)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_png_and_truncated_jpeg_refused():
    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, "PNG")
    with pytest.raises(pp.BadPayload, match="expected a JPEG image, got PNG"):
        pp.decode_jpeg(buf.getvalue())
    good = _jpeg(np.random.default_rng(0).integers(0, 255, (128, 128, 3), dtype=np.uint8))
    with pytest.raises(pp.BadPayload, match="JPEG"):
        pp.decode_jpeg(good[: len(good) // 2])


# --------------------------------------------------------------------------------------------
# WAV
# --------------------------------------------------------------------------------------------
def test_wav_16bit_stereo_is_averaged_to_mono():
    left = np.array([1000, -2000, 32767, -32768], dtype="<i2")
    right = np.array([3000, 2000, 32767, -32768], dtype="<i2")
    inter = np.stack([left, right], axis=1).reshape(-1)
    x, rate = pp.decode_wav(_wav(inter, 22050, 2, 2))
    assert rate == 22050
    np.testing.assert_allclose(x, (left.astype(np.float32) + right) / 2 / 32768, rtol=0, atol=1e-7)


def test_wav_8_and_24_bit():
    x8, _ = pp.decode_wav(_wav(np.array([0, 128, 255], dtype=np.uint8), 16000, 1))
    np.testing.assert_allclose(x8, [-1.0, 0.0, 127 / 128], atol=1e-7)
    vals = [0, 1, -1, (1 << 23) - 1, -(1 << 23)]
    raw = b"".join(int(v).to_bytes(3, "little", signed=True) for v in vals)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(3)
        w.setframerate(16000)
        w.writeframes(raw)
    x24, _ = pp.decode_wav(buf.getvalue())
    np.testing.assert_allclose(x24, np.array(vals, dtype=np.float64) / (1 << 23), atol=1e-7)


def test_resample_keeps_duration_and_frequency():
    rate = 44100
    t = np.arange(rate * 2) / rate
    x = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    y = pp.resample_linear(x, rate)
    assert len(y) == 32000
    spec = np.abs(np.fft.rfft(y))
    assert abs(np.argmax(spec) * 16000 / len(y) - 440) < 1.0


def test_bad_wav_refused():
    with pytest.raises(pp.BadPayload, match="not a PCM WAV"):
        pp.decode_wav(b"RIFF\x00\x00\x00\x00WAVEjunk")
    with pytest.raises(pp.BadPayload, match="empty body"):
        pp.decode_wav(b"")


# --------------------------------------------------------------------------------------------
# log-mel
# --------------------------------------------------------------------------------------------
def test_slaney_mel_scale_known_points():
    # linear below 1 kHz: 200/3 Hz per mel; 1 kHz = 15 mel; 27 mel per factor 6.4 above
    assert float(pp.hz_to_mel(0.0)) == 0.0
    assert float(pp.hz_to_mel(500.0)) == pytest.approx(7.5)
    assert float(pp.hz_to_mel(1000.0)) == pytest.approx(15.0)
    assert float(pp.hz_to_mel(6400.0)) == pytest.approx(42.0)
    f = np.array([0.0, 100.0, 999.0, 1000.0, 2500.0, 8000.0])
    np.testing.assert_allclose(pp.mel_to_hz(pp.hz_to_mel(f)), f, rtol=1e-10, atol=1e-9)


def test_filterbank_shape_and_triangles():
    fb = pp.mel_filters()
    assert fb.shape == (128, 201) and fb.dtype == np.float32
    assert (fb >= 0).all()
    fft_hz = np.linspace(0, 8000, 201)
    mel_f = pp.mel_to_hz(np.linspace(pp.hz_to_mel(0.0), pp.hz_to_mel(8000.0), 130))
    nonempty = 0
    for m in range(128):
        row = fb[m].astype(np.float64)
        nz = np.nonzero(row)[0]
        if len(nz) == 0:
            continue
        nonempty += 1
        # support is contiguous and inside the triangle's corners
        assert (np.diff(nz) == 1).all()
        assert fft_hz[nz[0]] > mel_f[m] - 1e-6 and fft_hz[nz[-1]] < mel_f[m + 2] + 1e-6
        # rises then falls: the peak bin is the one nearest the centre frequency (within a bin)
        assert abs(fft_hz[int(np.argmax(row))] - mel_f[m + 1]) <= 40.0 + 1e-6
        width_bins = (mel_f[m + 2] - mel_f[m]) / 40.0
        if width_bins >= 6:   # wide triangles are well sampled: area in Hz = 1 (Slaney normalisation)
            assert row.sum() * 40.0 == pytest.approx(1.0, rel=0.03)
    # 128 filters over 0-8 kHz with 40 Hz bins: the narrowest low ones can fall between bins
    assert nonempty >= 120
    centres = [int(np.argmax(fb[m])) for m in range(128) if fb[m].any()]
    assert centres == sorted(centres)


def test_stft_matches_a_direct_dft():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(16000).astype(np.float32)
    p = pp.stft_power(x)
    assert p.shape == (201, 1 + 16000 // 160)
    pad = np.pad(x.astype(np.float64), (200, 200), mode="reflect")
    n = np.arange(400)
    w = 0.5 - 0.5 * np.cos(2 * np.pi * n / 400)
    k = np.arange(201)[:, None]
    dft = np.exp(-2j * np.pi * k * n[None, :] / 400)
    for frame in (0, 37, 100):
        seg = pad[frame * 160: frame * 160 + 400] * w
        ref = np.abs(dft @ seg) ** 2
        np.testing.assert_allclose(p[:, frame], ref, rtol=2e-3, atol=1e-2)


@pytest.mark.parametrize("freq", [1000.0, 3000.0])
def test_sine_energy_lands_in_the_right_mel_bin(freq):
    amp = 0.5
    t = np.arange(pp.N_SAMPLES) / pp.SAMPLE_RATE
    x = (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    lm = pp.log_mel_spectrogram(x)
    assert lm.shape == (128, 3000) and lm.dtype == np.float32
    k = int(freq * pp.N_FFT / pp.SAMPLE_RATE)          # exactly on an FFT bin
    # periodic Hann: |X[k]|^2 = (A N / 4)^2, |X[k +- 1]|^2 = (A N / 8)^2, zero elsewhere
    power = np.zeros(201)
    power[k] = (amp * pp.N_FFT / 4) ** 2
    power[k - 1] = power[k + 1] = (amp * pp.N_FFT / 8) ** 2
    mel = pp.mel_filters().astype(np.float64) @ power
    peak = int(np.argmax(mel))
    assert peak == int(np.argmax(pp.mel_filters()[:, k]))
    expected = (np.log10(mel[peak]) + 4) / 4
    middle = lm[:, 100:2900]
    assert (np.argmax(middle, axis=0) == peak).all()
    np.testing.assert_allclose(middle[peak], expected, atol=2e-4)
    # everything else is clamped at max - 8 (in log10), i.e. 2.0 below the peak after (x + 4) / 4
    assert float(lm.min()) == pytest.approx(float(lm.max()) - 2.0, abs=1e-5)


def test_silence_and_padding():
    lm = pp.log_mel_spectrogram(np.zeros(16000 * 3, dtype=np.float32))
    np.testing.assert_allclose(lm, (np.log10(1e-10) + 4) / 4, atol=1e-6)    # -1.5 everywhere
    t = np.arange(16000 * 5) / 16000
    five = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    lm5 = pp.log_mel_spectrogram(five)
    assert lm5.shape == (128, 3000)
    # after 5 s (frame 500) the padding is silence: clamped to the floor
    np.testing.assert_allclose(lm5[:, 520:], float(lm5.max()) - 2.0, atol=1e-5)
    assert float(lm5[:, 100:400].max()) == pytest.approx(float(lm5.max()))
    # longer than 30 s is trimmed
    long = np.tile(five, 8)
    assert pp.log_mel_spectrogram(long).shape == (128, 3000)


def test_audio_features_from_a_wav_body():
    t = np.arange(16000 * 6) / 16000
    pcm = (0.25 * 32767 * np.sin(2 * np.pi * 1000 * t)).astype("<i2")
    feats, seconds = pp.audio_features(_wav(pcm, 16000))
    assert seconds == pytest.approx(6.0)
    assert feats.shape == (128, 3000)
    assert int(np.argmax(feats[:, 300])) == int(np.argmax(pp.mel_filters()[:, 25]))


def test_matches_transformers_whisper_feature_extractor():
    """The reference: transformers' WhisperFeatureExtractor with large-v3's 128 bins (H200 machine)."""
    tf = pytest.importorskip("transformers", reason="transformers is not installed here (it is on the H200 machine)")
    fe = tf.WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=30,
                                    n_fft=400)
    rng = np.random.default_rng(3)
    t = np.arange(16000 * 12) / 16000
    x = (0.3 * np.sin(2 * np.pi * 523 * t) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)
    ref = fe(x, sampling_rate=16000, return_tensors="np").input_features[0]
    ours = pp.log_mel_spectrogram(x)
    assert ref.shape == ours.shape == (128, 3000)
    np.testing.assert_allclose(ours, ref, atol=2e-3)
    np.testing.assert_allclose(pp.mel_filters(), fe.mel_filters.T, rtol=1e-4, atol=1e-7)


def test_matches_torchaudio_slaney_filterbank():
    ta = pytest.importorskip("torchaudio", reason="torchaudio is not installed here (it is on the H200 machine)")
    fb = ta.functional.melscale_fbanks(n_freqs=201, f_min=0.0, f_max=8000.0, n_mels=128, sample_rate=16000,
                                       norm="slaney", mel_scale="slaney").numpy().T
    np.testing.assert_allclose(pp.mel_filters(), fb, rtol=1e-4, atol=1e-7)


def test_matches_librosa_filterbank():
    librosa = pytest.importorskip("librosa", reason="librosa is not installed here or on the H200 machine")
    np.testing.assert_allclose(pp.mel_filters(), librosa.filters.mel(sr=16000, n_fft=400, n_mels=128),
                               rtol=1e-4, atol=1e-7)


# --------------------------------------------------------------------------------------------
# token ids
# --------------------------------------------------------------------------------------------
def test_token_ids_shape_range_and_determinism():
    a = pp.tokenize("A photo of a cat, sitting on the mat!")
    assert a.shape == (77,) and a.dtype == np.int64
    assert a[0] == pp.BOS_ID
    pieces = ["a", "photo", "of", "a", "cat", ",", "sitting", "on", "the", "mat", "!"]
    assert a[len(pieces) + 1] == pp.EOS_ID and (a[len(pieces) + 1:] == pp.EOS_ID).all()
    body = a[1: len(pieces) + 1]
    assert ((body >= 1) & (body < pp.BOS_ID)).all()
    assert body[0] == body[3]                      # "a" twice, the same id
    assert (pp.tokenize("a PHOTO  of a cat, sitting on the mat!") == a).all()   # case and spacing
    assert not (pp.tokenize("a photo of a dog") == pp.tokenize("a photo of a cat")).all()


def test_long_text_truncated_and_bad_text_refused():
    ids = pp.tokenize(" ".join(["word"] * 200))
    assert ids[0] == pp.BOS_ID and ids[-1] == pp.EOS_ID and (ids[1:-1] != pp.EOS_ID).all()
    with pytest.raises(pp.BadPayload, match="too long"):
        pp.tokenize("x" * (pp.MAX_TEXT_CHARS + 1))
    with pytest.raises(pp.BadPayload, match="must be a string"):
        pp.tokenize(json.loads("123"))
