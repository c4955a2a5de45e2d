"""Load generator: real JPEG, WAV and text payloads over HTTP, open loop, at a set rate, for a duration.

    python -m examples.inference.loadgen --url http://127.0.0.1:8000 --rate 50 --duration 60 \\
        [--arrival poisson|constant] [--mix image=0.5,audio=0.2,text=0.3] [--concurrency 64]

Payloads are made here, with a seed: photo-like JPEGs (640x480 to 1920x1080: smooth colour fields,
shapes with hard edges, sensor-like noise; quality 85-92, so they compress like photographs, about
1-3 bits per pixel), 16 kHz 16-bit mono WAVs of 5-30 s (a voiced, vibrato, syllable-rate modulated
harmonic source over a noise floor, with pauses), and English-like text of 5-40 words.

Open loop: arrivals are scheduled in advance (Poisson or evenly spaced) whatever the server does;
``--concurrency`` sender threads, each with one keep-alive connection, take them in order.  Latency is
measured from an arrival's *scheduled* time to the end of its answer, so a slow server is not
hidden by a client that waits (no coordinated omission).  When every sender is busy and more than
``--max-backlog`` arrivals wait, further arrivals are counted as ``client_overrun`` errors instead
of queueing without bound.

Prints a table on stderr and one JSON line on stdout: sent, ok, errors by kind, p50/p99 (overall
and per route), achieved rate.  As a library: ``run_load(LoadSpec(...))`` returns a ``LoadReport``.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import math
import queue
import sys
import threading
import time
import wave
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

ROUTES = ("image", "audio", "text")
IMAGE_SIZES = ((640, 480), (1024, 768), (1280, 720), (1920, 1080))
_WORDS = ("a photo of the small large red blue green dog cat person street city night day river mountain "
         "car bicycle tree house window light shadow people walking running sitting table chair book "
         "phone computer screen music voice sound quiet loud morning evening rain snow sun cloud sky sea "
         "beach boat train station road bridge market food coffee bread fruit flower garden park child "
         "woman man old young happy busy empty crowded bright dark wooden metal glass stone white black "
         "yellow orange purple near behind under over next to with without in on at by and or but")
WORDS = tuple(_WORDS.split())


# --------------------------------------------------------------------------------------------
# payloads
# --------------------------------------------------------------------------------------------
def synth_image(rng: np.random.Generator, width: int, height: int, quality: int = 88) -> bytes:
    """A photo-like JPEG (see the module docstring)."""
    from PIL import Image, ImageDraw, ImageFilter

    grid = rng.integers(0, 256, size=(max(2, height // 160), max(2, width // 160), 3), dtype=np.uint8)
    img = Image.fromarray(grid, "RGB").resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(8, 30))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1 = min(width, x0 + int(rng.integers(20, max(21, width // 3))))
        y1 = min(height, y0 + int(rng.integers(20, max(21, height // 3))))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = int(rng.integers(0, 3))
        if shape == 0:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        elif shape == 1:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        else:
            draw.line((x0, y0, x1, y1), fill=colour, width=int(rng.integers(2, 12)))
    img = img.filter(ImageFilter.GaussianBlur(radius=1.2))
    arr = np.asarray(img, dtype=np.int16)
    # texture: sensor-like noise, stronger in a few random tiles (foliage, fabric)
    noise = rng.normal(0.0, 3.0, size=arr.shape)
    for _ in range(6):
        ty, tx = int(rng.integers(0, height)), int(rng.integers(0, width))
        noise[ty: ty + height // 4, tx: tx + width // 4] *= 3.0
    arr = np.clip(arr + noise, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def synth_audio(rng: np.random.Generator, seconds: float, rate: int = 16_000) -> bytes:
    """A speech-like 16-bit mono WAV (see the module docstring)."""
    n = int(seconds * rate)
    t = np.arange(n, dtype=np.float64) / rate
    f0 = float(rng.uniform(95, 240)) * (1 + 0.04 * np.sin(2 * np.pi * float(rng.uniform(3, 6)) * t))
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 9))
    syllables = np.abs(np.sin(2 * np.pi * float(rng.uniform(3, 5)) * t + float(rng.uniform(0, 6.28))))
    pauses = (np.sin(2 * np.pi * 0.3 * t + float(rng.uniform(0, 6.28))) > -0.6).astype(np.float64)
    x = voice * syllables * pauses + rng.normal(0, 0.01, n)
    x = 0.5 * x / max(1e-9, float(np.max(np.abs(x))))
    pcm = np.clip(x * 32767, -32768, 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def synth_text(rng: np.random.Generator) -> str:
    n = int(rng.integers(5, 41))
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), n)).capitalize() + "."


@dataclass
class Payloads:
    image: list[bytes]
    audio: list[bytes]
    text: list[bytes]

    def get(self, route: str, i: int) -> bytes:
        pool: list[bytes] = getattr(self, route)
        return pool[i % len(pool)]


def make_payloads(seed: int = 0, images: int = 8, audios: int = 4, texts: int = 32,
                  audio_seconds: tuple[float, float] = (5.0, 30.0),
                  image_sizes: tuple[tuple[int, int], ...] = IMAGE_SIZES) -> Payloads:
    rng = np.random.default_rng(seed)
    imgs = [synth_image(rng, *image_sizes[i % len(image_sizes)], quality=int(rng.integers(85, 93)))
            for i in range(images)]
    auds = [synth_audio(rng, float(rng.uniform(*audio_seconds))) for _ in range(audios)]
    txts = [json.dumps({"text": synth_text(rng)}).encode() for _ in range(texts)]
    return Payloads(imgs, auds, txts)


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------
@dataclass
class LoadSpec:
    url: str
    rate: float = 10.0
    duration: float = 10.0
    arrival: str = "poisson"
    mix: dict[str, float] = field(default_factory=lambda: {"image": 0.5, "audio": 0.2, "text": 0.3})
    concurrency: int = 32
    timeout: float = 30.0
    seed: int = 0
    image_model: str = "vit"          # vit, clip, or mixed (alternating)
    max_backlog: int | None = None    # default 10 x concurrency

    def check(self) -> None:
        if self.rate <= 0 or self.duration <= 0 or self.concurrency < 1:
            raise ValueError("rate and duration must be > 0 and concurrency >= 1")
        if self.arrival not in ("poisson", "constant"):
            raise ValueError(f"arrival: poisson or constant, got {self.arrival!r}")
        bad = [r for r in self.mix if r not in ROUTES]
        if bad or not self.mix or sum(self.mix.values()) <= 0 or min(self.mix.values()) < 0:
            raise ValueError(f"mix: weights >= 0 for {', '.join(ROUTES)}, e.g. image=0.5,audio=0.2,text=0.3")
        if self.image_model not in ("vit", "clip", "mixed"):
            raise ValueError(f"image_model: vit, clip or mixed, got {self.image_model!r}")


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100) of an ascending list; None when empty."""
    if not sorted_values:
        return None
    k = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(k, len(sorted_values)) - 1]


