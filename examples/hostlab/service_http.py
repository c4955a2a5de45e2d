"""An HTTP inference service: intake threads take requests, one GPU worker thread batches them.

    python -m examples.hostlab.service_http --name lab-b --port 47841 --model convnext_tiny --poll spin
    python -m examples.hostlab.service_http --name lab-b --port 47841 --upstream 127.0.0.1:47812 --fetch-bytes 65536
    python -m examples.hostlab.service_http --name lab-b --port 47841 --decode-pool 8 --backend sim

The shape of many hand-written model servers: ``http.server.ThreadingHTTPServer`` (a thread per
client connection, HTTP/1.1 keep-alive) answers ``POST /infer`` with a JPEG body.  The handler
fetches what the request refers to from an upstream dependency when ``--upstream`` is given (a
blob server speaking ``<bytes>\\n`` -> bytes, one kept-open connection per handler thread), decodes
the JPEG to 224x224 (inline, or on a ``--decode-pool`` of threads), puts the job on a
``queue.Queue`` and waits for its result.  One worker thread owns the model: it takes a job,
gathers more for up to ``--max-wait-ms`` (at most ``--batch``), runs the batch and hands each
handler its answer.  ``--poll block`` waits in ``Queue.get``; ``--poll spin`` polls
``get_nowait()`` in a tight loop with no sleep (a "low-latency" worker, seen in the wild: it keeps
a core busy while there is nothing to do).

Names itself ``--name``; prints ``ready`` once the model is warm and the port listens.
"""

from __future__ import annotations

import argparse
import json
import queue
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import backend


@dataclass
class Job:
    image: Any
    done: threading.Event = field(default_factory=threading.Event)
    result: int = -1


class Upstream:
    """One kept-open connection per thread to the blob server; ``fetch(n)`` reads n bytes."""

    def __init__(self, addr: str, size: int) -> None:
        host, _, port = addr.rpartition(":")
        self.addr, self.size = (host, int(port)), size
        self.local = threading.local()

    def fetch(self) -> int:
        for attempt in range(3):
            s = getattr(self.local, "sock", None)
            try:
                if s is None:
                    s = self.local.sock = socket.create_connection(self.addr, timeout=30)
                s.sendall(f"{self.size}\n".encode())
                got = 0
                while got < self.size:
                    chunk = s.recv(min(1 << 20, self.size - got))
                    if not chunk:
                        raise ConnectionError("upstream closed the connection")
                    got += len(chunk)
                return got
            except OSError:
                self.local.sock = None
                if attempt == 2:
                    raise
        return 0


def gather(q: queue.Queue[Job], batch: int, max_wait: float, spin: bool) -> list[Job]:
    """One batch: the first job (waited for), then whatever arrives within ``max_wait``."""
    if spin:
        while True:
            try:
                jobs = [q.get_nowait()]
                break
            except queue.Empty:
                continue
    else:
        jobs = [q.get()]
    end = time.monotonic() + max_wait
    while len(jobs) < batch:
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            jobs.append(q.get_nowait() if spin else q.get(timeout=left))
        except queue.Empty:
            if not spin:
                break
    return jobs


def worker(model: Any, q: queue.Queue[Job], args: argparse.Namespace) -> None:
    import numpy as np

    spin = args.poll == "spin"
    while True:
        jobs = gather(q, args.batch, args.max_wait_ms / 1000.0, spin)
        out = model.infer(np.stack([j.image for j in jobs]))
        for j, c in zip(jobs, out, strict=True):
            j.result = int(c)
            j.done.set()


def handler(q: queue.Queue[Job], upstream: Upstream | None, pool: ThreadPoolExecutor | None) -> type:
    class Infer(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            return

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                if upstream is not None:
                    upstream.fetch()
                img = pool.submit(backend.decode, body).result() if pool is not None else backend.decode(body)
            except Exception as e:  # noqa: BLE001 - a bad request or a lost upstream is the client's 5xx
                self._reply(502, {"error": str(e)})
                return
            job = Job(img)
            q.put(job)
            job.done.wait()
            self._reply(200, {"class": job.result})

        def _reply(self, code: int, obj: dict[str, Any]) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Infer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--poll", choices=("block", "spin"), default="block")
    ap.add_argument("--upstream", default="", help="HOST:PORT of the blob server each request fetches from")
    ap.add_argument("--fetch-bytes", type=int, default=65536)
    ap.add_argument("--decode-pool", type=int, default=0, help="decode on a pool of this many threads (0: inline)")
    backend.add_args(ap)
    args = ap.parse_args(argv)
    backend.set_comm(args.name)
    model = backend.load(args, args.batch)
    q: queue.Queue[Job] = queue.Queue()
    threading.Thread(target=worker, args=(model, q, args), daemon=True, name="gpu-worker").start()
    upstream = Upstream(args.upstream, args.fetch_bytes) if args.upstream else None
    pool = ThreadPoolExecutor(args.decode_pool, thread_name_prefix="decode") if args.decode_pool > 0 else None
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 128
    srv = ThreadingHTTPServer(("127.0.0.1", args.port), handler(q, upstream, pool))
    print("ready", flush=True)
    try:
        srv.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
