"""Scenario runner: two service instances, one healthy and one carrying a fault, scripted, with a timeline.

    python -m examples.inference.scenarios --short                                   # CPU stand-in, seconds
    python -m examples.inference.scenarios --backend torch --gpus 0,1 --hold 60      # the H200 machine

It starts instance ``a`` (healthy, workload ``inference-a``) and ``b`` (the faulty one, ``inference-b``)
as ``python -m examples.inference.server`` processes (``--gpus 0,1``: a on GPU 0, b on GPU 1; ``--gpus
0``: both on GPU 0), then for every scenario sets each instance's knobs through ``POST
/admin/knobs?replace=1`` (a: its start-up values; b: the scenario's fault), drives both with the load
generator for ``--hold`` seconds (at least 45 unless ``--short``), and appends to ``--timeline`` one
JSON line per instance: scenario, start, end, instance, workload, GPU, the knobs in force (as the
service reported them back), warnings (a fault the host cannot apply says so here), the load and the
client-side p50/p99/errors, and the **expected** state, cause and page.

Expected states are the per-accelerator verdict's (docs/workloads.md); causes are ``triscope rca``'s
cause keys.  ``expected_state`` is a list: any of them is right.  The table is ``SCENARIOS`` below
and README.md's scenario table.  With the CPU stand-in (``--short``) the run checks the plumbing
(knobs applied, load served, timeline written); only the torch backend on a GPU makes the states.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .loadgen import LoadSpec, make_payloads, run_load

REPO = Path(__file__).resolve().parents[2]
MIN_HOLD_S = 45.0
CPU_UPLOAD_CAP_MIB = 8   # the CPU stand-in's upload_mib in the scenarios (its copies are numpy, not DMA)


@dataclass(frozen=True)
class Expect:
    states: tuple[str, ...]
    cause: str | None
    page: bool
    note: str = ""


HEALTHY_LOW = Expect(("demand-limited", "idle"), None, False, "not asked for much: never an I/O state, never a page")
HEALTHY_FULL = Expect(("compute-bound", "balanced", "demand-limited"), None, False,
                      "busy doing its job, or, where the service's CPUs cap its rate far below what the GPU "
                      "could do (an H200 at 20 requests/s per instance), not asked for more: no page")


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    fault: dict[str, Any]                       # b's knobs (a always runs its start-up values)
    load_a: str                                 # light | full | heavy
    load_b: str
    expect_b: Expect
    expect_a: Expect
    neighbour: dict[str, Expect] = field(default_factory=dict)   # gpu layout ("two", "one") -> the hog's GPU


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("healthy_low", "both healthy, light load", {}, "light", "light", HEALTHY_LOW, HEALTHY_LOW),
    Scenario("healthy_full", "both healthy, full load", {}, "full", "full", HEALTHY_FULL, HEALTHY_FULL),
    Scenario("pageable", "b copies in from pageable memory (with 512 MiB per batch)",
             {"pinned": False, "upload_mib": 512}, "light", "full",
             Expect(("staging-bound",), "host_staging", True,
                    "the driver stages every copy through its own pinned buffers at ~40 % of the pinned rate, "
                    "a feeder thread busy copying while the SMs wait"), HEALTHY_LOW),
    Scenario("one_core", "b: preprocessing confined to one core (two workers on it), heavy load",
             {"workers": 2, "cpu_affinity": [0]}, "light", "heavy",
             Expect(("staging-bound",), "host_staging", True,
                    "one core's worth of preprocessing: the workers wait for their core (run-queue wait), "
                    "requests queue, the GPU starves with the link quiet.  (One worker alone is a thread "
                    "pegged with a quiet link, which the verdict does not page: a spin-wait reads the same; "
                    "docs/workloads.md)"), HEALTHY_LOW),
    Scenario("pin_churn", "b pins a fresh host buffer for every batch (with 128 MiB per batch)",
             {"pin_churn": True, "upload_mib": 128}, "light", "full",
             Expect(("staging-bound",), "dma_mapping", True,
                    "cudaHostRegister/Unregister per batch: the dma:dma_map_* rate jumps from ~0 "
                    "(DMA maps fire when memory is pinned, not per copy)"), HEALTHY_LOW),
    Scenario("pcie_saturation", "b: large pinned batches at the link's limit (4 GiB more per batch)",
             {"upload_mib": 4096, "batch_size": 64}, "light", "full",
             Expect(("io-saturated",), "pcie_load", True,
                    "H2D near ~55-60 GB/s, the link's ceiling, the SMs mostly idle"), HEALTHY_LOW),
    Scenario("net_drop", "b drops 5 % of its port's packets", {"net_drop": 0.05}, "light", "full",
             Expect(("network-bound",), "network", True,
                    "TCP retransmits on the service port; the GPU waits on requests that arrive late"),
             HEALTHY_LOW),
    Scenario("neighbour_copy", "b starts a copy hog (512 MiB pinned H2D+D2H loops)", {"noisy_neighbour": "copy"},
             "full", "full",
             Expect(("compute-bound", "balanced"), None, False,
                    "two GPUs: the hog runs on the other GPU (a's), so b itself is unaffected unless both "
                    "links share a switch or host memory bandwidth; one GPU: see the neighbour line"),
             HEALTHY_FULL,
             neighbour={
                 "two": Expect(("io-saturated",), "pcie_load", False,
                               "the hog's GPU (a's): link at its ceiling from a second process; the verdict's "
                               "workload is the one with the larger SM share (a), so a page would name the "
                               "wrong workload: the evidence must show the second process"),
                 "one": Expect(("io-saturated",), "pcie_load", False,
                               "all on one GPU: the hog fills the link, both services' H2D waits behind it, "
                               "their latency rises; a page only if their SLO burns")}),
    Scenario("neighbour_compute", "b starts a compute hog (bf16 8192^3 matrix products)",
             {"noisy_neighbour": "compute"}, "full", "full",
             Expect(("compute-bound", "balanced"), None, False,
                    "two GPUs: the hog runs on a's GPU; b is unaffected"), HEALTHY_FULL,
             neighbour={
                 "two": Expect(("compute-bound",), "accelerator_activity", False,
                               "a's GPU: SMs shared with a second process, a's latency rises with no I/O "
                               "evidence: not an I/O state"),
                 "one": Expect(("compute-bound",), "accelerator_activity", False,
                               "one GPU: SMs shared by the services and the hog; not an I/O state")}),
    Scenario("recovered", "both healthy again, full load", {}, "full", "full", HEALTHY_FULL, HEALTHY_FULL),
)


@dataclass
class LoadLevels:
    """Requests per second per instance.  torch: measured on one H200 (calibrate.py), one instance alone
    served ~80/s with this mix before its queues grew (the model stage the busiest, batches small).  Two
    instances and the load generator share the host's 16 cores: at 30/s each (the first recording) each
    instance used 6-9 cores and their threads waited for a CPU 40-50 % of the time, client p99 0.5-0.75 s,
    which is the host's limit, not a healthy full load; "full" is 20/s each; "heavy" (one_core) is past
    one worker's ~45/s."""

    light: float
    full: float
    heavy: float
    mix: dict[str, float]
    audio_seconds: tuple[float, float]
    concurrency: int

    def rate(self, level: str) -> float:
        return {"light": self.light, "full": self.full, "heavy": self.heavy}[level]


