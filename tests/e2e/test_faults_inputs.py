"""Hostile files, names and command-line inputs (issue 16): each is refused with one line that says
what is wrong and where, fast and in bounded memory, never a traceback.

* YAML (``triscope.core.yamlsafe``, used by the SLO, threshold and policy loaders): a billion-laughs
  file, a file over the size cap, a binary file, a file that is not UTF-8, deep nesting;
* ``triscope import-trace``: a binary file, a 100,000-deep JSON line, ``"t": NaN`` / ``Infinity``,
  a missing file, an over-long node name in the file or on the command line;
* time arguments (``triscope.core.timeparse``): ``--since -2h`` written with and without ``=``, NaN,
  infinity, garbage, on every command that takes times;
* the store's ingest bounds: over-long label values are cut (not the tick), bad node names refused.

The CLI runs for real as a subprocess (``python -m triscope``).
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from triscope.core import names, timeparse, yamlsafe
from triscope.core.samples import EventRecord, Sample, Tick
from triscope.store import Store
from triscope.store.db import StoreError

REPO = Path(__file__).resolve().parents[2]
SLO_EXAMPLE = REPO / "deploy" / "slo.example.yaml"


def triscope(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "triscope", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def assert_one_line(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    """A refusal: non-zero exit, exactly one short line on stderr, no traceback; returns the line."""
    err = res.stderr
    assert res.returncode != 0, (res.returncode, res.stdout[-500:], err[-2000:])
    assert "Traceback" not in err, err[-3000:]
    assert len(err.splitlines()) == 1 and err.endswith("\n"), err[-3000:]
    assert len(err) < 700, f"{len(err)} characters: {err[:300]}..."
    for n in needles:
        assert n in err, err
    return err


# ---------------------------------------------------------------------------------------------- hostile files
def billion_laughs(path: Path) -> Path:
    """Nine levels of ten references: 10**9 strings once expanded, 900 bytes on disk."""
    lines = ['lol0: &lol0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        lines.append(f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * 10) + "]")
    path.write_text("\n".join(lines) + "\n")
    return path


def too_big(path: Path) -> Path:
    path.write_bytes(b"# padding\n" * (yamlsafe.MAX_BYTES // 10 + 1000))
    return path


def binary(path: Path) -> Path:
    path.write_bytes(gzip.compress(b"version: 1\n" * 100) + bytes(range(256)))
    return path


def not_utf8(path: Path) -> Path:
    path.write_bytes(b"version: 1\nservice: caf\xe9\n")
    return path


def deep(path: Path, levels: int) -> Path:
    path.write_text("a: " + "[" * levels + "]" * levels + "\n")
    return path


HOSTILE = {
    "bomb": (billion_laughs, "too many aliases/nodes (YAML bomb?)", True),
    "too-big": (too_big, "larger than the 4 MiB limit", False),
    "binary": (binary, "binary file", True),
    "not-utf8": (not_utf8, "not UTF-8", True),
    "deep": (lambda p: deep(p, 100), f"nested deeper than {yamlsafe.MAX_DEPTH} levels", True),
    "very-deep": (lambda p: deep(p, 100_000), "", True),
}

# each loader in a fresh process: its own time and memory, and a stuck loader cannot take the suite down
LOADERS = {
    "slo": "from triscope.analysis.slo import load_slo_file as load",
    "thresholds": "from triscope.analysis.config import load_thresholds as load",
    "policy": "from triscope.remediation.policy import load_policy as load",
}
CHILD = """
import json, resource, sys, time
{imp}
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
try:
    load(sys.argv[1])
    err = ""
except Exception as e:
    err = type(e).__name__ + ": " + str(e)
