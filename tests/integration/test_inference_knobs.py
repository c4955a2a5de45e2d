"""Fault knobs: validation (one clear line per refusal), the knobs file (applied within 1 s, the
fallback contract), the admin endpoint, and what /metrics reports as applied."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("PIL", reason="Pillow is in the test extras (pip install -e '.[test]')")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from examples.inference.knobs import (  # noqa: E402
    KnobError,
    Knobs,
    KnobStore,
    parse_file,
    validate,
    write_file_atomically,
)
from examples.inference.server import InferenceServer, build_service  # noqa: E402

ALLOWED = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset({0})


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def test_good_values_are_normalised():
    cpu = min(ALLOWED)
    v = validate({"pinned": "false", "workers": "3", "cpu_affinity": [cpu, cpu], "pin_churn": True,
                  "batch_size": 32, "max_wait_ms": 2, "net_drop": 0.05, "noisy_neighbour": "copy", "upload_mib": 64})
    assert v == {"pinned": False, "workers": 3, "cpu_affinity": (cpu,), "pin_churn": True, "batch_size": 32,
                 "max_wait_ms": 2.0, "net_drop": 0.05, "noisy_neighbour": "copy", "upload_mib": 64}
    assert validate({"cpu_affinity": None}) == {"cpu_affinity": None}
    assert validate({"cpu_affinity": str(cpu)}) == {"cpu_affinity": (cpu,)}


@pytest.mark.parametrize("knob, value, words", [
    ("batch_size", 0, "batch_size: must be an integer from 1 to 512, got 0"),
    ("batch_size", "many", "batch_size: must be an integer from 1 to 512, got 'many'"),
    ("batch_size", True, "batch_size: must be an integer"),
    ("batch_size", 2.5, "batch_size: must be an integer"),
    ("pinned", "maybe", "pinned: must be true or false, got 'maybe'"),
    ("pin_churn", 1, "pin_churn: must be true or false"),
    ("workers", 0, "workers: must be an integer from 1 to 256, got 0"),
    ("max_wait_ms", -1, "max_wait_ms: must be a number from 0 to 10000"),
    ("net_drop", 1.0, "net_drop: must be a number from 0 to below 1"),
    ("net_drop", "nan", "net_drop: must be a number"),
    ("noisy_neighbour", "loud", "noisy_neighbour: must be one of off, copy, compute, got 'loud'"),
    ("cpu_affinity", [], "cpu_affinity: an empty CPU list; use null for every CPU"),
    ("cpu_affinity", [100000], "cpu_affinity: CPU 100000 is not one this process may run on"),
    ("cpu_affinity", {"a": 1}, "cpu_affinity: must be null, a CPU number or a list"),
    ("upload_mib", 5000, "upload_mib: must be an integer from 0 to 4096"),
    ("turbo", 1, "unknown knob 'turbo' (knobs: pinned, workers,"),
])
def test_bad_values_refused_with_one_line(knob, value, words):
    with pytest.raises(KnobError) as e:
        validate({knob: value})
    msg = str(e.value)
    assert words in msg and "\n" not in msg


def test_file_parse_and_the_fallback_contract(tmp_path):
    p = tmp_path / "k.yaml"
    f = parse_file("version: 1\nkind: fallback\nworkload: inf-b\nknobs:\n  pinned: true\n  workers: 6\n"
                   "  net_drop: 0\n  noisy_neighbour: 'off'\n", p, workload="inf-b")
    assert f.kind == "fallback" and f.knobs == {"pinned": True, "workers": 6, "net_drop": 0.0, "noisy_neighbour": "off"}
    assert parse_file('{"version": 1, "knobs": {"batch_size": 8}}', tmp_path / "k.json").knobs == {"batch_size": 8}
    assert parse_file("version: 1\n", p).knobs == {}
    bad = {
        "version: 1\nknobs:\n  batch_size: [\n": f"{p}:4: not valid YAML",
        "knobs: {}\n": f"{p}: version: must be 1, got None",
        "version: 1\nmode: x\n": f"{p}: unknown top-level key 'mode'",
        "version: 1\nkind: chaos\n": f"{p}: kind: must be fallback or experiment",
        "version: 1\nknobs:\n  batch_size: 0\n": f"{p}: knobs.batch_size: must be an integer from 1 to 512",
        "version: 1\nworkload: inf-a\n": f"{p}: workload: this file is for 'inf-a', this service is 'inf-b'",
        "version: 1\nkind: fallback\nknobs:\n  net_drop: 0.1\n": f"{p}: knobs.net_drop: a fallback may only set it to 0.0",
        "version: 1\nkind: fallback\nknobs:\n  upload_mib: 64\n": f"{p}: knobs.upload_mib: a fallback may only set it to 0",
        "- 1\n": f"{p}: the top level must be a mapping",
        "": f"{p}: empty file",
    }
    for text, words in bad.items():
        with pytest.raises(KnobError) as e:
            parse_file(text, p, workload="inf-b")
        assert str(e.value).startswith(words), (text, str(e.value))
        assert "\n" not in str(e.value)


# --------------------------------------------------------------------------------------------
# the store and its file watcher
# --------------------------------------------------------------------------------------------
def _wait_for(cond, timeout):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.01)
    return None


def test_file_change_applied_within_one_second_and_clears_admin_overrides(tmp_path):
    path = tmp_path / "inference-b.knobs.yaml"
    store = KnobStore(Knobs(batch_size=16), file=path, workload="inference-b", poll_s=0.5)
    seen: list[tuple[Knobs, Knobs]] = []
    store.subscribe(lambda old, new: seen.append((old, new)))
    store.start()
    try:
        assert store.knobs == Knobs(batch_size=16) and store.state().source == "startup"
        store.set_overrides({"pinned": False, "net_drop": 0.2})
        assert store.knobs.pinned is False and store.knobs.net_drop == 0.2 and store.state().source == "admin"
        write_file_atomically(path, {"workers": 7}, kind="fallback", workload="inference-b")
        took = _wait_for(lambda: store.knobs.workers == 7, 1.5)
        assert took is not None and took <= 1.0, took
        st = store.state()
        # the fallback wins: admin overrides are gone, absent keys are back at their start-up values
        assert st.knobs == Knobs(batch_size=16, workers=7)
        assert st.source == "file" and st.file_kind == "fallback" and st.overrides == {}
        assert st.file_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert seen[-1][1] == st.knobs
        # a bad file is refused as a whole, the knobs in force stay
        path.write_text("version: 1\nknobs:\n  workers: -3\n")
        assert _wait_for(lambda: store.file_errors == 1, 1.5) is not None
        assert store.knobs.workers == 7 and "knobs.workers" in (store.state().file_error or "")
        # removing the file drops the file layer
        path.unlink()
        assert _wait_for(lambda: store.knobs == Knobs(batch_size=16), 1.5) is not None
        assert store.state().file_sha256 == ""
    finally:
        store.close()


def test_identical_rewrite_is_not_a_change(tmp_path):
    path = tmp_path / "k.json"
    write_file_atomically(path, {"batch_size": 4})
    store = KnobStore(file=path, poll_s=0.1)
    assert store.knobs.batch_size == 4
    gen = store.state().generation
    store.set_overrides({"batch_size": 9})
    write_file_atomically(path, {"batch_size": 4})    # same content, new inode: the admin value stays
    assert not store.poll()
    assert store.knobs.batch_size == 9 and store.state().generation == gen + 1


def test_bad_file_at_start_keeps_startup_values(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text("version: 2\n")
    store = KnobStore(Knobs(workers=2), file=path)
    assert store.knobs == Knobs(workers=2) and store.file_errors == 1
    assert "version: must be 1, got 2" in (store.state().file_error or "")


def test_admin_overrides_all_or_nothing():
    store = KnobStore()
    with pytest.raises(KnobError, match="batch_size"):
        store.set_overrides({"workers": 3, "batch_size": 0})
    assert store.knobs == Knobs()
    store.set_overrides({"workers": 3})
    store.set_overrides({"batch_size": 8})
    assert store.knobs.workers == 3 and store.knobs.batch_size == 8
    store.set_overrides({"pinned": False}, replace=True)
    assert store.knobs == Knobs(pinned=False)


# --------------------------------------------------------------------------------------------
# over HTTP, and on /metrics
# --------------------------------------------------------------------------------------------
@pytest.fixture
def server(tmp_path):
    srv = InferenceServer()
    svc = build_service("cpu", knobs_file=tmp_path / "inference-t.knobs.yaml", workload="inference-t",
                        port=srv.port, net_tool="off", neighbour=False)
    srv.attach(svc).start()
    yield srv
    srv.stop()


def _post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _metrics(url: str) -> dict[str, list]:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _knob(m: dict[str, list], name: str) -> float:
    return next(s.value for s in m["inference_knob"] if s.labels["knob"] == name)


def test_admin_endpoint_sets_knobs_and_metrics_report_them(server):
    code, body = _post(server.url + "/admin/knobs", json.dumps({"batch_size": 24, "pinned": False}).encode())
    assert code == 200
    assert body["knobs"]["batch_size"] == 24 and body["knobs"]["pinned"] is False and body["source"] == "admin"
    m = _metrics(server.url)
    assert _knob(m, "batch_size") == 24 and _knob(m, "pinned") == 0
    info = m["inference_knobs_info"][0].labels
    assert info["batch_size"] == "24" and info["pinned"] == "false" and info["source"] == "admin"
    # replace=1 drops the earlier overrides
    code, body = _post(server.url + "/admin/knobs?replace=1", json.dumps({"workers": 2}).encode())
    assert code == 200 and body["knobs"]["batch_size"] == 16 and body["knobs"]["pinned"] is True
    # surplus workers retire after their current task (within the pool's 0.2 s tick when idle)
    def workers_alive() -> float:
        return next(s.value for s in _metrics(server.url)["inference_preprocess_workers"] if s.labels["state"] == "all")
    assert _wait_for(lambda: workers_alive() == 2, 1.0) is not None


@pytest.mark.parametrize("body, words", [
    (b'{"batch_size": -1}', "batch_size: must be an integer from 1 to 512, got -1"),
    (b'{"warp": 9}', "unknown knob 'warp'"),
    (b"[1, 2]", "knobs must be a mapping of knob: value"),
    (b"{not json", "admin knobs: body is not JSON"),
])
def test_admin_endpoint_refuses_bad_values_with_one_line(server, body, words):
    before = _metrics(server.url)
    code, answer = _post(server.url + "/admin/knobs", body)
    assert code == 400
    assert words in answer["error"] and "\n" not in answer["error"]
    after = _metrics(server.url)
    assert after["inference_knobs_generation"][0].value == before["inference_knobs_generation"][0].value


def test_knobs_file_reaches_metrics_within_one_second(server, tmp_path):
    path = tmp_path / "inference-t.knobs.yaml"
    _post(server.url + "/admin/knobs", b'{"pinned": false}')
    write_file_atomically(path, {"batch_size": 3, "max_wait_ms": 1.5}, kind="fallback", workload="inference-t")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()

    def applied() -> bool:
        m = _metrics(server.url)
        return m["inference_knobs_file_info"][0].labels["sha256"] == sha and _knob(m, "batch_size") == 3
    took = _wait_for(applied, 2.0)
    assert took is not None and took <= 1.0, took
    m = _metrics(server.url)
    assert _knob(m, "pinned") == 1       # the fallback dropped the admin override
    assert _knob(m, "max_wait_ms") == 1.5
    assert m["inference_knobs_info"][0].labels["source"] == "file"
    assert m["inference_knobs_file_ok"][0].value == 1
    # a fallback that tries to inject a fault is refused, and says so on /metrics
    path.write_text("version: 1\nkind: fallback\nknobs:\n  noisy_neighbour: copy\n")
    assert _wait_for(lambda: _metrics(server.url)["inference_knobs_file_ok"][0].value == 0, 2.0) is not None
    m = _metrics(server.url)
    assert m["inference_knobs_file_errors_total"][0].value == 1
    assert _knob(m, "batch_size") == 3 and _knob(m, "noisy_neighbour") == 0
    rep = json.loads(urllib.request.urlopen(server.url + "/admin/knobs", timeout=10).read())
    assert "a fallback may only set it to 'off'" in rep["file_error"]


def test_admin_token_required_when_configured(tmp_path):
    srv = InferenceServer(admin_token="s3cret-token-0123")
    srv.attach(build_service("cpu", port=srv.port, net_tool="off", neighbour=False)).start()
    try:
        code, body = _post(srv.url + "/admin/knobs", b'{"workers": 2}')
        assert code == 401 and "bearer token" in body["error"]
        req = urllib.request.Request(srv.url + "/admin/knobs", data=b'{"workers": 2}', method="POST",
                                     headers={"Authorization": "Bearer s3cret-token-0123"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["knobs"]["workers"] == 2
    finally:
        srv.stop()
