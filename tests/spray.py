"""Hostile clients against a TLS listener with basic auth, run in a process of their own so that the
listener's process and the one measuring it stay apart: a **password spray** (new wrong passwords
from many source addresses, each on a fresh TLS connection, at a paced rate) and **tricklers** (a
request head a byte at a time, connections held open sending nothing) from one address.

    python tests/spray.py spray --port P --ca CA --rate 160 --sources 64 --seconds 20 [--out FILE]
    python tests/spray.py trickle --port P --ca CA --source 127.0.0.1 --conns 48 --seconds 20

Loopback lets a client bind any 127.0.0.x, so 64 sources need no network set-up.  What was sent
and what came back is written as JSON to ``--out`` (or stdout) when the time is up or on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import secrets
import signal
import ssl
import sys
import time
from collections import Counter


def _basic(user: str, password: str) -> bytes:
    return base64.b64encode(f"{user}:{password}".encode())


def _context(ca: str | None) -> ssl.SSLContext | None:
    if not ca:
        return None
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False   # the certificate names 127.0.0.1; clients bound to 127.0.0.x see the same
    return ctx


async def _one(port: int, ctx: ssl.SSLContext | None, source: str, user: str, stats: Counter[str],
               wait: float) -> None:
    """One wrong password on a fresh connection; the answer waited for at most ``wait`` seconds."""
    writer = None
    stage = "connect"
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=ctx, local_addr=(source, 0),
                                    server_hostname="127.0.0.1" if ctx else None), 5.0)
        stage = "send"
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic "
                     + _basic(user, secrets.token_hex(8)) + b"\r\nConnection: close\r\n\r\n")
        await writer.drain()
        stats["sent"] += 1
        stage = "answer"
        line = await asyncio.wait_for(reader.readline(), wait)
        parts = line.split()
        stats[parts[1].decode() if len(parts) > 1 else "eof"] += 1
    except TimeoutError:
        stats[f"{stage}: timed out"] += 1
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as e:
        stats[f"{stage}: {type(e).__name__}"] += 1
    finally:
        if writer is not None:
            writer.transport.abort()


async def spray(port: int, ctx: ssl.SSLContext | None, rate: float, sources: int, seconds: float,
                first_source: int, user: str, wait: float, stop: asyncio.Event) -> dict[str, object]:
    """``rate`` wrong passwords a second in all, spread over ``sources`` addresses (127.0.0.N...),
    each on a fresh connection; paced on one schedule, so a slow answer never lowers the rate."""
    stats: Counter[str] = Counter()
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.monotonic()
    n = 0
    while not stop.is_set() and time.monotonic() - t0 < seconds:
        due = t0 + n / rate
        delay = due - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            continue
        source = f"127.0.{(first_source + n % sources) // 256}.{(first_source + n % sources) % 256}"
        t = asyncio.create_task(_one(port, ctx, source, user, stats, wait))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
        n += 1
    elapsed = time.monotonic() - t0
    if tasks:
        await asyncio.wait(tasks, timeout=wait + 5.0)
    # offered: new connections a second, each to send a new wrong password; sent: those that got to
    # send it (the rest were closed by the server before or during the TLS handshake)
    return {"elapsed": elapsed, "started": n, "offered": n / elapsed if elapsed else 0.0,
            "rate": stats["sent"] / elapsed if elapsed else 0.0, **stats}


async def _trickler(port: int, ctx: ssl.SSLContext | None, source: str, gap: float, hold: bool,
                    stats: Counter[str], stop: asyncio.Event) -> None:
    """A connection that sends a request head a byte every ``gap`` seconds (``hold``: nothing at
    all), opened again whenever the server closes it."""
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 100_000
    while not stop.is_set():
        writer = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, ssl=ctx, local_addr=(source, 0),
                                        server_hostname="127.0.0.1" if ctx else None), 5.0)
            stats["opened"] += 1
            i = 0
            while not stop.is_set():
                if not hold:
                    writer.write(head[i:i + 1])
                    i += 1
                    await writer.drain()
                with contextlib.suppress(TimeoutError):
                    if await asyncio.wait_for(reader.read(4096), gap) == b"":
                        break
        except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            if writer is not None:
                writer.transport.abort()
            stats["closed"] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)


async def trickle(port: int, ctx: ssl.SSLContext | None, source: str, conns: int, seconds: float, gap: float,
                  stop: asyncio.Event) -> dict[str, object]:
    """``conns`` connections from ``source``: half trickle a request head, half are held open idle."""
    stats: Counter[str] = Counter()
    tasks = [asyncio.create_task(_trickler(port, ctx, source, gap, i % 2 == 1, stats, stop)) for i in range(conns)]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    stop.set()
    await asyncio.wait(tasks, timeout=gap + 5.0)
    return dict(stats)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("spray", "trickle"))
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ca", help="the CA to trust (TLS); none: plain HTTP")
    p.add_argument("--rate", type=float, default=160.0, help="spray: wrong passwords a second in all")
    p.add_argument("--sources", type=int, default=64, help="spray: source addresses, from 127.0.0.FIRST on")
    p.add_argument("--first", type=int, default=10, help="spray: the first source's last byte")
    p.add_argument("--user", default="prometheus")
    p.add_argument("--wait", type=float, default=2.0, help="spray: seconds an answer is waited for")
    p.add_argument("--source", default="127.0.0.1", help="trickle: the address the tricklers share")
    p.add_argument("--conns", type=int, default=48, help="trickle: connections")
    p.add_argument("--gap", type=float, default=0.2, help="trickle: seconds between two bytes")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--out")
    a = p.parse_args(argv)

    async def go() -> dict[str, object]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        ctx = _context(a.ca)
        if a.mode == "spray":
            return await spray(a.port, ctx, a.rate, a.sources, a.seconds, a.first, a.user, a.wait, stop)
        return await trickle(a.port, ctx, a.source, a.conns, a.seconds, a.gap, stop)

    result = asyncio.run(go())
    text = json.dumps(result)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
