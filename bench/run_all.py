"""Run every ``bench/bench_*.py`` benchmark and print ONE table (``make bench`` / ``python -m bench``).

Each module exposes ``run(quick: bool = False) -> list[bench.common.Row]``. A module that fails
(or cannot import) becomes a row saying so; the others still run. The table is printed and also
written as markdown to ``bench/RESULTS.md`` (the README shows it), with the machine it ran on and
the command that produced it.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from bench.common import Row, machine

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "RESULTS.md"
HEADERS = ["benchmark", "figure", "value", "target", "met?", "baseline", "baseline value"]


def discover() -> list[str]:
    """Module names (``bench_store``, ...) of every benchmark, in name order."""
    return sorted(p.stem for p in BENCH_DIR.glob("bench_*.py"))


def select(names: Sequence[str], only: Sequence[str]) -> list[str]:
    if not only:
        return list(names)
    chosen = []
    for want in only:
        key = want.removeprefix("bench_").removesuffix(".py")
        match = [n for n in names if n == f"bench_{key}"]
        if not match:
            raise SystemExit(f"no benchmark named {want!r}; there are: "
                             + ", ".join(n.removeprefix("bench_") for n in names))
        chosen += [m for m in match if m not in chosen]
    return chosen


def fmt_value(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "n/a"
    a = abs(v)
    if a >= 1000:
        s = f"{v:,.0f}"
    elif a >= 100:
        s = f"{v:.0f}"
    elif a >= 10:
        s = f"{v:.1f}"
    elif a >= 0.01 or a == 0:
        s = f"{v:.2f}"
    else:
        s = f"{v:.2g}"
    return f"{s} {unit}".strip()


def met(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "NO")


def cells(r: Row) -> list[str]:
    return [r.benchmark, r.figure, fmt_value(r.value, r.unit), r.target or "-", met(r.ok), r.baseline or "-",
            fmt_value(r.baseline_value, r.unit) if r.baseline else "-"]


def run_modules(names: Sequence[str], quick: bool, progress: Callable[[str], None] = lambda s: None) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        t = time.perf_counter()
        progress(f"running {name}{' (quick)' if quick else ''} ...")
        try:
            mod = importlib.import_module(f"bench.{name}")
            got = list(mod.run(quick=quick))
            if not got:
                got = [Row(name.removeprefix("bench_"), "returned no rows", math.nan, "", ok=False)]
        except Exception as e:  # noqa: BLE001 - one broken benchmark must not hide the others
            progress(traceback.format_exc())
            got = [Row(name.removeprefix("bench_"), f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}",
                       math.nan, "", ok=False)]
        progress(f"{name}: {len(got)} row(s) in {time.perf_counter() - t:.0f} s")
        rows += got
    return rows


def table_text(rows: Sequence[Row]) -> str:
    data = [HEADERS] + [cells(r) for r in rows]
    widths = [max(len(row[i]) for row in data) for i in range(len(HEADERS))]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(c.ljust(w) for c, w in zip(data[0], widths, strict=True)), line]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in data[1:]]
    return "\n".join(out)


def table_markdown(rows: Sequence[Row]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    out = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join(" --- " for _ in HEADERS) + "|"]
    out += ["| " + " | ".join(esc(c) for c in cells(r)) + " |" for r in rows]
    return "\n".join(out)


def results_markdown(rows: Sequence[Row], command: str, machine_line: str, when: datetime) -> str:
    met_n = sum(1 for r in rows if r.ok)
    judged = sum(1 for r in rows if r.ok is not None)
    return (f"# Benchmark results\n\n`{command}` on {when:%Y-%m-%d %H:%M} UTC\n\nMachine: {machine_line}\n\n"
            f"{met_n} of {judged} targets met.\n\n{table_markdown(rows)}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description="Run every benchmark and print one table.")
    p.add_argument("--quick", action="store_true", help="short runs (minutes instead of tens of minutes)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only this benchmark (e.g. store, fleet, ebpf); repeatable")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--results", default=str(RESULTS), metavar="FILE",
                   help="markdown file to write the table to (default bench/RESULTS.md; '-' for none)")
    a = p.parse_args(argv)
    names = discover()
    if a.list:
        print("\n".join(n.removeprefix("bench_") for n in names))
        return 0
    chosen = select(names, a.only)
    rows = run_modules(chosen, a.quick, progress=lambda s: print(s, file=sys.stderr, flush=True))
    mline = machine()
    print()
    print(table_text(rows))
    print(f"\nmachine: {mline}")
    if a.results != "-":
        cmd = "make bench" if not (a.quick or a.only) else "python -m bench" + (" --quick" if a.quick else "") + "".join(
            f" --only {o}" for o in a.only)
        Path(a.results).write_text(results_markdown(rows, cmd, mline, datetime.now(UTC)))
        print(f"written to {a.results}", file=sys.stderr)
    # a missed target is a result, not an error; a benchmark that crashed is an error
    return 1 if any(r.figure.startswith("FAILED") for r in rows) else 0
