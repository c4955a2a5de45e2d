"""Take the README's screenshot: `triscope run` on a fresh store (the recorded H200 trace as a
second node), the Node page of that node in headless Chromium, saved as a PNG.

    .venv/bin/python scripts/screenshot.py [OUT.png]      # default docs/img/node-page.png
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "img" / "node-page.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as td:
        dash, metrics, hook = _port(), _port(), _port()
        triscope = Path(sys.executable).parent / "triscope"
        proc = subprocess.Popen([str(triscope), "run", "--dashboard", f"127.0.0.1:{dash}", "--metrics-listen",
                                 f"127.0.0.1:{metrics}", "--webhook", f"127.0.0.1:{hook}", "--no-ebpf"],
                                cwd=td, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "TRISCOPE_SPOOL_DIR": f"{td}/spool"})
        try:
            node = None
            deadline = time.monotonic() + 120
            assert proc.stdout is not None
            while time.monotonic() < deadline and node is None:
                line = proc.stdout.readline()
                if not line:
                    raise SystemExit(f"triscope run exited ({proc.poll()})")
                if "imported as node '" in line:
                    node = line.split("imported as node '", 1)[1].split("'", 1)[0]
                if line.strip().startswith("dashboard:"):
                    break
            while time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{dash}/", timeout=2)
                    break
                except OSError:
                    time.sleep(0.5)
            node = node or "h200"
            from triscope.store import Store

            st = Store.open(f"sqlite:///{td}/triscope.db")
            bounds = st.time_bounds(node)
            st.close()
            span = "?range=15m" if bounds is None else f"?start={bounds[0] - 5:.0f}&end={bounds[1] + 5:.0f}"
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page = b.new_page(viewport={"width": 1500, "height": 1100})
                page.goto(f"http://127.0.0.1:{dash}/node/{node}{span}", wait_until="networkidle", timeout=60_000)
                page.wait_for_selector(".js-plotly-plot", timeout=60_000)
                time.sleep(3)
                page.screenshot(path=str(out), full_page=False)
                b.close()
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
