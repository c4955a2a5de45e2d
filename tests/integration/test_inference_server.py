"""The inference service end to end on the CPU stand-in backend: real HTTP, real decode, real batching,
the load generator (library and command line), /metrics read with prometheus_client's own parser,
the host-buffer knobs, CPU affinity and the noisy neighbour process."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("PIL", reason="Pillow is in the test extras (pip install -e '.[test]')")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from examples.inference.backends import MODELS, CpuBackend  # noqa: E402
from examples.inference.knobs import Knobs  # noqa: E402
from examples.inference.loadgen import LoadSpec, make_payloads, percentile, run_load  # noqa: E402
from examples.inference.server import InferenceServer, build_service  # noqa: E402

STAGES = ("decode", "preprocess", "queue", "h2d", "model", "d2h")


@pytest.fixture(scope="module")
def payloads():
    return make_payloads(seed=5, images=3, audios=2, texts=6, audio_seconds=(5.0, 6.0))


@pytest.fixture
def server():
    srv = InferenceServer()
    srv.attach(build_service("cpu", port=srv.port, net_tool="off", settings=["batch_size=8", "max_wait_ms=10"])).start()
    yield srv
    srv.stop()


def _families(url: str) -> dict:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _post(url: str, body: bytes, ctype: str = "application/octet-stream") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_each_route_answers(server, payloads):
    code, img = _post(server.url + "/v1/image", payloads.image[0], "image/jpeg")
    assert code == 200 and img["model"] == "vit" and img["output_dim"] == 1000 and len(img["top5"]) == 5
    assert img["size"] == [640, 480] and set(img["timings_ms"]) == set(STAGES)
    code, clip = _post(server.url + "/v1/image?model=clip", payloads.image[1], "image/jpeg")
    assert code == 200 and clip["model"] == "clip_image" and clip["embedding_norm"] == pytest.approx(1.0, abs=1e-4)
    code, aud = _post(server.url + "/v1/audio", payloads.audio[0], "audio/wav")
    assert code == 200 and aud["model"] == "whisper" and aud["output_dim"] == 1280 and 5.0 <= aud["seconds"] <= 6.0
    code, txt = _post(server.url + "/v1/text", json.dumps({"text": "a dog on a beach"}).encode(), "application/json")
    assert code == 200 and txt["model"] == "clip_text" and txt["tokens"] == 7
    health = json.loads(urllib.request.urlopen(server.url + "/healthz", timeout=10).read())
    assert health["status"] == "ok" and health["backend"]["backend"] == "cpu"
    assert set(health["models"]) == set(MODELS)


def test_bad_requests_are_counted_not_served(server):
    code, body = _post(server.url + "/v1/image", b"\x00not a jpeg")
    assert code == 400 and "JPEG" in body["error"]
    code, body = _post(server.url + "/v1/audio", b"RIFFxxxxWAVE")
    assert code == 400 and "WAV" in body["error"]
    code, body = _post(server.url + "/v1/text", b'{"txt": 1}')
    assert code == 400 and '{"text": "..."}' in body["error"]
    code, body = _post(server.url + "/v1/image?model=resnet", b"x")
    assert code == 400
    code, body = _post(server.url + "/v1/video", b"x")
    assert code == 404
    # a body past the limit is refused from its Content-Length, before it is read
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.putrequest("POST", "/v1/image")
    conn.putheader("Content-Length", str(64 << 20))
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and b"too large" in resp.read()
    conn.close()
    fams = _families(server.url)
    errs = {(s.labels["route"], s.labels["reason"]): s.value for s in fams["inference_request_errors"].samples
            if s.name.endswith("_total")}
    assert errs[("image", "bad_request")] == 2 and errs[("audio", "bad_request")] == 1
    assert errs[("text", "bad_request")] == 1
    served = sum(s.value for s in fams["inference_requests"].samples if s.name.endswith("_total"))
    assert served == 0


def test_load_generator_against_the_server_and_metrics(server, payloads):
    spec = LoadSpec(url=server.url, rate=8.0, duration=3.0, arrival="poisson", concurrency=8, seed=3,
                    mix={"image": 0.5, "audio": 0.2, "text": 0.3}, image_model="mixed")
    report = run_load(spec, payloads)
    d = report.to_dict()
    assert d["sent"] >= 10 and d["ok"] == d["sent"] and d["error_count"] == 0
    assert d["p50_ms"] is not None and d["p99_ms"] is not None and 0 < d["p50_ms"] <= d["p99_ms"] <= d["max_ms"]
    assert set(d["routes"]) <= {"image", "audio", "text"} and "image" in d["routes"]
    table = report.table()
    assert table.splitlines()[0].split() == ["route", "sent", "ok", "errors", "p50", "ms", "p99", "ms", "max", "ms"]
    assert json.loads(json.dumps(d)) == d     # one JSON line

    fams = _families(server.url)
    req = fams["inference_request_duration_seconds"]
    assert req.type == "histogram"
    counts = {(s.labels["route"], s.labels["status"]): s.value for s in req.samples if s.name.endswith("_count")}
    assert sum(counts.values()) == d["ok"]
    for route, rs in d["routes"].items():
        assert counts.get((route, "ok"), 0) + counts.get((route, "deadline_exceeded"), 0) == rs["ok"]
    buckets = [s for s in req.samples if s.name.endswith("_bucket") and s.labels["route"] == "image"
               and s.labels["status"] == "ok"]
    assert buckets[-1].labels["le"] == "+Inf" and [b.value for b in buckets] == sorted(b.value for b in buckets)
    stage = fams["inference_stage_duration_seconds"]
    seen = {s.labels["stage"] for s in stage.samples if s.name.endswith("_count") and s.value > 0}
    assert seen == set(STAGES)
    batch = fams["inference_batch_size"]
    n_batches = sum(s.value for s in batch.samples if s.name.endswith("_count"))
    n_items = sum(s.value for s in batch.samples if s.name.endswith("_sum"))
    assert n_items == d["ok"] and 1 <= n_batches <= n_items
    assert fams["inference_queue_depth"].type == "gauge"
    assert {s.labels["queue"] for s in fams["inference_queue_depth"].samples} == \
        {"preprocess"} | {f"batch_{m}" for m in MODELS}
    moved = {s.labels["direction"]: s.value for s in fams["inference_transfer_bytes"].samples
             if s.name.endswith("_total") and s.labels["model"] == "vit"}
    vit_items = next(s.value for s in batch.samples if s.name.endswith("_sum") and s.labels["model"] == "vit")
    assert moved["h2d"] == vit_items * 3 * 224 * 224 * 4 and moved["d2h"] == vit_items * 1000 * 4
    # info metrics read back as gauges (text format 0.0.4 has no info type)
    assert fams["inference_knobs_info"].samples[0].labels["pinned"] == "true"
    assert fams["inference_net_fault_info"].samples[0].labels["method"] == "off"


def test_loadgen_command_line_prints_a_table_and_a_json_line(server):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "examples.inference.loadgen", "--url", server.url, "--rate", "6",
                        "--duration", "2", "--arrival", "constant", "--mix", "text=1", "--concurrency", "4"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout.strip().splitlines()[-1])
    assert d["kind"] == "loadgen" and d["sent"] == 11 and d["ok"] == 11       # constant 6/s for 2 s: t=1/6..11/6
    assert d["p50_ms"] > 0 and d["p99_ms"] >= d["p50_ms"] and list(d["routes"]) == ["text"]
    assert p.stderr.splitlines()[0].startswith("route")
    bad = subprocess.run([sys.executable, "-m", "examples.inference.loadgen", "--mix", "video=1"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("loadgen: mix:")


def test_loadgen_counts_connection_errors():
    spec = LoadSpec(url="http://127.0.0.1:9", rate=20, duration=0.5, mix={"text": 1.0}, concurrency=2)
    d = run_load(spec, make_payloads(seed=1, images=1, audios=1, texts=2, audio_seconds=(1, 1))).to_dict()
    assert d["ok"] == 0 and d["error_count"] == d["sent"] > 0
    assert all(k.startswith("conn_") for k in d["errors"])
    assert d["p50_ms"] is None


def test_percentile_nearest_rank():
    v = [float(i) for i in range(1, 101)]
    assert percentile(v, 50) == 50.0 and percentile(v, 99) == 99.0 and percentile(v, 100) == 100.0
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) is None


# --------------------------------------------------------------------------------------------
# the host-buffer knobs on the stand-in backend
# --------------------------------------------------------------------------------------------
def test_buffer_knobs_change_the_copy_path_not_the_answer():
    knobs = {"k": Knobs()}
    be = CpuBackend(lambda: knobs["k"])
    rng = np.random.default_rng(0)
    items = [rng.standard_normal((3, 224, 224), dtype=np.float32) for _ in range(4)]
    results = {}
    for name, k in {"pinned": Knobs(), "pageable": Knobs(pinned=False), "churn": Knobs(pin_churn=True),
                    "upload": Knobs(upload_mib=4)}.items():
        knobs["k"] = k
        results[name] = be.run_batch("vit", items)
    base = np.stack(results["pinned"].outputs)
    for name, r in results.items():
        np.testing.assert_array_equal(np.stack(r.outputs), base, err_msg=name)
        assert r.h2d_s > 0 and r.model_s > 0 and r.d2h_bytes == 4 * 1000 * 4
    assert results["pinned"].h2d_bytes == 4 * 3 * 224 * 224 * 4
    assert results["upload"].h2d_bytes == results["pinned"].h2d_bytes + 4 * (1 << 20)
    be.close()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_cpu_affinity_knob_confines_the_preprocessing_workers(server, payloads):
    one = max(os.sched_getaffinity(0))
    code, body = _post(server.url + "/admin/knobs", json.dumps({"workers": 1, "cpu_affinity": [one]}).encode())
    assert code == 200 and body["knobs"]["cpu_affinity"] == [one]
    pool = server.service.pool
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and not (pool.size() == 1 and
                                               all(os.sched_getaffinity(t) == {one} for t in pool.native_ids())):
        time.sleep(0.02)
    assert pool.size() == 1 and [os.sched_getaffinity(t) for t in pool.native_ids()] == [{one}]
    code, _ = _post(server.url + "/v1/image", payloads.image[0])
    assert code == 200
    _post(server.url + "/admin/knobs", json.dumps({"cpu_affinity": None}).encode())
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and os.sched_getaffinity(pool.native_ids()[0]) != os.sched_getaffinity(0):
        time.sleep(0.02)
    assert os.sched_getaffinity(pool.native_ids()[0]) == os.sched_getaffinity(0)


def test_noisy_neighbour_process_starts_and_stops(server):
    code, body = _post(server.url + "/admin/knobs", b'{"noisy_neighbour": "compute"}')
    assert code == 200 and body["applied"]["noisy_neighbour"] == "compute" and body["warnings"] == []
    nb = server.service.neighbour
    pid = nb.pid
    assert pid is not None and os.path.exists(f"/proc/{pid}")
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"examples.inference.neighbour" in cmdline and b"compute" in cmdline
    fams = _families(server.url)
    assert fams["inference_noisy_neighbour_running"].samples[0].value == 1
    code, body = _post(server.url + "/admin/knobs", b'{"noisy_neighbour": "off"}')
    assert code == 200 and nb.pid is None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and \
            Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    assert _families(server.url)["inference_noisy_neighbour_running"].samples[0].value == 0


def test_server_command_line_starts_reports_ready_and_stops(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "examples.inference.server", "--backend", "cpu", "--port", "0",
                          "--net-tool", "off", "--set", "batch_size=4", "--knobs-file", str(tmp_path / "k.yaml")],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        ready = json.loads(p.stdout.readline())
        assert ready["event"] == "ready" and ready["knobs"]["batch_size"] == 4
        code, body = _post(ready["url"] + "/v1/text", b'{"text": "hello"}')
        assert code == 200
    finally:
        p.terminate()
        p.wait(timeout=20)
    assert p.returncode == 0
    bad = subprocess.run([sys.executable, "-m", "examples.inference.server", "--port", "0", "--set", "batch_size=0"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "server: batch_size: must be an integer from 1 to 512, got 0"
