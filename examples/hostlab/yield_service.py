"""An asyncio HTTP inference service whose GPU worker busy-polls a ring, yielding the CPU between polls.

    python -m examples.hostlab.yield_service --name lab-b --port 47842 --model mnasnet0_5
    python -m examples.hostlab.yield_service --name lab-b --port 47842 --backend sim

The shape of a "low-latency" server written on asyncio: one event loop speaks HTTP/1.1 keep-alive
(``POST /infer`` with a JPEG body; a small hand-written parser, as minimal servers have), decodes the
body on the loop's default thread pool and appends the job to a ``collections.deque``.  One worker
thread owns the model and polls the deque without ever blocking: when it is empty it calls
``os.sched_yield()`` and looks again (no lock, no condition variable: "a wakeup costs more than a
poll"), so it runs whenever no other thread wants its CPU.  It takes up to ``--batch`` jobs, runs
them (``backend.py``) and hands each answer back to the loop (``call_soon_threadsafe``).  Names itself
``--name``; prints ``ready`` once the model is warm and the port listens.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import threading
from typing import Any

from . import backend

Job = tuple[Any, asyncio.Future[int], asyncio.AbstractEventLoop]


def worker(model: Any, ring: collections.deque[Job], batch: int) -> None:
    import numpy as np

    while True:
        if not ring:
            os.sched_yield()
            continue
        jobs = [ring.popleft()]
        while ring and len(jobs) < batch:
            jobs.append(ring.popleft())
        out = model.infer(np.stack([j[0] for j in jobs]))
        for (_, fut, loop), c in zip(jobs, out, strict=True):
            loop.call_soon_threadsafe(_settle, fut, int(c))


def _settle(fut: asyncio.Future[int], value: int) -> None:
    if not fut.done():
        fut.set_result(value)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ring: collections.deque[Job]) -> None:
    loop = asyncio.get_running_loop()
    try:
        while True:
            request = await reader.readline()
            if not request:
                break
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length)
            try:
                img = await loop.run_in_executor(None, backend.decode, body)
            except Exception as e:  # noqa: BLE001 - a body that is no image is the client's 400
                await reply(writer, 400, {"error": str(e)})
                continue
            fut: asyncio.Future[int] = loop.create_future()
            ring.append((img, fut, loop))
            await reply(writer, 200, {"class": await fut})
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def reply(writer: asyncio.StreamWriter, code: int, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    reason = "OK" if code == 200 else "Bad Request"
    writer.write(f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                 .encode() + data)
    await writer.drain()


async def serve(port: int, ring: collections.deque[Job]) -> None:
    srv = await asyncio.start_server(lambda r, w: handle(r, w, ring), "127.0.0.1", port, backlog=128)
    print("ready", flush=True)
    async with srv:
        await srv.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--batch", type=int, default=8)
    backend.add_args(ap, model="mnasnet0_5")
    args = ap.parse_args(argv)
    backend.set_comm(args.name)
    model = backend.load(args, args.batch)
    ring: collections.deque[Job] = collections.deque()
    threading.Thread(target=worker, args=(model, ring, args.batch), daemon=True, name="gpu-worker").start()
    asyncio.run(serve(args.port, ring))
    return 0


if __name__ == "__main__":
    sys.exit(main())