@dataclass
class RouteStats:
    sent: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)   # seconds, successful requests

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def ms(v: float | None) -> float | None:
            return None if v is None else round(v * 1000, 3)
        return {"sent": self.sent, "ok": self.ok, "errors": dict(self.errors), "error_count": sum(self.errors.values()),
                "p50_ms": ms(percentile(lat, 50)), "p99_ms": ms(percentile(lat, 99)),
                "mean_ms": ms(sum(lat) / len(lat) if lat else None), "max_ms": ms(lat[-1] if lat else None)}


@dataclass
class LoadReport:
    spec: LoadSpec
    started: float
    ended: float
    routes: dict[str, RouteStats]

    def to_dict(self) -> dict[str, Any]:
        total = RouteStats()
        for rs in self.routes.values():
            total.sent += rs.sent
            total.ok += rs.ok
            total.errors.update(rs.errors)
            total.latencies.extend(rs.latencies)
        wall = max(1e-9, self.ended - self.started)
        return {"kind": "loadgen", "url": self.spec.url, "rate": self.spec.rate, "arrival": self.spec.arrival,
                "duration_s": round(wall, 3), "start": self.started, "end": self.ended,
                **total.summary(), "achieved_rps": round(total.ok / wall, 3),
                "routes": {r: s.summary() for r, s in self.routes.items() if s.sent}}

    def table(self) -> str:
        d = self.to_dict()
        rows = [("route", "sent", "ok", "errors", "p50 ms", "p99 ms", "max ms")]

        def f(v: Any) -> str:
            return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))
        for r, s in d["routes"].items():
            rows.append((r, f(s["sent"]), f(s["ok"]), f(s["error_count"]), f(s["p50_ms"]), f(s["p99_ms"]),
                         f(s["max_ms"])))
        rows.append(("all", f(d["sent"]), f(d["ok"]), f(d["error_count"]), f(d["p50_ms"]), f(d["p99_ms"]),
                     f(d["max_ms"])))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                 for row in rows]
        errs = ", ".join(f"{k}: {v}" for k, v in sorted(d["errors"].items()))
        lines.append(f"{d['achieved_rps']:.1f} answered/s of {self.spec.rate:g}/s asked over {d['duration_s']:.1f} s"
                     + (f"; errors {errs}" if errs else ""))
        return "\n".join(lines)


def _schedule(spec: LoadSpec, rng: np.random.Generator) -> list[tuple[float, str]]:
    routes = [r for r in ROUTES if spec.mix.get(r, 0) > 0]
    weights = np.array([spec.mix[r] for r in routes], dtype=np.float64)
    weights /= weights.sum()
    out: list[tuple[float, str]] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / spec.rate)) if spec.arrival == "poisson" else 1.0 / spec.rate
        if t >= spec.duration:
            return out
        out.append((t, routes[int(rng.choice(len(routes), p=weights))]))


def _path_for(spec: LoadSpec, route: str, i: int) -> str:
    if route != "image":
        return f"/v1/{route}"
    model = spec.image_model if spec.image_model != "mixed" else ("vit", "clip")[i % 2]
    return f"/v1/image?model={model}"


