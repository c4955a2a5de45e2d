"""Mutants of the classifier, and the command that runs every recording test under each of them.

    .venv/bin/python -m tests.mutants              # baseline, then the six mutants; a table; exit 1 if any survives
    .venv/bin/python -m tests.mutants -k h200-lab  # a pytest -k selection of the recording tests
    make mutants

The six mutants (issue 42), each a patch of ``triscope.analysis.verdict`` applied for a whole pytest
run (this module is also a pytest plugin: ``pytest -p tests.mutants`` with ``TRISCOPE_MUTANT=NAME``):

* ``constant-idle``, ``constant-compute-bound``: every accelerator's state is that, whatever its
  inputs (``classify_accelerator`` replaced);
* ``staging-bound-everywhere``: every accelerator ``staging-bound`` at score 1;
* ``largest-sm-share``: the verdict names the workload with the largest SM share (``_named_workload``
  replaced by the accelerator's dominant workload);
* ``no-workload``: the verdict names no workload;
* ``other-workload``: the verdict names another workload than the classifier would (one of another
  pod where the accelerator has one, else any other, else none).

The recording tests (``RECORDING_TESTS``) replay each recording's inputs through the classifier in
process (``examples/inference/acceptance.py`` in memory; ``triscope.commands.replay`` into a store for
root cause, alerts and the engine), so a mutant reaches every verdict they check.  A test a mutant
does not fail *survives*; the command prints, per test, which mutants it failed and exits 1 when a
test survives any mutant or fails without one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
ENV = "TRISCOPE_MUTANT"
NO_WORKLOAD = ("", "", "", "")

RECORDING_TESTS = (
    "tests/unit/test_recording_verdicts.py",
    "tests/unit/test_inference_recording.py",
    "tests/unit/test_inference_recording_runs.py",
    "tests/unit/test_rca_lookback.py",
)
"""Every test that reads a scored recording (examples/traces/h200-inference-*, examples/hostlab/traces/*)."""


def _verdict() -> Any:
    from triscope.analysis import verdict

    return verdict


@contextmanager
def constant(state: str, score: float = 0.0) -> Iterator[None]:
    with mock.patch.object(_verdict(), "classify_accelerator",
                           lambda acc, f, th: (state, score, [f"mutant: {state}"])):
        yield


@contextmanager
def named_by(pick: Callable[[Any, Any], Any], why: str) -> Iterator[None]:
    v = _verdict()
    real = v._named_workload

    def named(acc: Any, state: str, th: Any) -> tuple[Any, str]:
        return pick(acc, real(acc, state, th)[0]), f"mutant: {why}"

    with mock.patch.object(v, "_named_workload", named):
        yield


def _other(acc: Any, key: Any) -> Any:
    others = sorted({w.key for w in acc.per_workload} - {key})
    far = [k for k in others if not key[1] or (k[0], k[1]) != (key[0], key[1])]
    pick = far or others
    return pick[0] if pick else NO_WORKLOAD


MUTANTS: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "constant-idle": lambda: constant("idle"),
    "constant-compute-bound": lambda: constant("compute-bound"),
    "staging-bound-everywhere": lambda: constant("staging-bound", 1.0),
    "largest-sm-share": lambda: named_by(lambda acc, key: acc.workload or NO_WORKLOAD, "largest SM share"),
    "no-workload": lambda: named_by(lambda acc, key: NO_WORKLOAD, "no workload"),
    "other-workload": lambda: named_by(_other, "the other workload"),
}


# ---------------------------------------------------------------------------------- the pytest plugin
_active: list[AbstractContextManager[None]] = []


def pytest_configure(config: Any) -> None:
    name = os.environ.get(ENV, "")
    if not name:
        return
    if name not in MUTANTS:
        raise SystemExit(f"{ENV}={name}: no such mutant (known: {', '.join(MUTANTS)})")
    cm = MUTANTS[name]()
    cm.__enter__()
    _active.append(cm)


def pytest_unconfigure(config: Any) -> None:
    while _active:
        _active.pop().__exit__(None, None, None)


def pytest_report_header(config: Any) -> str:
    return f"classifier mutant: {os.environ.get(ENV) or 'none'}"


# ---------------------------------------------------------------------------------- the command
def _run(mutant: str | None, tests: list[str], extra: list[str], out: Path) -> tuple[dict[str, str], float]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if mutant:
        env[ENV] = mutant
    xml = out / f"{mutant or 'baseline'}.xml"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.mutants", "-p", "no:cacheprovider",
                    "-o", "addopts=", f"--junitxml={xml}", *tests, *extra],
                   cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    took = time.monotonic() - t0
    got: dict[str, str] = {}
    if not xml.exists():
        return got, took
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        if case.find("skipped") is not None:
            got[name] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            got[name] = "failed"
        else:
            got[name] = "passed"
    return got, took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.mutants", description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", default=None, help="pytest -k selection of the recording tests")
    ap.add_argument("--mutant", action="append", choices=sorted(MUTANTS), help="only this mutant (repeatable)")
    ap.add_argument("tests", nargs="*", help=f"test files or ids (default: {' '.join(RECORDING_TESTS)})")
    args = ap.parse_args(argv)
    tests = args.tests or list(RECORDING_TESTS)
    extra = ["-k", args.k] if args.k else []
    mutants = args.mutant or list(MUTANTS)
    with tempfile.TemporaryDirectory(prefix="mutants-") as td:
        base, took = _run(None, tests, extra, Path(td))
        print(f"baseline (today's classifier): {sum(v == 'passed' for v in base.values())}/{len(base)} passed "
              f"in {took:.0f} s", flush=True)
        bad = {t: v for t, v in base.items() if v != "passed"}
        for t, v in bad.items():
            print(f"  {v}: {t}")
        if not base or bad:
            print("the recording tests do not pass on today's classifier: no mutant run")
            return 1
        results: dict[str, dict[str, str]] = {}
        for m in mutants:
            results[m], took = _run(m, tests, extra, Path(td))
            killed = sum(results[m].get(t) == "failed" for t in base)
            print(f"{m}: {killed}/{len(base)} tests failed in {took:.0f} s", flush=True)
    width = max(len(t) for t in base)
    short = {m: m.replace("constant-", "c-").replace("-everywhere", "")[:14] for m in mutants}
    print()
    print(f"{'test':<{width}} | " + " | ".join(f"{short[m]:<14}" for m in mutants))
    print("-" * width + "-+-" + "-+-".join("-" * 14 for _ in mutants))
    survivors: list[str] = []
    for t in base:
        cells = []
        for m in mutants:
            v = results[m].get(t, "missing")
            cells.append("killed" if v == "failed" else f"SURVIVED ({v})")
            if v != "failed":
                survivors.append(f"{t} under {m}")
        print(f"{t:<{width}} | " + " | ".join(f"{c:<14}" for c in cells))
    print()
    if survivors:
        print(f"{len(survivors)} of {len(base) * len(mutants)} (test, mutant) pairs survived:")
        for s in survivors:
            print(f"  {s}")
        return 1
    print(f"none survives: each of the {len(base)} recording tests failed under each of the {len(mutants)} mutants")
    return 0


if __name__ == "__main__":
    sys.exit(main())
