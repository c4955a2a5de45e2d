"""What the Chromium dashboard tests share: the Debian Chromium they drive and stopping a dashboard
process that must not have logged a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import REPO, free_port, wait_for_port

from triscope.store import Store

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextmanager
def chromium() -> Iterator[Any]:
    """The real headless Chromium (Debian's, which make test installs) under Playwright."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian chromium is not installed (make test installs it)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def stop_checked(proc: subprocess.Popen[bytes]) -> None:
    """Stop a dashboard process; a callback that raised would have logged a traceback: fail then."""
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    assert b"Traceback" not in out, out.decode(errors="replace")[-3000:]


@contextmanager
def dashboard_over(url: str, *extra: str) -> Iterator[tuple[str, Any]]:
    """``triscope dashboard`` over the store at ``url`` (no password: loopback) and that store opened
    for the test's own reads: (base URL, store); the process is stopped and checked afterwards."""
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRISCOPE_DASHBOARD_PASSWORD", None)
    exe = os.path.join(os.path.dirname(sys.executable), "triscope")
    proc = subprocess.Popen([exe, "dashboard", "--db", url, "--port", str(port), *extra], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    st = Store.open(url)
    try:
        wait_for_port(port, timeout=60)
        yield f"http://127.0.0.1:{port}", st
    finally:
        st.close()
        stop_checked(proc)
