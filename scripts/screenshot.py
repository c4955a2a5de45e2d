"""Screenshots of every dashboard page on the demo store, for the docs (``make screenshots``).

``triscope run`` on a fresh store in a temporary folder (this host's agent without eBPF, the six
H200 recordings imported as nodes, the remediation engine in dry-run, the dashboard), then each
page in headless Chromium (Debian's, through Playwright), saved as ``docs/img/<page>.png``:

    .venv/bin/python scripts/screenshot.py                  # every page into docs/img
    .venv/bin/python scripts/screenshot.py --out DIR --only node-page,slos

``PAGES`` says which: the README's Node page (``node-page.png``), then Fleet, the Node page on one
accelerator, Mismatch, SLOs, Remediation and Root cause, each on ``NODE`` (the recording with
every kind of episode: staging, I/O, network, the fallback the engine took) where it takes one.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
NODE = "h200-inference-5"
VIEWPORT = {"width": 1500, "height": 1100}

# (file name, path, element to wait for, whole page or the viewport only)
PAGES: tuple[tuple[str, str, str, bool], ...] = (
    ("node-page", f"/node/{NODE}", "#node-graph .js-plotly-plot", False),
    ("fleet", "/", "#fleet-table", True),
    ("node-gpu", f"/node/{NODE}?gpu=0", "#node-workload-table", True),
    ("mismatch", f"/mismatch?node={NODE}", "#mismatch-scatter .js-plotly-plot", True),
    ("slos", "/slos", ".slo-card", True),
    ("remediation", "/remediation", "#remediation-table", True),
    ("rootcause", f"/rootcause?node={NODE}", "#rootcause-states", True),
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def demo(workdir: Path, timeout: float = 300.0) -> Iterator[str]:
    """``triscope run`` in ``workdir`` until the dashboard answers; yields its base URL."""
    dash, metrics, hook = _port(), _port(), _port()
    triscope = Path(sys.executable).parent / "triscope"
    log = open(workdir / "run.log", "w")   # noqa: SIM115 - closed below, after the process
    proc = subprocess.Popen([str(triscope), "run", "--dashboard", f"127.0.0.1:{dash}", "--metrics-listen",
                             f"127.0.0.1:{metrics}", "--webhook", f"127.0.0.1:{hook}", "--no-ebpf"],
                            cwd=workdir, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TRISCOPE_SPOOL_DIR": f"{workdir}/spool"})
    base = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"triscope run exited ({proc.returncode}): {(workdir / 'run.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(base + "/healthz", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the dashboard did not answer within the timeout") from None
                time.sleep(1.0)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def settle(page: object, timeout: float = 60_000) -> None:
    """Wait until Dash has no callback in flight (as the browser tests do)."""
    page.wait_for_load_state("networkidle", timeout=timeout)  # type: ignore[attr-defined]
    page.wait_for_function(  # type: ignore[attr-defined]
        "() => document.querySelector('#_pages_content') && "
        "!document.querySelector('[data-dash-is-loading=\"true\"]')", timeout=timeout)


def shoot(base: str, out: Path, only: set[str] | None = None) -> list[Path]:
    """Every page of ``PAGES`` (or those named in ``only``) into ``out``; returns the files."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    done = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = b.new_page(viewport=VIEWPORT, timezone_id="UTC")
            for name, path, selector, whole in PAGES:
                if only and name not in only:
                    continue
                page.goto(base + path, wait_until="networkidle", timeout=120_000)
                page.wait_for_selector(selector, timeout=120_000)
                settle(page)
                time.sleep(1.5)            # Plotly's transitions
                f = out / f"{name}.png"
                page.screenshot(path=str(f), full_page=whole)
                done.append(f)
                print(f, flush=True)
        finally:
            b.close()
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="folder of the PNGs (default docs/img)")
    ap.add_argument("--only", default="", help="comma-separated page names: " + ",".join(p[0] for p in PAGES))
    args = ap.parse_args(argv)
    only = {s for s in args.only.split(",") if s} or None
    unknown = (only or set()) - {p[0] for p in PAGES}
    if unknown:
        ap.error(f"no page {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory() as td, demo(Path(td)) as base:
        shoot(base, args.out.resolve(), only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
