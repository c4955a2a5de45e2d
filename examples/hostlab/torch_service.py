"""A stock PyTorch inference service for the H200 lab: a real ``DataLoader``, a real model, a real GPU.

    python -m examples.hostlab.torch_service --name lab-b --model resnet18 --batch 32 --workers 2 --image 1024

Written the way serving and batch-inference code is usually written, nothing tuned for triscope:
a ``torch.utils.data.Dataset`` whose ``__getitem__`` fetches the request's payload over TCP
(``--fetch``: one connection per loader worker, to a blob server) and decodes a JPEG of
``--image`` pixels a side with PIL, resized to 224x224; a stock ``DataLoader`` (``--workers`` worker
processes, ``pin_memory=True``) batches them; the main process copies each batch to the GPU and runs
a torchvision model (random weights, bf16 autocast) on it.  ``--rate`` paces requests per second
(0: as fast as the loader delivers).  ``--worker-cpus`` confines the loader workers to those CPUs
(``worker_init_fn``), as a mis-set affinity or a container's cpuset does.  ``--gpu-input`` skips the
loader entirely (inputs made on the GPU): the GPU is the only limit.

The process names itself ``--name`` (its comm; the workers inherit it), which is how the agent
labels it off Kubernetes.  It prints ``ready`` once the model ran its first batch.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import os
import socket
import sys
import time
from typing import Any


def set_comm(name: str) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)       # PR_SET_NAME


def requests(args: argparse.Namespace, jpeg: bytes) -> Any:
    """The requests as a ``Dataset``: each item fetches its payload (``--fetch``) and decodes ``jpeg``
    to a 224x224 float tensor."""
    import numpy as np
    import torch
    from PIL import Image

    fetch_addr = None
    if args.fetch:
        host, _, port = args.fetch.rpartition(":")
        fetch_addr = (host, int(port))

    class Requests(torch.utils.data.Dataset):
        conn: socket.socket | None = None

        def __len__(self) -> int:
            return 10**9

        def _fetch(self) -> None:
            assert fetch_addr is not None
            if self.conn is None:          # one connection per worker process
                self.conn = socket.create_connection(fetch_addr, timeout=60)
            self.conn.sendall(f"{args.fetch_bytes}\n".encode())
            got = 0
            while got < args.fetch_bytes:
                chunk = self.conn.recv(min(1 << 20, args.fetch_bytes - got))
                if not chunk:
                    raise ConnectionError("blob server closed the connection")
                got += len(chunk)

        def __getitem__(self, i: int) -> Any:
            if fetch_addr is not None:
                self._fetch()
            img = Image.open(io.BytesIO(jpeg)).convert("RGB").resize((224, 224), Image.Resampling.BILINEAR)
            t = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)
            return t.float().div_(255.0)

    return Requests()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--model", default="resnet18", help="a torchvision classification model (random weights)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--image", type=int, default=512, help="side of the JPEG each item decodes")
    ap.add_argument("--rate", type=float, default=0.0, help="requests/s (0: as fast as the loader delivers)")
    ap.add_argument("--fetch", default="", help="HOST:PORT of a blob server each item's payload comes from")
    ap.add_argument("--fetch-bytes", type=int, default=65536)
    ap.add_argument("--worker-cpus", default="", help="comma-separated CPUs the loader workers are confined to")
    ap.add_argument("--gpu-input", action="store_true", help="no loader: inputs made on the GPU")
    args = ap.parse_args(argv)
    set_comm(args.name)

    import numpy as np
    import torch
    import torchvision
    from PIL import Image

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    model: Any = getattr(torchvision.models, args.model)(weights=None).to(dev).eval()
    model = model.to(memory_format=torch.channels_last)

    def run(x: Any) -> None:
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(x)
        torch.cuda.synchronize()

    run(torch.randn(args.batch, 3, 224, 224, device=dev).to(memory_format=torch.channels_last))
    if args.gpu_input:
        x = torch.randn(args.batch, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        run(x)
        print("ready", flush=True)
        while True:
            run(x)

    rng = np.random.default_rng(7)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (args.image, args.image, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    jpeg = buf.getvalue()
    worker_cpus = {int(c) for c in args.worker_cpus.split(",") if c.strip()}

    def init(_: int) -> None:
        if worker_cpus:
            os.sched_setaffinity(0, worker_cpus)

    loader = torch.utils.data.DataLoader(requests(args, jpeg), batch_size=args.batch, num_workers=args.workers,
                                         pin_memory=True, worker_init_fn=init, shuffle=False)
    it = iter(loader)
    run(next(it).to(dev, non_blocking=True).to(memory_format=torch.channels_last))
    print("ready", flush=True)
    t0 = time.monotonic()
    n = 0
    while True:
        if args.rate > 0:
            delay = t0 + n * args.batch / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        batch = next(it)
        run(batch.to(dev, non_blocking=True).to(memory_format=torch.channels_last))
        n += 1


if __name__ == "__main__":
    sys.exit(main())
