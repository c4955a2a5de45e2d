"""A video decoder container: the frames of an MJPEG stream decoded and written raw into a named pipe.

    python -m examples.hostlab.framedecoder --name lab-a-decode --fifo /run/frames/frames.fifo --width 1920 --height 1080
    python -m examples.hostlab.framedecoder --name lab-a-decode --fifo /run/frames/frames.fifo --fps 25

The shape of a video-analytics pod: a decoder container (ffmpeg's place: here PIL on the JPEG
frames of a recorded MJPEG stream) writes each frame, resized to 224x224 RGB (150,528 bytes of
uint8), into a named pipe in a volume both containers mount (an emptyDir); the inference container
(``video_service.py``) reads them.  One decode thread, as a single ffmpeg decoder runs: as fast as
the reader takes the frames (``--fps 0``, recorded footage) or at the camera's rate (``--fps N``).
The pipe is made if missing; the decoder prints ``ready`` once it exists and the stream's frames are
loaded, then opens it, which waits for the reader.  A reader that goes away is waited for again.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import stat
import sys
import time

from .backend import IMAGE, set_comm

FRAME_BYTES = IMAGE * IMAGE * 3


def frames(width: int, height: int, count: int = 12, seed: int = 5) -> list[bytes]:
    """``count`` JPEG frames of ``width`` x ``height`` (noise over a moving gradient, quality 90: as
    costly to decode as camera footage, more than a flat test pattern)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        ramp = ((np.arange(width, dtype=np.float32) + 37 * k) % width) * (96.0 / width)
        img = rng.integers(0, 160, (height, width, 3), dtype=np.uint8) + ramp[None, :, None].astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def make_fifo(path: str) -> None:
    """The named pipe at ``path`` (made by whichever of the two containers comes first)."""
    try:
        os.mkfifo(path, 0o666)
    except FileExistsError:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            raise SystemExit(f"{path} exists and is not a FIFO") from None


def decode(jpeg: bytes) -> bytes:
    from PIL import Image

    img = Image.open(io.BytesIO(jpeg)).convert("RGB").resize((IMAGE, IMAGE), Image.Resampling.BILINEAR)
    return img.tobytes()


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--fifo", required=True, help="the named pipe the frames go into")
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--fps", type=float, default=0.0, help="frames per second (0: as fast as the reader takes them)")
    args = ap.parse_args(argv)
    set_comm(args.name)
    stream = frames(args.width, args.height)
    make_fifo(args.fifo)
    print("ready", flush=True)
    n = 0
    t0 = time.monotonic()
    while True:
        fd = os.open(args.fifo, os.O_WRONLY)          # waits for the reader
        try:
            while True:
                if args.fps > 0:
                    delay = t0 + n / args.fps - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                write_all(fd, decode(stream[n % len(stream)]))
                n += 1
        except BrokenPipeError:
            pass                                       # the reader went away: wait for the next one
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
