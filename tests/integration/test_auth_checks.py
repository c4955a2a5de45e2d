"""The queue of password checks behind basic auth (``triscope.web.auth.CheckQueue``) with real bcrypt
hashes, on a real event loop: who goes first, what a spray may spend, joined checks, addresses whose
checks keep being refused; and the verified credentials a reload keeps."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from pathlib import Path

from tls_support import bcrypt_hash

from triscope.web.auth import BasicAuth, CheckQueue
from triscope.web.config import load


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class _Recorded:
    """A real BasicAuth, with the order its bcrypt checks ran in; a password named in ``hold`` waits
    for its event before it is checked (to keep a hashing thread busy)."""

    def __init__(self, auth: BasicAuth) -> None:
        self.auth = auth
        self.order: list[str] = []
        self.hold: dict[str, threading.Event] = {}

    def __call__(self, header: str | None) -> bool:
        password = base64.b64decode((header or "x y").split()[1]).decode().split(":", 1)[1]
        self.order.append(password)
        if password in self.hold:
            self.hold[password].wait(10)
        return self.auth.check(header)


def test_a_first_ask_goes_before_64_sprayers_and_finds_the_reserve() -> None:
    """64 addresses each asking 6 times (wrong passwords), the queue full and the budget spent down to
    what the spray may spend; then a scraper's first ask from an address of its own: it runs next
    (after the one running), with the reserve still there, and is answered True."""
    auth = _Recorded(BasicAuth({"prometheus": bcrypt_hash("right", rounds=8)}))
    q = CheckQueue(auth, budget=0.05, burst=0.5, reserve=0.3)

    async def go() -> tuple[bool | str, list[bool | str], float, int, float]:
        t_start = time.monotonic()
        spray = []
        for round_ in range(6):
            for i in range(64):
                spray.append(asyncio.ensure_future(q.submit(f"10.0.0.{i}", _basic("prometheus", f"w{round_}-{i}"))))
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        ran = len(auth.order)                          # checks started so far (one may be running)
        t0 = time.monotonic()
        right = await q.submit("10.9.9.9", _basic("prometheus", "right"))
        took = time.monotonic() - t0
        answers = await asyncio.gather(*spray)
        return right, answers, took, ran, time.monotonic() - t_start

    right, answers, took, ran, elapsed = asyncio.run(go())
    q.close()
    assert right is True and took < 1.0, took
    assert auth.order.index("right") == ran, (ran, auth.order)   # the next to start, whatever waited before it
    refused = [a for a in answers if isinstance(a, str)]
    assert len(refused) > 300, len(refused)            # most of the spray refused (429), never hashed
    assert q.cpu <= 0.5 + 0.05 * elapsed + 2 * q.cost, (q.cpu, elapsed)   # burst + rate x time (+ one over)


def test_the_order_is_by_what_an_address_asked() -> None:
    """Checks wait in the order of their addresses' asks (trusted first), not of arrival; both hashing
    threads held busy meanwhile."""
    auth = _Recorded(BasicAuth({"prometheus": bcrypt_hash("right", rounds=4)}))
    q = CheckQueue(auth, budget=1e6, max_waiting=16, per_source=16)

    async def both_busy(a: str, b: str) -> list[asyncio.Task[bool | str]]:
        auth.hold = {a: threading.Event(), b: threading.Event()}
        held = [asyncio.ensure_future(q.submit(f"10.1.0.{len(auth.order)}", _basic("prometheus", a)))]
        await asyncio.sleep(0.05)
        held.append(asyncio.ensure_future(q.submit(f"10.2.0.{len(auth.order)}", _basic("prometheus", b))))
        await asyncio.sleep(0.05)
        assert auth.order[-2:] == [a, b], auth.order     # lane 0 and the first-ask lane, both taken
        return held

    async def release(a: str, b: str) -> None:
        """Lane 0 first: the best waiting check takes it alone (the next waits for a lane)."""
        auth.hold[a].set()
        await asyncio.sleep(0.1)
        auth.hold[b].set()

    async def go() -> None:
        held = await both_busy("busy", "busy-first")
        waiting = []
        for i in range(5):
            waiting.append(asyncio.ensure_future(q.submit("10.0.0.2", _basic("prometheus", f"heavy{i}"))))
            await asyncio.sleep(0)
        waiting.append(asyncio.ensure_future(q.submit("10.0.0.3", _basic("prometheus", "light"))))
        await asyncio.sleep(0.05)
        await release(a="busy", b="busy-first")
        await asyncio.gather(*held, *waiting)
        assert auth.order[2] == "light", auth.order     # asked once: before the address that asked five times
        # a right password makes its address trusted: first from then on, even after it asked more
        assert await q.submit("10.0.0.7", _basic("prometheus", "right")) is True
        for _ in range(5):
            assert await q.submit("10.0.0.7", _basic("prometheus", "right")) is True
        held = await both_busy("busy2", "busy2-first")
        other = asyncio.ensure_future(q.submit("10.0.0.8", _basic("prometheus", "new")))
        await asyncio.sleep(0)
        trusted = asyncio.ensure_future(q.submit("10.0.0.7", _basic("prometheus", "right-again")))
        await asyncio.sleep(0.05)
        await release(a="busy2", b="busy2-first")
        await asyncio.gather(*held, other, trusted)
        assert auth.order[-2:] == ["right-again", "new"], auth.order

    asyncio.run(go())
    q.close()


def test_the_same_credentials_asked_twice_run_bcrypt_once() -> None:
    auth = BasicAuth({"prometheus": bcrypt_hash("right", rounds=8)})
    q = CheckQueue(auth.check)

    async def go() -> list[bool | str]:
        h = _basic("prometheus", "right")
        return list(await asyncio.gather(q.submit("10.0.0.1", h), q.submit("10.0.0.2", h), q.submit("10.0.0.1", h)))

    assert asyncio.run(go()) == [True, True, True]
    assert auth.bcrypt_calls == 1
    q.close()


def test_an_address_refused_again_and_again_is_screened_before_tls_but_a_trusted_one_never() -> None:
    auth = BasicAuth({"prometheus": bcrypt_hash("right", rounds=4)})
    now = [1000.0]
    q = CheckQueue(auth.check, per_source=1, budget=1e-9, burst=0.0, clock=lambda: now[0])

    async def go() -> None:
        pending = [asyncio.ensure_future(q.submit("10.0.0.1", _basic("prometheus", "w0")))]
        await asyncio.sleep(0)
        for i in range(10):   # one waits (no budget); the rest are refused at once
            assert isinstance(await q.submit("10.0.0.1", _basic("prometheus", f"w{i + 1}")), str)
        for p in pending:
            p.cancel()

    asyncio.run(go())
    assert q.screen("10.0.0.2")                      # another address: untouched
    assert [q.screen("10.0.0.1") for _ in range(4)] == [False] * 4   # no new connection's TLS for it now
    now[0] += 1.0
    assert q.screen("10.0.0.1") and not q.screen("10.0.0.1")           # one a second
    q._sources["10.0.0.1"].trusted = True            # a right password came from it once (a shared NAT)
    assert all(q.screen("10.0.0.1") for _ in range(4))
    q.close()


def test_a_reload_keeps_what_was_verified_against_a_hash_it_keeps(tmp_path: Path) -> None:
    """A reload that leaves a user's hash as it was keeps its verified password (no bcrypt for the
    next scrape); one that changes the hash starts from nothing for that user."""
    import os

    hashes = {"prometheus": bcrypt_hash("right", rounds=4), "other": bcrypt_hash("x", rounds=4)}
    cfg = tmp_path / "web.yml"

    def write(users: dict[str, str]) -> None:
        before = cfg.stat().st_mtime_ns if cfg.exists() else 0
        cfg.write_text("basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items()))
        os.utime(cfg, ns=(before + 2_000_000_000, before + 2_000_000_000))

    write(hashes)
    web = load(cfg)
    assert web.authorized(_basic("prometheus", "right")) and web.authorized(_basic("other", "x"))
    write({**hashes, "other": bcrypt_hash("y", rounds=4)})   # other's password changed, not prometheus's
    assert web.refresh() == "reloaded"
    assert web.lookup(_basic("prometheus", "right")) is True          # kept: answered without bcrypt
    assert web.lookup(_basic("other", "x")) is None                    # its hash changed: checked again
    assert web.auth is not None and web.auth.bcrypt_calls == 0
    assert web.authorized(_basic("other", "x")) is False