LEVELS = {
    "cpu": LoadLevels(light=2.0, full=6.0, heavy=9.0, mix={"image": 0.5, "audio": 0.2, "text": 0.3},
                      audio_seconds=(5, 8), concurrency=8),
    "torch": LoadLevels(light=4.0, full=20.0, heavy=50.0, mix={"image": 0.45, "audio": 0.35, "text": 0.2},
                        audio_seconds=(5, 30), concurrency=64),
}


class Instance:
    """One ``examples.inference.server`` process."""

    def __init__(self, name: str, backend: str, gpu: int, workdir: Path, extra: list[str],
                 startup_timeout: float, port: int = 0, knobs_dir: Path | None = None, wait: bool = True) -> None:
        self.name = name
        self.workload = f"inference-{name}"
        self.gpu = gpu
        # DIR/<workload>.yaml: the file the engine's knobs-file fallback writes for this workload
        self.knobs_file = (knobs_dir or workdir) / f"{self.workload}.yaml"
        cmd = [sys.executable, "-m", "examples.inference.server", "--backend", backend, "--port", str(port),
               "--gpu", str(gpu), "--workload", self.workload, "--knobs-file", str(self.knobs_file), *extra]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # One BLAS thread per preprocessing worker (unless the caller says otherwise), as a service on a shared
        # host is deployed: numpy's OpenBLAS pool is as wide as the host and its threads spin after every call
        # (the log-mel's matrix product), so each instance burned 1.7-2.5 cores at 4 requests/s and 6.5-7.6 at
        # 20/s in the second session's recordings, the host's 16 cores full with no fault at all.
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")
        self.log_path = workdir / f"{self.workload}.log"
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._log)
        self.ready: dict[str, Any] = {}
        self.url = ""
        self._box: dict[str, Any] = {}
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        if wait:
            self.wait_ready(startup_timeout)

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            self._log.write(raw)
            self._log.flush()
            if not self._box:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict) and doc.get("event") == "ready":
                    self._box.update(doc)

    def wait_ready(self, timeout: float) -> None:
        """Until the server printed its ``ready`` line (models built and warmed up)."""
        box = self._box
        deadline = time.monotonic() + timeout
        while not box and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        if not box:
            self.stop()
            raise RuntimeError(f"instance {self.name} did not start within {timeout:g} s "
                               f"(exit {self.proc.returncode}); see {self.log_path}")
        self.ready = box
        self.url = str(box["url"])

    def set_knobs(self, knobs: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(f"{self.url}/admin/knobs?replace=1", data=json.dumps(knobs).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return dict(json.loads(r.read()))
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"instance {self.name} refused knobs {knobs}: {e.read().decode().strip()}") from None

    def knobs(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/admin/knobs", timeout=10) as r:
            return dict(json.loads(r.read()))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


def server_snapshot(url: str) -> dict[str, float]:
    """The counters of one instance's /metrics that the timeline summarises, keyed ``name|label=value,...``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in ("inference_stage_duration_seconds", "inference_batch_size", "inference_transfer_bytes"):
            continue
        for smp in fam.samples:
            if smp.name.endswith(("_sum", "_count", "_total")):
                key = smp.name + "|" + ",".join(f"{k}={v}" for k, v in sorted(smp.labels.items()))
                out[key] = smp.value
    return out


def server_delta(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, Any]:
    """Server-side view of a window: mean stage times, stage-seconds per second (overlapping streams can
    add past 1), batches, mean batch size, H2D GB/s."""
    def total(prefix: str, **labels: str) -> float:
        sel = [k for k in after if k.startswith(prefix + "|") and all(f"{a}={b}" in k for a, b in labels.items())]
        return sum(after[k] - before.get(k, 0.0) for k in sel)
    stages = ("decode", "preprocess", "queue", "h2d", "model", "d2h")
    mean_ms, busy = {}, {}
    for st in stages:
        n = total("inference_stage_duration_seconds_count", stage=st)
        sec = total("inference_stage_duration_seconds_sum", stage=st)
        mean_ms[st] = round(sec / n * 1000, 3) if n else None
        busy[st] = round(sec / wall, 4) if wall > 0 else None
    batches = total("inference_batch_size_count")
    items = total("inference_batch_size_sum")
    return {"stage_mean_ms": mean_ms, "stage_seconds_per_second": busy, "batches": int(batches),
            "mean_batch": round(items / batches, 2) if batches else None,
            "h2d_gbps": round(total("inference_transfer_bytes_total", direction="h2d") / wall / 1e9, 3) if wall else None}


def _line(sc: Scenario, inst: Instance, role: str, expect: Expect, start: float, end: float,
          report: dict[str, Any] | None, knob_reply: dict[str, Any] | None, load: dict[str, Any] | None,
          server: dict[str, Any] | None = None) -> dict[str, Any]:
    client = None
    if report is not None:
        client = {k: report.get(k) for k in ("sent", "ok", "error_count", "errors", "p50_ms", "p99_ms",
                                             "achieved_rps")}
    return {"scenario": sc.name, "title": sc.title, "start": round(start, 3), "end": round(end, 3),
            "instance": inst.name, "role": role, "workload": inst.workload, "url": inst.url, "gpu": inst.gpu,
            "knobs": (knob_reply or {}).get("knobs"), "knob_warnings": (knob_reply or {}).get("warnings", []),
            "applied": (knob_reply or {}).get("applied"), "load": load, "client": client, "server": server,
            "expected_state": list(expect.states), "expected_cause": expect.cause, "page": expect.page,
            "note": expect.note}


def _drive(inst: Instance, level: str, lv: LoadLevels, hold_s: float, scenario: str, payloads: Any,
           reports: dict[str, dict[str, Any]]) -> None:
    spec = LoadSpec(url=inst.url, rate=lv.rate(level), duration=hold_s, mix=lv.mix,
                    concurrency=lv.concurrency, seed=zlib.crc32(f"{scenario}/{inst.name}".encode()) & 0xFFFF,
                    image_model="mixed")
    reports[inst.name] = run_load(spec, payloads).to_dict()


def run_scenarios(backend: str = "cpu", gpus: tuple[int, ...] = (0,), hold_s: float = 60.0,
                  timeline: Path = Path("scenarios.jsonl"), only: list[str] | None = None,
                  workdir: Path | None = None, server_args: list[str] | None = None,
                  levels: LoadLevels | None = None, startup_timeout: float = 300.0,
                  log: Any = sys.stderr, ports: tuple[int, int] = (0, 0), knobs_dir: Path | None = None,
                  loop: LoopClosed | None = None) -> list[dict[str, Any]]:
    """Run the scenarios, then the closed loop when ``loop`` is given; returns the timeline lines
    (also appended to ``timeline``)."""
    chosen = [s for s in SCENARIOS if not only or s.name in only]
    unknown = sorted(set(only or []) - {s.name for s in SCENARIOS})
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r} (scenarios: {', '.join(s.name for s in SCENARIOS)})")
    lv = levels or LEVELS[backend]
    workdir = workdir or timeline.parent
    workdir.mkdir(parents=True, exist_ok=True)
    timeline.parent.mkdir(parents=True, exist_ok=True)
    layout = "two" if len(set(gpus)) > 1 else "one"
    extra = list(server_args or [])
    if backend == "cpu":
        extra += ["--cpu-model-scale", "1.0"]
    payloads = make_payloads(seed=7, audio_seconds=lv.audio_seconds)
    print(f"scenarios: starting instances a (GPU {gpus[0]}) and b (GPU {gpus[-1]}), backend {backend}", file=log)
    # both start at once (each builds and warms its models), then both are waited for
    a = Instance("a", backend, gpus[0], workdir, extra, startup_timeout, ports[0], knobs_dir, wait=False)
    b = Instance("b", backend, gpus[-1], workdir, extra, startup_timeout, ports[1], knobs_dir, wait=False)
    try:
        a.wait_ready(startup_timeout)
        b.wait_ready(startup_timeout)
    except Exception:
        a.stop()
        b.stop()
        raise
    lines: list[dict[str, Any]] = []
    try:
        with timeline.open("a", buffering=1) as out:
            for sc in chosen:
                reply_a = a.set_knobs({})
                fault = dict(sc.fault)
                if backend == "cpu" and "upload_mib" in fault:   # the stand-in copies in Python: keep it short
                    fault["upload_mib"] = min(int(fault["upload_mib"]), CPU_UPLOAD_CAP_MIB)
                if fault.get("cpu_affinity"):   # "one core": core 0, or the first this host lets us use
                    allowed = sorted(os.sched_getaffinity(0))
                    fault["cpu_affinity"] = [c if c in allowed else allowed[0] for c in fault["cpu_affinity"]]
                reply_b = b.set_knobs(fault)
                reports: dict[str, dict[str, Any]] = {}
                loads = {"a": sc.load_a, "b": sc.load_b}
                snaps = {i.name: server_snapshot(i.url) for i in (a, b)}
                start = time.time()
                print(f"scenarios: {sc.name}: {sc.title} (hold {hold_s:g} s)", file=log)
                threads = [threading.Thread(target=_drive, args=(inst, loads[inst.name], lv, hold_s, sc.name, payloads,
                                                                 reports), daemon=True) for inst in (a, b)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                end = time.time()
                server = {i.name: server_delta(snaps[i.name], server_snapshot(i.url), end - start) for i in (a, b)}
                for inst, role, exp, reply in ((a, "healthy", sc.expect_a, reply_a), (b, "faulty", sc.expect_b, reply_b)):
                    rate = lv.rate(loads[inst.name])
                    line = _line(sc, inst, role, exp, start, end, reports.get(inst.name), reply,
                                 {"level": loads[inst.name], "rate": rate, "mix": lv.mix}, server[inst.name])
                    lines.append(line)
                    out.write(json.dumps(line) + "\n")
                if sc.neighbour:
                    exp = sc.neighbour[layout]
                    hog_gpu = gpus[0] if layout == "two" else gpus[-1]
                    line = _line(sc, b, "neighbour", exp, start, end, None, reply_b, None)
                    line.update(instance="b:neighbour", gpu=hog_gpu, workload="cmd:python (the hog process)")
                    lines.append(line)
                    out.write(json.dumps(line) + "\n")
                for name in ("a", "b"):
                    r, sv = reports.get(name, {}), server[name]
                    print(f"scenarios: {sc.name}: {name} {r.get('achieved_rps')}/s p50 {r.get('p50_ms')} ms "
                          f"p99 {r.get('p99_ms')} ms errors {r.get('error_count')}; server: stage ms "
                          f"{sv['stage_mean_ms']}, model s/s {sv['stage_seconds_per_second']['model']}, "
                          f"batch {sv['mean_batch']}, h2d {sv['h2d_gbps']} GB/s", file=log)
                if reply_b.get("warnings"):
                    print(f"scenarios: {sc.name}: b warnings: {reply_b['warnings']}", file=log)
            a.set_knobs({})
            b.set_knobs({})
            if loop is not None:
                line = loop.run(a, b, lv, payloads, log)
                lines.append(line)
                out.write(json.dumps(line) + "\n")
    finally:
        a.stop()
        b.stop()
    return lines


@dataclass
class LoopClosed:
    """The loop closed: b healthy at full load (``before_s``), then the fault set through the admin
    endpoint, held until the remediation engine's fallback reaches b through its knobs file (the
    service reports the knobs' source as ``file``) or ``max_fault_s``, then ``settle_s`` while the
    backlog the fault left drains (its p99 reported apart as ``draining``), then ``after_s`` more.  a runs
    light all along and must never be acted on (its knobs file must not appear).  ``before_cmd``
    (a shell command) runs first: the recording switches the engine from dry-run to acting there.

    The line written: fault onset, when the fallback was seen, the client's p99 before / during /
    after, and a's knobs source at the end."""

    fault: dict[str, Any]
    before_s: float = 20.0
    max_fault_s: float = 80.0
    after_s: float = 30.0
    settle_s: float = 10.0
    before_cmd: str = ""
    level_b: str = "full"

    def run(self, a: Instance, b: Instance, lv: LoadLevels, payloads: Any, log: Any) -> dict[str, Any]:
        if self.before_cmd:
            rc = subprocess.run(self.before_cmd, shell=True, timeout=60).returncode
            print(f"scenarios: loop_closed: before-loop command exited {rc}", file=log)
        total = self.before_s + self.max_fault_s + self.settle_s + self.after_s + 5
        a_report: dict[str, Any] = {}
        a_stop = threading.Event()

        def drive_a() -> None:
            spec = LoadSpec(url=a.url, rate=lv.light, duration=total, mix=lv.mix, concurrency=lv.concurrency,
                            seed=101, image_model="mixed")
            a_report.update(run_load(spec, payloads, stop=a_stop).to_dict())

        ta = threading.Thread(target=drive_a, daemon=True)
        ta.start()

        def load_b(duration: float, stop: threading.Event | None = None, seed: int = 0) -> dict[str, Any]:
            spec = LoadSpec(url=b.url, rate=lv.rate(self.level_b), duration=duration, mix=lv.mix,
                            concurrency=lv.concurrency, seed=seed, image_model="mixed")
            return run_load(spec, payloads, stop=stop).to_dict()

        start = time.time()
        print(f"scenarios: loop_closed: b healthy {self.before_s:g} s", file=log)
        before = load_b(self.before_s, seed=1)
        reply = b.set_knobs(self.fault)
        onset = time.time()
        print(f"scenarios: loop_closed: fault {self.fault} set on b; waiting for the engine", file=log)
        seen: dict[str, Any] = {}
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set() and time.time() - onset < self.max_fault_s:
                try:
                    k = b.knobs()
                except OSError:
                    k = {}
                if k.get("source") == "file" and k.get("file_sha256"):
                    seen.update(ts=time.time(), knobs=k)
                    stop.set()
                    return
                time.sleep(0.25)
            stop.set()

        tw = threading.Thread(target=watch, daemon=True)
        tw.start()
        during = load_b(self.max_fault_s, stop=stop, seed=2)
        tw.join(timeout=5)
        acted = seen.get("ts")
        print(f"scenarios: loop_closed: fallback {'seen after %.1f s' % (acted - onset) if acted else 'NOT seen'}",
              file=log)
        draining = load_b(self.settle_s, seed=3)
        after = load_b(self.after_s, seed=4)
        end = time.time()
        a_stop.set()
        ta.join(timeout=30)
        try:
            a_knobs = a.knobs()
        except OSError:
            a_knobs = {}

        def cl(r: dict[str, Any]) -> dict[str, Any]:
            return {k: r.get(k) for k in ("sent", "ok", "error_count", "p50_ms", "p99_ms", "achieved_rps")}

        p99 = {k: r.get("p99_ms") for k, r in (("before", before), ("during", during), ("draining", draining),
                                               ("after", after))}
        return {"scenario": "loop_closed", "title": "b's fault fixed by the engine's knobs-file fallback",
                "start": round(start, 3), "end": round(end, 3), "instance": "b", "role": "faulty",
                "workload": b.workload, "url": b.url, "gpu": b.gpu, "fault": self.fault,
                "fault_knobs": reply.get("knobs"), "fault_onset": round(onset, 3),
                "fallback_seen": None if acted is None else round(acted, 3),
                "onset_to_fallback_s": None if acted is None else round(acted - onset, 2),
                "knobs_after": (seen.get("knobs") or {}).get("knobs"),
                "client": {"before": cl(before), "during": cl(during), "draining": cl(draining), "after": cl(after)},
                "p99_ms": p99, "settle_s": self.settle_s,
                "after_within_20pct": (None if not (p99["before"] and p99["after"])
                                       else p99["after"] <= 1.2 * p99["before"]),
                "healthy": {"workload": a.workload, "client": cl(a_report), "knobs_source": a_knobs.get("source"),
                            "knobs_file_exists": a.knobs_file.exists()},
                "expected_state": ["staging-bound"], "expected_cause": "host_staging", "page": True,
                "note": "the engine (dry-run during the scenarios) acts from here on"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("cpu", "torch"), default="cpu")
    ap.add_argument("--gpus", default="0", help="a's and b's GPU: '0,1', or '0' for both on one")
    ap.add_argument("--hold", type=float, default=60.0, help=f"seconds per scenario (at least {MIN_HOLD_S:g})")
    ap.add_argument("--short", action="store_true", help="3 s per scenario: a plumbing check, no states")
    ap.add_argument("--timeline", type=Path, default=Path("scenarios.jsonl"))
    ap.add_argument("--only", default="", help="comma-separated scenario names, in the table's order")
    ap.add_argument("--rate-light", type=float, default=None)
    ap.add_argument("--rate-full", type=float, default=None)
    ap.add_argument("--server-arg", action="append", default=[], help="passed to both servers (repeatable)")
    ap.add_argument("--startup-timeout", type=float, default=300.0)
    ap.add_argument("--list", action="store_true", help="print the scenario table and exit")
    ap.add_argument("--ports", default="0,0", help="a's and b's ports (0: any free one)")
    ap.add_argument("--knobs-dir", type=Path, default=None,
                    help="where each instance's knobs file is (DIR/inference-a.yaml, DIR/inference-b.yaml): the "
                         "directory the engine's knobs-file fallback writes to (default: the timeline's folder)")
    ap.add_argument("--loop-closed", action="store_true",
                    help="after the scenarios: b at full load, then pageable buffers, held until the engine's "
                         "fallback reaches b through its knobs file; p99 before, during, after")
    ap.add_argument("--before-loop", default="", metavar="CMD", help="a shell command run before the closed loop")
    ap.add_argument("--loop-max-fault", type=float, default=80.0, help="longest the loop's fault is held (s)")
    args = ap.parse_args(argv)
    if args.list:
        for s in SCENARIOS:
            print(json.dumps({"scenario": s.name, "title": s.title, "fault": s.fault, "load": [s.load_a, s.load_b],
                              "expect_b": [list(s.expect_b.states), s.expect_b.cause, s.expect_b.page],
                              "expect_a": [list(s.expect_a.states), s.expect_a.cause, s.expect_a.page]}))
        return 0
    hold = 3.0 if args.short else args.hold
    if not args.short and hold < MIN_HOLD_S:
        print(f"scenarios: --hold must be at least {MIN_HOLD_S:g} s (the agent needs several windows); "
              "--short for a plumbing check", file=sys.stderr)
        return 2
    try:
        gpus = tuple(int(g) for g in args.gpus.split(",") if g.strip())
    except ValueError:
        print(f"scenarios: --gpus: expected GPU indices like 0,1, got {args.gpus!r}", file=sys.stderr)
        return 2
    lv = LEVELS[args.backend]
    full = args.rate_full or lv.full
    levels = LoadLevels(light=args.rate_light or lv.light, full=full, heavy=lv.heavy * full / lv.full, mix=lv.mix,
                        audio_seconds=lv.audio_seconds, concurrency=lv.concurrency)
    try:
        ports = tuple(int(p) for p in args.ports.split(","))
        if len(ports) != 2:
            raise ValueError(f"--ports: expected two ports like 9601,9602, got {args.ports!r}")
        loop = None
        if args.loop_closed:
            fault = {"pinned": False, "upload_mib": 256 if args.backend == "torch" else CPU_UPLOAD_CAP_MIB}
            loop = LoopClosed(fault, max_fault_s=args.loop_max_fault, before_cmd=args.before_loop,
                              before_s=3.0 if args.short else 15.0, after_s=3.0 if args.short else 30.0,
                              settle_s=1.0 if args.short else 10.0)
        lines = run_scenarios(args.backend, gpus or (0,), hold, args.timeline,
                              [s for s in args.only.split(",") if s] or None, server_args=args.server_arg,
                              levels=levels, startup_timeout=args.startup_timeout, ports=(ports[0], ports[1]),
                              knobs_dir=args.knobs_dir, loop=loop)
    except (ValueError, RuntimeError) as e:
        print(f"scenarios: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"scenarios": len({ln["scenario"] for ln in lines}), "lines": len(lines),
                      "timeline": str(args.timeline)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