def _post(conn: http.client.HTTPConnection | None, host: str, port: int, spec: LoadSpec, route: str, i: int,
          body: bytes) -> tuple[http.client.HTTPConnection | None, str | None]:
    """One request on a kept-alive connection (opened when None).  Returns the connection to use
    next (None once closed) and the error kind (None: answered 200)."""
    kind: str | None = None
    try:
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=spec.timeout)
        conn.request("POST", _path_for(spec, route, i), body=body,
                     headers={"Content-Type": "application/json" if route == "text" else
                              ("image/jpeg" if route == "image" else "audio/wav")})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            kind = f"http_{resp.status}"
        if resp.getheader("Connection", "").lower() == "close":
            conn.close()
            conn = None
    except TimeoutError:
        kind = "timeout"
    except (OSError, http.client.HTTPException) as e:
        kind = f"conn_{type(e).__name__}"
    if kind is not None and conn is not None:
        conn.close()
        conn = None
    return conn, kind


def _dispatch(plan: list[tuple[float, str]], t0: float, stop: threading.Event,
              q: queue.Queue[tuple[float, str, int] | None], max_backlog: int, stats: dict[str, RouteStats],
              lock: threading.Lock) -> None:
    """Each planned request queued for the senders at its time (open loop: one the senders are too
    far behind for is counted as a client overrun, not sent late); until ``stop``."""
    for n, (offset, route) in enumerate(plan):
        due = t0 + offset
        while not stop.is_set():
            left = due - time.monotonic()
            if left <= 0:
                break
            stop.wait(min(left, 0.05))
        if stop.is_set():
            return
        with lock:
            stats[route].sent += 1
            if q.qsize() > max_backlog:
                stats[route].errors["client_overrun"] += 1
                continue
        q.put((due, route, n))


def run_load(spec: LoadSpec, payloads: Payloads | None = None, stop: threading.Event | None = None) -> LoadReport:
    """Drive ``spec.url`` for ``spec.duration`` seconds (or until ``stop`` is set) and report."""
    spec.check()
    payloads = payloads or make_payloads(spec.seed)
    rng = np.random.default_rng(spec.seed + 1)
    plan = _schedule(spec, rng)
    parts = urlsplit(spec.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    stats = {r: RouteStats() for r in ROUTES}
    lock = threading.Lock()
    q: queue.Queue[tuple[float, str, int] | None] = queue.Queue()
    stop = stop or threading.Event()
    max_backlog = spec.max_backlog if spec.max_backlog is not None else 10 * spec.concurrency

    def sender() -> None:
        conn: http.client.HTTPConnection | None = None
        while True:
            item = q.get()
            if item is None:
                break
            due, route, i = item
            conn, kind = _post(conn, host, port, spec, route, i, payloads.get(route, i))
            done = time.monotonic()
            with lock:
                s = stats[route]
                if kind is None:
                    s.ok += 1
                    s.latencies.append(done - due)
                else:
                    s.errors[kind] += 1
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=sender, name=f"loadgen-{i}", daemon=True) for i in range(spec.concurrency)]
    for t in threads:
        t.start()
    started_wall = time.time()
    t0 = time.monotonic()
    _dispatch(plan, t0, stop, q, max_backlog, stats, lock)
    while not stop.is_set() and time.monotonic() < t0 + spec.duration:   # the run lasts its duration
        stop.wait(min(0.05, max(0.0, t0 + spec.duration - time.monotonic())))
    for _ in threads:
        q.put(None)
    for t in threads:
        t.join(spec.timeout + 5)
    return LoadReport(spec=spec, started=started_wall, ended=time.time(), routes=stats)


def parse_mix(text: str) -> dict[str, float]:
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"mix: expected ROUTE=WEIGHT, got {part!r}")
        k, v = part.split("=", 1)
        mix[k.strip()] = float(v)
    return mix


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--rate", type=float, default=10.0, help="requests per second, all routes together")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds")
    ap.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    ap.add_argument("--mix", default="image=0.5,audio=0.2,text=0.3")
    ap.add_argument("--image-model", choices=("vit", "clip", "mixed"), default="vit")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--max-backlog", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--audio-seconds", default="5,30", help="min,max length of the WAV payloads")
    args = ap.parse_args(argv)
    try:
        lo, hi = (float(x) for x in args.audio_seconds.split(","))
        spec = LoadSpec(url=args.url, rate=args.rate, duration=args.duration, arrival=args.arrival,
                        mix=parse_mix(args.mix), concurrency=args.concurrency, timeout=args.timeout, seed=args.seed,
                        image_model=args.image_model, max_backlog=args.max_backlog)
        spec.check()
    except ValueError as e:
        print(f"loadgen: {e}", file=sys.stderr)
        return 2
    report = run_load(spec, make_payloads(args.seed, audio_seconds=(lo, hi)))
    print(report.table(), file=sys.stderr)
    print(json.dumps(report.to_dict()), flush=True)
    d = report.to_dict()
    return 0 if d["ok"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
