"""The fourth set: held-out classes for the wait-for verdict, on the GPU machine and in the CPU lab.

    # the GPU machine (h200.py, run by h200_record.sh): all eight, or the two halves
    python -m examples.hostlab.h200 --node h200-lab-7 --out OUT --hold 50 --only fourth      # or fourth-a / fourth-b
    # the CPU lab (lab.py, the GPU simulated through the stand-in driver library)
    sudo .venv/bin/python -m examples.hostlab.lab --node cpu-lab-3 --set fourth --hold 50

The verdict is being rebuilt to decide on what the thread that drives the accelerator waits on and
who ends those waits.  These classes are what it will be scored on, written before its rules are
fixed, with serving code the project had not seen (``feeder.py``/``fed_service.py``,
``service_http.py``/``loadclient.py``, ``launchloop.py``, ``burner.py``) written as ordinary serving
code is, nothing tuned for triscope.  Every service runs in a Kubernetes-style pod (``pods.py``: a
kubelet's cgroup path and ``/var/log/pods`` directory, no kubelet), so the verdicts carry pod labels:
a timeline line names its instance by pod (``workload``) and lists every name a right verdict may
give (``accept``: the pod, its containers, which are also the processes' names).  The fault may be
on the **heavier** instance a as well as on b (``faulty``); classes without one are healthy: any
non-I/O state, never a page.

**The expectations in ``DEVICE`` and ``CPU`` below were written on 2026-12-06, before the wait-for
rules were fixed, and are never edited after a recording is made with them.**
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .lab import A_PORT, B_PORT, HEALTHY, NFT_TABLE, drop, nft
from .pods import PODS_LOG_DIR, Pod, remove_parents

REPO = Path(__file__).resolve().parents[2]
WRITTEN = "2026-12-06"
A_HTTP, B_HTTP, FEED_TCP = 47841, 47842, 47843
NAMESPACE = "lab"


@dataclass(frozen=True)
class Proc:
    """One process of an instance: ``module`` of ``examples.hostlab`` with ``args`` (``{busy}``,
    ``{run}``, ``{libcuda}`` filled in at start), in container ``container`` of the instance's pod
    (also its process name); ``container=""``: a host process outside every pod (a load client,
    standing for traffic from off the node).  ``gpu``: the process that drives the GPU."""

    container: str
    module: str
    args: tuple[str, ...]
    gpu: bool = False
    cpu_max: float | None = None       # the container's CFS limit (cores), set when the pod is made


@dataclass(frozen=True)
class Instance:
    pod: str
    procs: tuple[Proc, ...]
    weight: int | None = None          # the pod's cpu.weight (v1: the matching cpu.shares)
    loss: float | None = None          # share of the packets of its upstream's port dropped (after ready)
    loss_port: int = 0

    @property
    def accept(self) -> list[str]:
        """The names a verdict may give for this instance: its pod and its containers."""
        return list(dict.fromkeys([self.pod, *(p.container for p in self.procs if p.container)]))


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    a: Instance
    b: Instance
    expect: tuple[str, ...]
    faulty: str | None                 # "a", "b", or None (both healthy)
    note: str = ""
    hog: Instance | None = None        # a pod with no GPU started once a and b are ready
    knobs: dict[str, Any] = field(default_factory=dict)


def _sim(batch_us: float, item_us: float, layers: int = 20) -> tuple[str, ...]:
    return ("--backend", "sim", "--busy-file", "{busy}", "--libcuda", "{libcuda}", "--sim-batch-us", str(batch_us),
            "--sim-item-us", str(item_us), "--sim-layers", str(layers))


def http(pod: str, port: int, *, model: str = "resnet18", batch: int = 8, poll: str = "block", upstream: int = 0,
         fetch_bytes: int = 65536, pool: int = 0, rate: float = 2.0, conns: int = 1, image: int = 384,
         burst: int = 0, period: float = 2.0, sim: tuple[str, ...] = (), weight: int | None = None,
         loss: float | None = None) -> Instance:
    """``service_http.py`` in pod ``pod`` and its load client (a host process)."""
    svc = ["--port", str(port), "--model", model, "--batch", str(batch), "--poll", poll]
    if upstream:
        svc += ["--upstream", f"127.0.0.1:{upstream}", "--fetch-bytes", str(fetch_bytes)]
    if pool:
        svc += ["--decode-pool", str(pool)]
    client = ["--port", str(port), "--rate", str(rate), "--conns", str(conns), "--image", str(image)]
    if burst:
        client += ["--burst", str(burst), "--period", str(period)]
    return Instance(pod, (Proc(pod, "service_http", (*svc, *sim), gpu=True),
                          Proc("", "loadclient", tuple(client))),
                    weight=weight, loss=loss, loss_port=upstream if loss else 0)


def fed(pod: str, transport: str, *, model: str = "", batch: int, image: int, prep_cpu: float,
        sim: tuple[str, ...] = (), weight: int | None = None) -> Instance:
    """A GPU container fed by a decode sidecar container of the same pod (``feeder.py``)."""
    if transport == "unix":           # the socket in a directory both containers mount (an emptyDir)
        where = gpu_where = ("--socket", "{run}/" + pod + "-feed.sock")
    else:
        where, gpu_where = ("--port", str(FEED_TCP)), ("--connect", f"127.0.0.1:{FEED_TCP}")
    model_arg = ("--model", model) if model else ()
    return Instance(pod, (
        Proc(f"{pod}-prep", "feeder", ("--transport", transport, *where, "--batch", str(batch), "--image", str(image)),
             cpu_max=prep_cpu),
        Proc(pod, "fed_service", ("--transport", transport, *gpu_where, *model_arg, "--batch", str(batch), *sim),
             gpu=True)), weight=weight)


def loader(pod: str, *, model: str, batch: int, workers: int, image: int, rate: float, fetch: int,
           weight: int | None = None) -> Instance:
    """``torch_service.py`` (a stock DataLoader, payloads fetched per item) in pod ``pod``."""
    return Instance(pod, (Proc(pod, "torch_service", (
        "--model", model, "--batch", str(batch), "--workers", str(workers), "--image", str(image),
        "--rate", str(rate), "--fetch", f"127.0.0.1:{fetch}"), gpu=True),), weight=weight)


def hog(procs: int, weight: int) -> Instance:
    """``burner.py``: a CPU-hungry pod with no GPU (``procs`` 0: one process per core)."""
    return Instance("lab-hog", (Proc("lab-hog", "burner", ("--procs", str(procs or os.cpu_count() or 1))),),
                    weight=weight)


# Pod weights are the kubelet's from each pod's CPU request (weight = 1 + (request_millicores *
# 1.024 - 2) * 9999 / 262142): a 4-CPU request ~157, 2 CPUs ~79, 100m 4, 15.5 CPUs ~606 (the hog at 590).
W_A, W_B = 157, 79
# the cause root cause must put first for an episode of a faulty class (its key, analysis/rca)
EXPECTED_CAUSE = {"staging-bound": "host_staging", "network-bound": "network"}

# ------------------------------------------------------------------------------------------------
# The GPU machine (one H100/H200, 16 cores, cgroup v2).  Written 2026-12-06, before the wait-for
# rules were fixed; never edited after a recording.
# ------------------------------------------------------------------------------------------------
A4 = loader("lab-a", model="resnext50_32x4d", batch=32, workers=6, image=320, rate=384, fetch=A_PORT, weight=W_A)

DEVICE: tuple[Scenario, ...] = (
    Scenario("sidecar_shm", "b's GPU container takes batches from a decode sidecar (0.5 CPU) over shared memory "
             "and a Unix socket",
             A4, fed("lab-b", "unix", model="mobilenet_v3_large", batch=16, image=640, prep_cpu=0.5, weight=W_B),
             ("staging-bound",), "b", knobs={"sidecar_cpu_max": 0.5, "transport": "unix+shm"},
             note="the GPU container waits on the sidecar's socket; the sidecar, throttled at 0.5 CPU decoding "
                  "640 px JPEGs, is the producer; it is b's pod (another container: not in the GPU container's "
                  "process set)"),
    Scenario("sidecar_tcp", "b's GPU container reads batches from a decode sidecar (0.4 CPU) over loopback TCP",
             A4, fed("lab-b", "tcp", model="regnet_y_1_6gf", batch=8, image=800, prep_cpu=0.4, weight=W_B),
             ("staging-bound",), "b", knobs={"sidecar_cpu_max": 0.4, "transport": "tcp"},
             note="the GPU container waits on a TCP socket with no loss on it: the sender is b's own CPU-starved "
                  "sidecar, not the network"),
    Scenario("spin_poll", "b's GPU worker thread spin-polls an empty queue; 2 requests/s over HTTP",
             A4, http("lab-b", B_HTTP, model="convnext_tiny", batch=4, poll="spin", rate=2, image=384, weight=W_B),
             HEALTHY, None,
             note="a thread of b's GPU process pegs a core doing nothing; nothing waits on it and b serves its 2/s: "
                  "healthy, never a page"),
    Scenario("upstream_loss", "b's handlers fetch 64 kB per request from an upstream losing 5 % of its packets, "
             "8 requests/s",
             A4, http("lab-b", B_HTTP, model="regnet_x_400mf", batch=8, upstream=B_PORT, fetch_bytes=65536, rate=8,
                      conns=4, image=320, weight=W_B, loss=0.05),
             ("network-bound",), "b", knobs={"upstream_loss": 0.05, "fetch_bytes": 65536},
             note="the GPU worker waits on the queue, the handlers that fill it on their upstream's lossy "
                  "connection"),
    Scenario("contention_weight", "a's pod at cpu.weight 4 beside a CPU burner pod at 590 (16 busy processes); "
             "no CPU limit anywhere",
             loader("lab-a", model="resnet152", batch=32, workers=6, image=320, rate=320, fetch=A_PORT, weight=4),
             loader("lab-b", model="mobilenet_v3_small", batch=4, workers=2, image=256, rate=12, fetch=B_PORT,
                    weight=W_B),
             ("staging-bound",), "a", hog=hog(0, 590), knobs={"a_cpu_weight": 4, "hog_cpu_weight": 590},
             note="the fault is on the heavier instance: a's GPU process and loader workers wait for CPUs the "
                  "burner holds; the burner pod uses no GPU and is not a; b (weight 79, light) is served"),
    Scenario("launch_bound", "b: a batch-1 loop of tiny kernels on GPU-resident tensors (48 blocks of "
             "Linear+LayerNorm+GELU, width 768)",
             A4, Instance("lab-b", (Proc("lab-b", "launchloop", ("--depth", "48", "--width", "768"), gpu=True),),
                          weight=W_B),
             HEALTHY, None,
             note="the GPU partly busy, the driving thread busy launching, no input pipeline: nothing to fix on "
                  "the host side, never a page"),
    Scenario("upstream_loss_heavy", "a's handlers fetch 64 kB per request from an upstream losing 4 %, 96 "
             "requests/s; b light and healthy",
             http("lab-a", A_HTTP, model="resnet50", batch=16, upstream=A_PORT, fetch_bytes=65536, rate=96, conns=12,
                  image=320, weight=W_A, loss=0.04),
             http("lab-b", B_HTTP, model="mobilenet_v3_small", batch=4, rate=4, image=256, weight=W_B),
             ("network-bound",), "a", knobs={"upstream_loss": 0.04, "fetch_bytes": 65536},
             note="the fault is on the heavier instance: its GPU worker waits for handlers stuck on a lossy "
                  "upstream"),
    Scenario("healthy_pool_bursty", "b: a decode thread pool (8) behind the HTTP intake, bursts of 32 requests "
             "every 2 s",
             A4, http("lab-b", B_HTTP, model="efficientnet_b3", batch=16, pool=8, burst=32, period=2.0, conns=8,
                      image=512, weight=W_B),
             HEALTHY, None,
             note="bursts queue for a moment and drain; between them b is idle: healthy, never a page"),
)

# ------------------------------------------------------------------------------------------------
# The CPU lab (2 cores, cgroup v1, the GPU simulated by the stand-in driver).  Written 2026-12-06,
# before the wait-for rules were fixed; never edited after a recording.
# ------------------------------------------------------------------------------------------------
A_CPU = http("lab-a", A_HTTP, batch=8, rate=20, conns=4, image=256, sim=_sim(6000, 2000), weight=W_A)
B_CPU_LIGHT = http("lab-b", B_HTTP, batch=4, rate=4, image=256, sim=_sim(2000, 1000), weight=W_B)

CPU: tuple[Scenario, ...] = (
    Scenario("sidecar_shm", "b's GPU container takes batches from a decode sidecar (0.25 CPU) over shared memory "
             "and a Unix socket",
             A_CPU, fed("lab-b", "unix", batch=8, image=512, prep_cpu=0.25, sim=_sim(3000, 400),
                        weight=W_B),
             ("staging-bound",), "b", knobs={"sidecar_cpu_max": 0.25, "transport": "unix+shm"},
             note="the GPU container waits on the sidecar's socket; the throttled sidecar is b's pod"),
    Scenario("sidecar_tcp", "b's GPU container reads batches from a decode sidecar (0.2 CPU) over loopback TCP",
             A_CPU, fed("lab-b", "tcp", batch=4, image=640, prep_cpu=0.2, sim=_sim(3000, 500),
                        weight=W_B),
             ("staging-bound",), "b", knobs={"sidecar_cpu_max": 0.2, "transport": "tcp"},
             note="a TCP wait with no loss: the sender is b's CPU-starved sidecar"),
    Scenario("spin_poll", "b's GPU worker thread spin-polls an empty queue; 2 requests/s over HTTP",
             A_CPU, http("lab-b", B_HTTP, batch=4, poll="spin", rate=2, image=256, sim=_sim(3000, 1000), weight=W_B),
             HEALTHY, None, note="a pegged thread nobody waits on: healthy, never a page"),
    Scenario("upstream_loss", "b's handlers fetch 64 kB per request from an upstream losing 5 %, 8 requests/s",
             A_CPU, http("lab-b", B_HTTP, batch=8, upstream=B_PORT, fetch_bytes=65536, rate=8, conns=4, image=256,
                         sim=_sim(3000, 1000), weight=W_B, loss=0.05),
             ("network-bound",), "b", knobs={"upstream_loss": 0.05, "fetch_bytes": 65536},
             note="the GPU worker waits on the queue, the handlers on their upstream's lossy connection"),
    Scenario("contention_weight", "a's pod at cpu.shares 81 (weight 4) beside a CPU burner pod at 15,444 (590), "
             "2 busy processes",
             http("lab-a", A_HTTP, batch=8, rate=20, conns=4, image=256, sim=_sim(6000, 2000), weight=4),
             B_CPU_LIGHT, ("staging-bound",), "a", hog=hog(0, 590), knobs={"a_cpu_weight": 4, "hog_cpu_weight": 590},
             note="the fault is on the heavier instance: a's threads wait for CPUs the burner holds"),
    Scenario("launch_bound", "b: a loop of 150 tiny launches (4 us of GPU, 10 us of host dispatch each) and a "
             "sync per step, nothing else",
             A_CPU, Instance("lab-b", (Proc("lab-b", "launchloop", ("--backend", "sim", "--busy-file", "{busy}",
                                                                    "--libcuda", "{libcuda}", "--launches", "150",
                                                                    "--kernel-us", "4", "--host-us", "10"),
                                            gpu=True),), weight=W_B),
             HEALTHY, None, note="the driving thread busy launching, the GPU partly busy: never a page"),
    Scenario("upstream_loss_heavy", "a's handlers fetch 64 kB per request from an upstream losing 4 %, 20 "
             "requests/s; b light",
             http("lab-a", A_HTTP, batch=8, upstream=A_PORT, fetch_bytes=65536, rate=20, conns=6, image=256,
                  sim=_sim(6000, 2000), weight=W_A, loss=0.04),
             B_CPU_LIGHT, ("network-bound",), "a", knobs={"upstream_loss": 0.04, "fetch_bytes": 65536},
             note="the fault is on the heavier instance: its worker waits for handlers stuck on a lossy upstream"),
    Scenario("healthy_pool_bursty", "b: a decode pool (4) behind the HTTP intake, bursts of 12 every 2 s",
             A_CPU, http("lab-b", B_HTTP, batch=8, pool=4, burst=12, period=2.0, conns=4, image=384,
                         sim=_sim(3000, 800), weight=W_B),
             HEALTHY, None, note="bursts queue and drain; between them b is idle"),
)

FOURTH = tuple(s.name for s in DEVICE)
SETS = {"fourth": FOURTH, "fourth-a": FOURTH[:4], "fourth-b": FOURTH[4:]}
DEVICE_BY_NAME = {s.name: s for s in DEVICE}
CPU_BY_NAME = {s.name: s for s in CPU}


class Runner:
    """Starts one scenario's pods and processes, applies its faults once all are ready, stops it."""

    def __init__(self, log_dir: Path, run_dir: Path, *, env: dict[str, str] | None = None,
                 pods_log_dir: Path | str = PODS_LOG_DIR, libcuda: str = "", python: str = sys.executable) -> None:
        self.log_dir, self.run_dir = log_dir, run_dir
        self.env = env or dict(os.environ)
        self.pods_log_dir, self.libcuda, self.python = pods_log_dir, libcuda, python
        self.pods: dict[tuple[str, str], Pod] = {}       # (scenario, instance) -> its pod, made ahead
        self.procs: list[subprocess.Popen[str]] = []
        self.gpu: dict[str, subprocess.Popen[str]] = {}  # instance -> its GPU process
        self.live: list[tuple[str, Pod]] = []
        self.names: dict[int, str] = {}                  # pid -> the process's name, for messages
        run_dir.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)

    def busy_file(self, who: str) -> Path:
        return self.run_dir / f"{who}.busy"

    def prepare(self, scenarios: list[Scenario]) -> None:
        """Every scenario's pods made now (cgroups, limits, weights, log directories), as a kubelet
        has them before their containers start, so the agent's pod list knows them from the start."""
        for sc in scenarios:
            for who, inst in self._instances(sc):
                pod = Pod(inst.pod, namespace=NAMESPACE, logs=self.pods_log_dir)
                for p in inst.procs:
                    if p.container:
                        pod.container(p.container, cpu_max=p.cpu_max)
                if inst.weight is not None:
                    pod.set_weight(inst.weight)
                self.pods[(sc.name, who)] = pod

    @staticmethod
    def _instances(sc: Scenario) -> list[tuple[str, Instance]]:
        return [("a", sc.a), ("b", sc.b)] + ([("hog", sc.hog)] if sc.hog is not None else [])

    def _spawn(self, who: str, inst: Instance, p: Proc, pod: Pod | None) -> subprocess.Popen[str]:
        fill = {"busy": str(self.busy_file(who)), "run": str(self.run_dir), "libcuda": self.libcuda}
        args = [a.format_map(fill) for a in p.args]
        name = p.container or f"{inst.pod}-load"
        dirs = [str(d) for d in pod.containers[p.container].dirs] if pod is not None and p.container else []

        def enter() -> None:          # the container runtime's part: the process in its cgroups before exec
            me = str(os.getpid())
            for d in dirs:
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(me)

        log = open(self.log_dir / f"{name}.log", "a")  # noqa: SIM115 - the child's stderr for its life
        proc = subprocess.Popen([self.python, "-m", f"examples.hostlab.{p.module}", "--name", name, *args], cwd=REPO,
                                env=self.env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                                preexec_fn=enter if dirs else None)  # noqa: PLW1509 - one write before exec
        log.close()
        self.procs.append(proc)
        self.names[proc.pid] = name
        if p.gpu:
            self.gpu[who] = proc
        return proc

    def _ready(self, procs: list[subprocess.Popen[str]], timeout: float) -> None:
        waiting = {p.stdout.fileno(): p for p in procs if p.stdout is not None}
        end = time.monotonic() + timeout
        while waiting:
            left = end - time.monotonic()
            r, _, _ = select.select(list(waiting), [], [], max(0.0, left))
            if not r:
                raise SystemExit(f"fourth set: {len(waiting)} process(es) not ready in {timeout:.0f} s "
                                 f"(see {self.log_dir})")
            for fd in r:
                p = waiting.pop(fd)
                assert p.stdout is not None
                line = p.stdout.readline().strip()
                if line != "ready":
                    raise SystemExit(f"fourth set: {self.names.get(p.pid, p.pid)} did not start ({line!r}; "
                                     f"see {self.log_dir})")

    def start(self, sc: Scenario, timeout: float = 240.0) -> None:
        """Servers and sidecars of a and b together, then their clients, then the faults: the drops
        on an upstream's port and the hog pod."""
        if not any(k[0] == sc.name for k in self.pods):
            self.prepare([sc])
        for who, _ in self._instances(sc):
            self.live.append((who, self.pods[(sc.name, who)]))
        self.gpu.clear()
        servers = [self._spawn(who, inst, p, self.pods[(sc.name, who)])
                   for who, inst in (("a", sc.a), ("b", sc.b)) for p in inst.procs if p.container]
        self._ready(servers, timeout)
        clients = [self._spawn(who, inst, p, None) for who, inst in (("a", sc.a), ("b", sc.b))
                   for p in inst.procs if not p.container]
        self._ready(clients, timeout)
        for inst in (sc.a, sc.b):
            if inst.loss is not None and inst.loss_port:
                drop(inst.loss_port, inst.loss)
        if sc.hog is not None:
            self._ready([self._spawn("hog", sc.hog, p, self.pods[(sc.name, "hog")]) for p in sc.hog.procs], timeout)

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(10)
            if p.stdout is not None:
                p.stdout.close()
        self.procs.clear()
        self.gpu.clear()
        with contextlib.suppress(subprocess.CalledProcessError, FileNotFoundError):
            nft("flush", "chain", "inet", NFT_TABLE, "in")
        for f in glob.glob("/dev/shm/lab-feed-*"):          # the sidecar's ring, killed before it could unlink it
            with contextlib.suppress(OSError):
                os.unlink(f)
        for _, pod in self.live:
            pod.remove()
        self.live.clear()

    def close(self) -> None:
        """Stop whatever runs and remove every pod made ahead."""
        self.stop()
        for pod in self.pods.values():
            pod.remove(wait=2.0)
        self.pods.clear()
        remove_parents()

    def lines(self, sc: Scenario, t0: float, t1: float) -> list[dict[str, Any]]:
        """The timeline's lines of ``sc`` held from ``t0`` to ``t1``: a and b, what was expected."""
        out = []
        for who, inst in (("a", sc.a), ("b", sc.b)):
            pod = self.pods.get((sc.name, who))
            faulty = sc.faulty == who
            out.append({"scenario": sc.name, "title": sc.title, "start": round(t0, 3), "end": round(t1, 3),
                        "instance": who, "role": "faulty" if faulty else "healthy", "workload": inst.pod,
                        "accept": inst.accept, "gpu": 0, "set": "fourth", "written": WRITTEN,
                        "pod": {"namespace": NAMESPACE, "name": inst.pod, "uid": pod.uid if pod else ""},
                        "service": {"weight": inst.weight, "loss": inst.loss, "loss_port": inst.loss_port,
                                    "procs": [asdict(p) for p in inst.procs]},
                        "hog": asdict(sc.hog) if sc.hog is not None else None,
                        "knobs": sc.knobs if faulty else {}, "faulty": faulty,
                        "expected_state": list(sc.expect), "note": sc.note,
                        # root cause's truth, by the expected state (written with the set, before any run)
                        "expected_cause": EXPECTED_CAUSE.get(sc.expect[0]) if faulty else None})
        return out


def timeline_text(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(ln) + "\n" for ln in lines)