took = time.perf_counter() - t0
print(json.dumps({{"error": err, "took": took, "grew_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024}}))
"""


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("loader", list(LOADERS))
def test_hostile_yaml_is_one_line_fast_and_small(tmp_path: Path, loader: str, kind: str) -> None:
    make, needle, has_line = HOSTILE[kind]
    path = make(tmp_path / f"{kind}.yaml")
    try:
        res = subprocess.run([sys.executable, "-c", CHILD.format(imp=LOADERS[loader]), str(path)], cwd=REPO,
                             capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{loader} loader still busy with the {kind} file after 30 s")
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    err = got["error"]
    assert err, f"{loader} accepted the {kind} file"
    assert "\n" not in err and len(err) < 600, err
    assert f"{path}:" in err, err
    if has_line:
        line = err.split(f"{path}:", 1)[1].split(":", 1)[0]
        assert line.isdigit(), err
    assert needle in err, err
    assert got["took"] < 1.0, got
    assert got["grew_mib"] < 100, got


def test_yamlsafe_keeps_lines_merges_and_refuses_tricks() -> None:
    text = ("base: &b {timeout: 5m, retries: 3}\n"
            "rules:\n"
            "  - name: r1\n"
            "    params:\n"
            "      <<: *b\n"
            "      retries: 5\n")
    doc = yamlsafe.parse(text, "p.yaml")
    assert doc.root["rules"][0]["params"] == {"timeout": "5m", "retries": 5}
    assert doc.line(("rules",)) == 2 and doc.value_line(("rules",)) == 3
    assert doc.line(("rules", 0, "params", "retries")) == 6
    assert doc.line(("rules", 0, "params", "no-such-key")) == 4     # the nearest enclosing value
    assert doc.where(("rules", 0, "name")) == "p.yaml:3"
    for bad, line, words in [
        ("a: 1\na: 2\n", 2, "duplicate key 'a'"),
        ("a: &x [1, *x]\n", 1, "recursive alias"),
        ("a: !!python/object:os.system [ls]\n", 1, "unsupported tag"),
        ("? [k]\n: v\n", 1, "plain scalars"),
        ("a: [\n", 2, "not valid YAML"),
        ("a: 1\n---\nb: 2\n", 3, "expected one YAML document"),
        ("n: " + "9" * 5000 + "\n", 1, "cannot read value"),
    ]:
        with pytest.raises(yamlsafe.YAMLFileError) as ei:
            yamlsafe.parse(bad, "f.yaml")
        assert ei.value.line == line and words in str(ei.value) and str(ei.value).startswith(f"f.yaml:{line}: ")
    # one budget for a whole multi-document file
    many = "".join(f"---\nk: [{', '.join(['1'] * 900)}]\n" for _ in range(120))
    with pytest.raises(yamlsafe.YAMLFileError, match="YAML bomb"):
        yamlsafe.parse_all(many, "m.yaml")


def test_slo_and_threshold_files_still_name_their_lines(tmp_path: Path) -> None:
    from triscope.analysis.config import ConfigError, load_thresholds
    from triscope.analysis.slo import SLOSpecError, load_slo_file

    assert load_slo_file(SLO_EXAMPLE)
    p = tmp_path / "th.yaml"
    p.write_text("mismatch:\n  io_saturated_link: 0.6\n  window_s: .inf\n")
    with pytest.raises(ConfigError, match=rf"^{p}:3: mismatch.window_s: must be a finite duration"):
        load_thresholds(p, environ={})
    with pytest.raises(SLOSpecError, match=rf"^{tmp_path / 'none.yaml'}: no such file$"):
        load_slo_file(tmp_path / "none.yaml")


# ---------------------------------------------------------------------------------------------- CLI: YAML files
@pytest.mark.parametrize("kind", ["bomb", "too-big", "binary", "not-utf8", "very-deep"])
@pytest.mark.parametrize("command", [["slo", "rules"], ["slo", "check"]])
def test_slo_commands_refuse_hostile_files_in_one_line(tmp_path: Path, command: list[str], kind: str) -> None:
    make, needle, _ = HOSTILE[kind]
    path = make(tmp_path / f"{kind}.yaml")
    assert_one_line(triscope(*command, str(path)), str(path), needle)


def test_slo_rules_missing_file_and_unwritable_output(tmp_path: Path) -> None:
    assert_one_line(triscope("slo", "rules", str(tmp_path / "none.yaml")), "no such file")
    assert_one_line(triscope("slo", "rules", str(tmp_path)), "is a directory")
    assert_one_line(triscope("slo", "rules", str(SLO_EXAMPLE), "-o", str(tmp_path / "no" / "dir" / "x.yaml")),
                    "cannot write")


def test_remediate_check_refuses_a_yaml_bomb_in_one_line(tmp_path: Path) -> None:
    """``remediate check`` is a linter: its verdict, good or bad, is its output (one line, exit 1)."""
    path = billion_laughs(tmp_path / "policy.yaml")
    t0 = time.monotonic()
    res = triscope("remediate", "check", str(path), timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in out and len(out.splitlines()) == 1, out[-2000:]
    assert out.startswith(f"{path}:1: ") and "YAML bomb" in out, out
    assert time.monotonic() - t0 < 20


# ---------------------------------------------------------------------------------------------- CLI: traces
HEADER = {"format": "triscope-trace", "version": 1, "node": "n1", "start": 1.8e9, "end": 1.8e9 + 1,
          "series": [[0, "triscope_tcp_sockets", {"state": "time_wait"}, "gauge"]]}


def _trace(path: Path, *lines: str, header: dict[str, object] | None = None) -> Path:
    path.write_text(json.dumps(header or HEADER) + "\n" + "".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("case, needles", [
    ("binary", ["not UTF-8 text"]),
    ("deep", [":2: bad trace line (nested too deeply)"]),
    ("nan", [":2: bad trace line (NaN is not allowed"]),
    ("infinity", [":2: bad trace line (Infinity is not allowed"]),
    ("negative-infinity", [":2: bad trace line (-Infinity is not allowed"]),
    ("t-string", [":2: bad trace line (t must be epoch seconds"]),
    ("t-huge", [":2: bad trace line (t must be epoch seconds"]),
    ("missing", ["does not exist"]),
    ("directory", ["is not a file"]),
    ("long-node", [":1: bad trace header: node name", "longer than 253 characters"]),
    ("bad-series", [":1: bad trace header: series[0]", "metric name"]),
    ("version", [":1: bad trace header: version must be an integer"]),
    ("corrupt-gzip", ["cannot read trace"]),
    ("deep-header", ["not a triscope trace"]),
])
def test_import_trace_refuses_bad_files_in_one_line(tmp_path: Path, case: str, needles: list[str]) -> None:
    p = tmp_path / f"{case}.jsonl"
    if case == "binary":
        p.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(range(128, 256)) * 64)
    elif case == "deep":
        _trace(p, "[" * 100_000 + "]" * 100_000)
    elif case == "nan":
        _trace(p, '{"t": NaN, "v": [[0, 1]]}')
    elif case == "infinity":
        _trace(p, '{"t": Infinity, "v": [[0, 1]]}')
    elif case == "negative-infinity":
        _trace(p, '{"t": 1800000000, "v": [[0, -Infinity]]}')
    elif case == "t-string":
        _trace(p, '{"t": "soon", "v": [[0, 1]]}')
    elif case == "t-huge":
        _trace(p, '{"t": 1e300, "v": [[0, 1]]}')
    elif case == "directory":
        p.mkdir()
    elif case == "long-node":
        _trace(p, header={**HEADER, "node": "n" * 10240})
    elif case == "bad-series":
        _trace(p, header={**HEADER, "series": [[0, "not a metric!", {}, "gauge"]]})
    elif case == "version":
        _trace(p, header={**HEADER, "version": "one"})
    elif case == "corrupt-gzip":
        p = tmp_path / "corrupt.jsonl.gz"
        good = gzip.compress((json.dumps(HEADER) + "\n").encode() * 200)
        p.write_bytes(good[:20] + b"\x00" * 64 + good[84:])
    elif case == "deep-header":
        p.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    db = tmp_path / "t.db"
    err = assert_one_line(triscope("import-trace", str(p), "--db", f"sqlite:///{db}"), *needles)
    assert "n" * 200 not in err
    assert not db.exists(), "the store was touched for a file that cannot be read"


def test_import_trace_refuses_a_bad_node_option(tmp_path: Path) -> None:
    p = _trace(tmp_path / "ok.jsonl", '{"t": 1800000000, "v": [[0, 1]]}')
    db = f"sqlite:///{tmp_path / 't.db'}"
    assert_one_line(triscope("import-trace", str(p), "--db", db, "--node", "x" * 300),
                    "--node: node name", "longer than 253 characters")
    assert_one_line(triscope("import-trace", str(p), "--db", db, "--node", "two words"), "may only hold")
    res = triscope("import-trace", str(p), "--db", db, "--node", "gpu-7.example_com")
    assert res.returncode == 0 and "as node 'gpu-7.example_com'" in res.stdout, res.stderr


# ---------------------------------------------------------------------------------------------- time arguments
NOW = 1_800_000_000.0


@pytest.mark.parametrize("text, expected", [
    ("now", NOW), ("NOW", NOW), ("2h", NOW - 7200), ("-2h", NOW - 7200), ("-30m", NOW - 1800), ("90s", NOW - 90),
    ("1.5d", NOW - 129600), ("1w", NOW - 604800), ("1h30m", NOW - 5400), ("-1h30m", NOW - 5400),
    ("600", NOW - 600), ("-600", NOW - 600), ("1764400000", 1764400000.0), ("1764400000.5", 1764400000.5),
    ("2026-11-29T17:00:00Z", 1795971600.0), ("2026-11-29T17:00:00", 1795971600.0),
    ("2026-11-29 17:00", 1795971600.0), ("2026-11-29T18:00:00+01:00", 1795971600.0), ("2026-11-29", 1795910400.0),
])
def test_time_forms(text: str, expected: float) -> None:
    assert timeparse.parse_time(text, NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "yesterday", "", "  ", "2h ago", "+2h",
                                  "1e9", "2026-13-01", "-100000w", "9" * 400 + "s", "10000-01-01"])
def test_bad_times_are_refused(text: str) -> None:
    with pytest.raises(timeparse.TimeParseError) as ei:
        timeparse.parse_time(text, NOW)
    assert "\n" not in str(ei.value)


@pytest.fixture
def seeded(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    st = Store.open(url)
    st.upgrade()
    now = time.time()
    st.write_ticks("n1", [Tick(now - 7200 + 60 * i, [Sample("triscope_tcp_sockets", float(i), {"state": "time_wait"})])
                          for i in range(121)])
    st.close()
    return url


def _points(res: subprocess.CompletedProcess[str]) -> list[float]:
    assert res.returncode == 0, res.stderr
    return [json.loads(line)["value"] for line in res.stdout.splitlines()]


def test_since_minus_2h_with_and_without_equals(seeded: str) -> None:
    q = ["query", "--db", seeded, "--metric", "triscope_tcp_sockets", "--json"]
    joined = _points(triscope(*q, "--since=-2h"))
    spaced = _points(triscope(*q, "--since", "-2h"))
    bare = _points(triscope(*q, "--since", "2h"))
    assert joined == spaced == bare and 119 <= len(joined) <= 121, (len(joined), len(spaced), len(bare))
    thirty = _points(triscope(*q, "--since", "-30m"))
    assert 29 <= len(thirty) <= 31
    assert len(_points(triscope(*q, "--since", "600"))) in (9, 10, 11)      # a plain number: seconds ago
    window = _points(triscope(*q, "--start", "-1h30m", "--until", "-1h"))
    assert 29 <= len(window) <= 31 and window == sorted(window)
    assert len(_points(triscope(*q, "--since", "-2h", "--end", "-1h"))) in (59, 60, 61)


@pytest.mark.parametrize("value", ["nan", "inf", "Infinity", "-inf", "bogus", "1e999", ""])
def test_query_refuses_bad_times_in_one_line(seeded: str, value: str) -> None:
    q = ["query", "--db", seeded, "--metric", "triscope_tcp_sockets"]
    assert_one_line(triscope(*q, f"--since={value}"), "--since:")
    assert_one_line(triscope(*q, "--until", value), "--until:")


def test_other_time_arguments_take_the_same_forms(seeded: str, tmp_path: Path) -> None:
    res = triscope("rca", "--db", seeded, "--node", "n1", "--start", "-2h", "--end", "-1h", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["end"] - out["start"] == pytest.approx(3600, abs=5)
    assert_one_line(triscope("rca", "--db", seeded, "--node", "n1", "--start", "nan"), "--start:")
    assert_one_line(triscope("rca", "--db", seeded, "--node", "n1", "--start", "-2h", "--baseline-start", "inf"),
                    "--baseline-start:")
    res = triscope("slo", "status", "--db", seeded, "--slo", str(SLO_EXAMPLE), "--at", "-1h", "--json")
    assert res.returncode == 0, res.stderr
    assert_one_line(triscope("slo", "status", "--db", seeded, "--slo", str(SLO_EXAMPLE), "--at", "NaN"), "--at:")
    out_file = tmp_path / "x.jsonl.gz"
    res = triscope("export-trace", "--db", seeded, "--node", "n1", "-o", str(out_file), "--start", "-30m")
    assert res.returncode == 0 and re.search(r" (29|30|31) ticks", res.stdout), res.stdout + res.stderr
    assert_one_line(triscope("export-trace", "--db", seeded, "--node", "n1", "-o", str(out_file), "--end", "x"),
                    "--end:")
    assert_one_line(triscope("rca", "--db", seeded, "--node", "y" * 5000, "--start", "-2h"), "unknown node")


def test_time_help_names_the_forms() -> None:
    for cmd in (["query"], ["rca"], ["slo", "status"]):
        out = triscope(*cmd, "--help").stdout
        assert "no zone = UTC" in " ".join(out.split()), (cmd, out)


# ---------------------------------------------------------------------------------------------- names and ingest
@pytest.mark.parametrize("name, ok", [
    ("h200-node", True), ("gpu-7.example.com", True), ("Host_01", True), ("a", True), ("n" * 253, True),
    ("n" * 254, False), ("", False), ("-lead", False), ("trail.", False), ("two words", False),
    ("a/b", False), ("tab\there", False), ("nul\x00", False), ("ünïcode", False),
])
def test_node_name_rules(name: str, ok: bool) -> None:
    problem = names.node_name_problem(name)
    assert (problem is None) == ok, problem
    if not ok:
        assert len(problem or "") < 300


def test_store_bounds_label_values_and_refuses_bad_node_names(tmp_path: Path) -> None:
    st = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    st.upgrade()
    try:
        long_a, long_b = "a" * 5000, "a" * 4999 + "b"
        st.write_ticks("n1", [Tick(1.8e9 + i, [Sample("app_requests_total", float(i), {"path": long_a}, "counter"),
                                               Sample("app_requests_total", 2.0 * i, {"path": long_b}, "counter"),
                                               Sample("m" * 300, 1.0)]) for i in range(3)])
        infos = st.series(node="n1", metric="app_requests_total")
        paths = sorted(i.labels["path"] for i in infos)
        assert len(paths) == 2 and paths[0] != paths[1]                       # still two series
        assert all(len(p) == names.MAX_LABEL_VALUE and p.startswith("a" * 1000) for p in paths), [len(p) for p in paths]
        assert st.truncated_label_values == 2 and st.dropped_samples == 3
        assert "m" * 300 not in st.metric_names("n1")
        sd = st.query("app_requests_total", node="n1", labels={"path": paths[0]}, start=0, end=2e9, max_points=None,
                      rate=False)
        assert len(sd[0].ts) == 3
        st.add_events("n1", [EventRecord("k" * 100, "x" * 100_000, "info", {"blob": "y" * 200_000})], ts=1.8e9)
        ev = st.events(node="n1")[-1]
        assert len(ev.kind) == 64 and len(ev.message) <= 4096 and ev.details.get("truncated") is True
        with pytest.raises(StoreError, match="longer than 253 characters"):
            st.write_ticks("n" * 10240, [Tick(1.8e9, [Sample("m", 1.0)])])
        with pytest.raises(StoreError, match="may only hold"):
            st.add_events("bad name", [EventRecord("k", "m")])
        assert [n.name for n in st.nodes()] == ["n1"]
    finally:
        st.close()
