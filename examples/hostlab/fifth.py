"""The fifth set: held-out classes for the wait-for verdict, on the GPU machine and in the CPU lab.

    # the GPU machine (h200.py, run by h200_record.sh): all eight, or the two halves (one device call each)
    python -m examples.hostlab.h200 --node h200-lab-N --out OUT --hold 45 --only fifth      # or fifth-a / fifth-b
    # the CPU lab (lab.py, the GPU simulated through the stand-in driver library)
    sudo .venv/bin/python -m examples.hostlab.lab --node cpu-lab-N --set fifth --hold 45

Written after the fourth set was recorded and scored, before any recording of these classes, with
serving code the project had not seen: a video decoder container writing frames into a named pipe
(``framedecoder.py``/``video_service.py``), a preprocessing container answering requests over a Unix
socket (``prep_rpc.py``/``rpc_service.py``), a ``multiprocessing.Pool`` scorer (``pool_service.py``),
an ambassador sidecar in front of an upstream (``ambassador.py``), an asyncio server whose GPU worker
polls with ``sched_yield`` (``yield_service.py``) and users with think times (``thinkclient.py``),
written as ordinary serving code is, nothing tuned for triscope.  Every class differs from every
fourth-set class in its mechanism:

* ``frame_fifo`` (a): one decoder thread in its own container, no limit, cannot keep up with 1080p
  frames; the GPU container waits on the pipe;
* ``prep_rpc_throttled`` (b): a sidecar that is fast alone but under a 0.1-CPU limit, asked for every
  batch (nothing prepared ahead);
* ``pool_pod_limit`` (a): eight pool workers and the GPU process under one pod-wide CFS limit;
* ``mesh_reply_loss`` (b): the upstream's replies (not its requests) lose packets on the ambassador
  sidecar's connection, a hop behind the model container's own loss-free socket;
* ``hog_spare_cores``: a CPU hog in another pod, cores to spare: healthy, the hog never named;
* ``yield_spin_saturated``: a worker polling with ``sched_yield`` while a best-effort pod keeps every
  core busy: healthy, never a page;
* ``gpu_bound_pool``: vit_l_16 at batch 64 with a pool that keeps ahead: the GPU is the limit;
* ``trickle_think``: a few users with think times: the service waits for requests.

Every service runs in a Kubernetes-style pod (``pods.py``), as in the fourth set, whose ``Proc``,
``Scenario`` and ``Runner`` this module extends (``Instance`` adds a pod-wide limit, a QoS class and
loss on one direction); the timeline's lines say ``"set": "fifth"`` and are scored by
``examples/inference/acceptance.py`` as the fourth set's are.

**The expectations in ``DEVICE`` and ``CPU`` below were written on 2026-12-06, before any recording of
these classes, and are never edited after a recording is made with them.**
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from . import fourth
from .fourth import A_HTTP, B_HTTP, EXPECTED_CAUSE, W_A, W_B, Proc, Scenario, _sim, http, loader
from .lab import A_PORT, HEALTHY, NFT_TABLE, U_PORT, nft
from .pods import Pod, weight_to_shares

WRITTEN = "2026-12-06"
AMB_PORT = 47851              # the ambassador sidecar's loopback port (the upstream: the lab's blob server, U_PORT)
BESTEFFORT_WEIGHT = 1         # the kubelet's cpu.shares 2 for best-effort pods and their QoS slice, as cpu.weight

__all__ = ["CPU", "DEVICE", "EXPECTED_CAUSE", "FIFTH", "SETS", "WRITTEN", "Instance", "Runner", "Scenario"]


@dataclass(frozen=True)
class Instance(fourth.Instance):
    """A fourth-set instance with what the fifth set adds: a CFS limit on the whole pod (every
    container's processes together, as a pod-level limit is), the pod's QoS class (``besteffort``:
    its slice and the pod at the kubelet's minimum weight), and loss on one direction only: a share
    of the segments **from** ``reply_port`` (an upstream's replies) dropped, its requests left alone."""

    pod_cpu_max: float | None = None
    qos: str = "burstable"
    reply_loss: float | None = None
    reply_port: int = 0


def video(pod: str, *, batch: int, width: int, height: int, model: str = "", fps: float = 0.0,
          sim: tuple[str, ...] = (), weight: int | None = None) -> Instance:
    """A GPU container reading raw frames off a named pipe (an emptyDir both mount) that a decoder
    container of the same pod writes (``framedecoder.py``)."""
    fifo = "{run}/" + pod + "-frames.fifo"
    model_arg = ("--model", model) if model else ()
    return Instance(pod, (
        Proc(f"{pod}-decode", "framedecoder", ("--fifo", fifo, "--width", str(width), "--height", str(height),
                                              "--fps", str(fps))),
        Proc(pod, "video_service", ("--fifo", fifo, *model_arg, "--batch", str(batch), *sim), gpu=True)),
        weight=weight)


def rpc(pod: str, *, batch: int, image: int, prep_cpu: float, model: str = "", rate: float = 0.0,
        sim: tuple[str, ...] = (), weight: int | None = None) -> Instance:
    """A model container asking a preprocessing container of its pod (``prep_rpc.py``, under a CFS
    limit of ``prep_cpu``) for every batch over a Unix socket."""
    sock = "{run}/" + pod + "-prep.sock"
    model_arg = ("--model", model) if model else ()
    return Instance(pod, (
        Proc(f"{pod}-prep", "prep_rpc", ("--socket", sock), cpu_max=prep_cpu),
        Proc(pod, "rpc_service", ("--socket", sock, *model_arg, "--batch", str(batch), "--image", str(image),
                                  "--rate", str(rate), *sim), gpu=True)), weight=weight)


def pool(pod: str, *, batch: int, workers: int, image: int, model: str = "", rate: float = 0.0,
         pod_cpu: float | None = None, sim: tuple[str, ...] = (), weight: int | None = None) -> Instance:
    """``pool_service.py`` (a ``multiprocessing.Pool`` decoding, the main process on the GPU), the
    whole pod under ``pod_cpu`` CPUs when given."""
    model_arg = ("--model", model) if model else ()
    return Instance(pod, (Proc(pod, "pool_service", (*model_arg, "--batch", str(batch), "--workers", str(workers),
                                                      "--image", str(image), "--rate", str(rate), *sim),
                               gpu=True),), weight=weight, pod_cpu_max=pod_cpu)


def mesh(pod: str, port: int, *, batch: int, fetch_bytes: int, rate: float, conns: int, image: int,
         reply_loss: float | None, model: str = "", sim: tuple[str, ...] = (), weight: int | None = None) -> Instance:
    """``service_http.py`` whose upstream fetches go through an ambassador container of its pod
    (``ambassador.py``) to the lab's blob server; ``reply_loss`` of the blob server's segments to the
    ambassador dropped; its load client a host process."""
    model_arg = ("--model", model) if model else ()
    return Instance(pod, (
        Proc(f"{pod}-mesh", "ambassador", ("--listen", str(AMB_PORT), "--upstream", f"127.0.0.1:{U_PORT}")),
        Proc(pod, "service_http", ("--port", str(port), *model_arg, "--batch", str(batch), "--upstream",
                                   f"127.0.0.1:{AMB_PORT}", "--fetch-bytes", str(fetch_bytes), *sim), gpu=True),
        Proc("", "loadclient", ("--port", str(port), "--rate", str(rate), "--conns", str(conns), "--image",
                                str(image)))),
        weight=weight, reply_loss=reply_loss, reply_port=U_PORT if reply_loss else 0)


def yielding(pod: str, port: int, *, batch: int, rate: float, conns: int, image: int, model: str = "",
             sim: tuple[str, ...] = (), weight: int | None = None) -> Instance:
    """``yield_service.py`` (asyncio intake, a GPU worker polling its ring with ``sched_yield``) and
    its load client."""
    model_arg = ("--model", model) if model else ()
    return Instance(pod, (
        Proc(pod, "yield_service", ("--port", str(port), *model_arg, "--batch", str(batch), *sim), gpu=True),
        Proc("", "loadclient", ("--port", str(port), "--rate", str(rate), "--conns", str(conns), "--image",
                                str(image)))), weight=weight)


def think(pod: str, port: int, *, batch: int, users: int, think_s: float, session: float, image: int,
          model: str = "", sim: tuple[str, ...] = (), weight: int | None = None) -> Instance:
    """``service_http.py`` (blocking worker) and ``thinkclient.py``: users with think times."""
    model_arg = ("--model", model) if model else ()
    return Instance(pod, (
        Proc(pod, "service_http", ("--port", str(port), *model_arg, "--batch", str(batch), *sim), gpu=True),
        Proc("", "thinkclient", ("--port", str(port), "--users", str(users), "--think", str(think_s),
                                 "--session", str(session), "--image", str(image)))), weight=weight)


def hog(procs: int, *, weight: int, qos: str = "burstable") -> Instance:
    """``burner.py`` in a pod with no GPU: ``procs`` busy processes (0: one per core of the machine
    this runs on)."""
    n = procs or os.cpu_count() or 1
    return Instance("lab-hog", (Proc("lab-hog", "burner", ("--procs", str(n))),), weight=weight, qos=qos)


# ------------------------------------------------------------------------------------------------
# The GPU machine (one H100/H200, 16 cores, cgroup v2).  Written 2026-12-06, before any recording
# of these classes; never edited after a recording.
# ------------------------------------------------------------------------------------------------
# the healthy heavy instance beside a faulty b, and the light one beside a faulty a: other models and
# loaders than the fourth set's (a DataLoader at 288 img/s with room to spare, 5 workers for 352 px)
A5 = loader("lab-a", model="regnet_y_3_2gf", batch=24, workers=5, image=352, rate=288, fetch=A_PORT, weight=W_A)
B5 = http("lab-b", B_HTTP, model="regnet_x_1_6gf", batch=4, rate=4, conns=2, image=320, weight=W_B)

DEVICE: tuple[Scenario, ...] = (
    Scenario("frame_fifo", "a's GPU container reads raw frames from a named pipe that one decoder thread in a "
             "container of its pod fills from 1080p MJPEG, as fast as it can",
             video("lab-a", model="convnext_base", batch=16, width=1920, height=1080, weight=W_A), B5,
             ("staging-bound",), "a", knobs={"transport": "fifo", "decoder_threads": 1, "frame": "1920x1080"},
             note="the fault is on the heavier instance: its GPU container waits on the pipe; the producer is its "
                  "decoder container (same pod, no CPU limit), one thread pegged at a core decoding 1080p"),
    Scenario("prep_rpc_throttled", "b's model container asks a preprocessing container (0.1 CPU) of its pod for "
             "every batch over a Unix socket",
             A5, rpc("lab-b", model="regnet_x_800mf", batch=16, image=256, prep_cpu=0.1, weight=W_B),
             ("staging-bound",), "b", knobs={"sidecar_cpu_max": 0.1, "transport": "unix request/response"},
             note="the sidecar decodes a batch of 16 256 px JPEGs in ~23 ms alone (on the CPU machine); at 0.1 CPU "
                  "it is throttled in most periods, and the model container waits on each reply"),
    Scenario("pool_pod_limit", "a: a multiprocessing.Pool of 8 decoders and the GPU process under one pod-wide "
             "limit of 1.5 CPUs, 512 px JPEGs, as fast as it goes",
             pool("lab-a", model="wide_resnet50_2", batch=32, workers=8, image=512, pod_cpu=1.5, weight=W_A), B5,
             ("staging-bound",), "a", knobs={"pod_cpu_max": 1.5, "workers": 8},
             note="the fault is on the heavier instance: the pod (not a container) is throttled; its GPU process "
                  "waits on the pool's result pipe"),
    Scenario("mesh_reply_loss", "b's handlers fetch 256 kB per request through an ambassador container; 8 % of the "
             "upstream's replies to the ambassador are dropped, 10 requests/s",
             A5, mesh("lab-b", B_HTTP, model="efficientnet_v2_s", batch=8, fetch_bytes=262144, rate=10, conns=4,
                      image=320, reply_loss=0.08, weight=W_B),
             ("network-bound",), "b", knobs={"reply_loss": 0.08, "fetch_bytes": 262144, "hop": "ambassador"},
             note="the model container's own socket (to the ambassador, loopback) loses nothing; the ambassador's "
                  "connection to the upstream loses the upstream's replies, so the upstream retransmits"),
    Scenario("hog_spare_cores", "a CPU hog pod (6 busy processes, 1-CPU request) beside a and b on 16 cores; both "
             "healthy",
             A5, B5, HEALTHY, None, hog=hog(6, weight=39), knobs={"hog_procs": 6},
             note="cores to spare: nobody waits for a CPU; the hog has no GPU and is never named or paged"),
    Scenario("yield_spin_saturated", "b's GPU worker polls an empty ring with sched_yield, 3 requests/s, while a "
             "best-effort pod keeps every core busy",
             A5, yielding("lab-b", B_HTTP, model="mnasnet0_5", batch=4, rate=3, conns=2, image=384, weight=W_B),
             HEALTHY, None, hog=hog(0, weight=BESTEFFORT_WEIGHT, qos="besteffort"),
             note="every core busy, but the hog is best-effort (weight 1): a and b get the CPU they ask for; b's "
                  "poller runs whenever it can and nobody waits on it: healthy, never a page"),
    Scenario("gpu_bound_pool", "a: vit_l_16 at batch 64, a pool of 10 decoders keeping ahead of it (256 px); the "
             "GPU is the limit",
             pool("lab-a", model="vit_l_16", batch=64, workers=10, image=256, weight=W_A), B5,
             HEALTHY, None, knobs={"model": "vit_l_16", "batch": 64},
             note="the driving thread waits on the GPU, the pool on its room for more: any non-I/O state, never a "
                  "page"),
    Scenario("trickle_think", "b: 3 users with 2.5 s think times, a new connection every ~4 requests",
             A5, think("lab-b", B_HTTP, model="vgg11_bn", batch=4, users=3, think_s=2.5, session=4, image=448,
                       weight=W_B),
             HEALTHY, None, note="b waits for requests that do not come: healthy, never a page"),
)

# ------------------------------------------------------------------------------------------------
# The CPU lab (2 cores, cgroup v1, the GPU simulated by the stand-in driver).  Written 2026-12-06,
# before any recording of these classes; never edited after a recording.
# ------------------------------------------------------------------------------------------------
A5_CPU = http("lab-a", A_HTTP, batch=6, rate=16, conns=3, image=288, sim=_sim(5000, 1800), weight=W_A)
B5_CPU = http("lab-b", B_HTTP, batch=4, rate=3, conns=1, image=256, sim=_sim(2500, 800), weight=W_B)

CPU: tuple[Scenario, ...] = (
    Scenario("frame_fifo", "a's GPU container reads raw frames from a named pipe that one decoder thread fills "
             "from 720p MJPEG",
             video("lab-a", batch=8, width=1280, height=720, sim=_sim(4000, 600), weight=W_A), B5_CPU,
             ("staging-bound",), "a", knobs={"transport": "fifo", "decoder_threads": 1, "frame": "1280x720"},
             note="the fault is on the heavier instance: its GPU container waits on the pipe its decoder fills"),
    Scenario("prep_rpc_throttled", "b's model container asks a preprocessing container (0.05 CPU) for every batch "
             "over a Unix socket",
             A5_CPU, rpc("lab-b", batch=8, image=256, prep_cpu=0.05, sim=_sim(2000, 400), weight=W_B),
             ("staging-bound",), "b", knobs={"sidecar_cpu_max": 0.05, "transport": "unix request/response"},
             note="the throttled sidecar answers every batch late; the model container waits on it"),
    Scenario("pool_pod_limit", "a: a pool of 3 decoders and the GPU process under a pod-wide 0.4 CPU, 384 px",
             pool("lab-a", batch=8, workers=3, image=384, pod_cpu=0.4, sim=_sim(4000, 1500), weight=W_A), B5_CPU,
             ("staging-bound",), "a", knobs={"pod_cpu_max": 0.4, "workers": 3},
             note="the fault is on the heavier instance: its pod is throttled, its GPU process waits on the pool"),
    Scenario("mesh_reply_loss", "b's handlers fetch 256 kB per request through an ambassador; 8 % of the upstream's "
             "replies dropped, 6 requests/s",
             A5_CPU, mesh("lab-b", B_HTTP, batch=4, fetch_bytes=262144, rate=6, conns=3, image=256, reply_loss=0.08,
                          sim=_sim(2500, 800), weight=W_B),
             ("network-bound",), "b", knobs={"reply_loss": 0.08, "fetch_bytes": 262144, "hop": "ambassador"},
             note="the model container's own socket loses nothing; the ambassador's upstream connection does"),
    Scenario("hog_spare_cores", "a CPU hog pod (1 busy process, 1-CPU request) beside a and b on 2 cores",
             A5_CPU, B5_CPU, HEALTHY, None, hog=hog(1, weight=39), knobs={"hog_procs": 1},
             note="a core to spare for a and b's light work: healthy, the hog never named"),
    Scenario("yield_spin_saturated", "b's GPU worker polls an empty ring with sched_yield, 2 requests/s, while a "
             "best-effort pod keeps both cores busy",
             A5_CPU, yielding("lab-b", B_HTTP, batch=4, rate=2, conns=1, image=256, sim=_sim(2500, 800), weight=W_B),
             HEALTHY, None, hog=hog(0, weight=BESTEFFORT_WEIGHT, qos="besteffort"),
             note="the hog is best-effort: a and b get the CPU they ask for; nobody waits on the poller"),
    Scenario("gpu_bound_pool", "a: 200 ms of simulated GPU per batch of 16, one pool decoder keeping ahead",
             pool("lab-a", batch=16, workers=1, image=160, sim=_sim(152000, 3000), weight=W_A), B5_CPU,
             HEALTHY, None, knobs={"sim_batch_ms": 200},
             note="the GPU is the limit: any non-I/O state, never a page"),
    Scenario("trickle_think", "b: 2 users with 2 s think times, a new connection every ~3 requests",
             A5_CPU, think("lab-b", B_HTTP, batch=4, users=2, think_s=2.0, session=3, image=384, sim=_sim(2500, 800),
                           weight=W_B),
             HEALTHY, None, note="b waits for requests that do not come"),
)

FIFTH = tuple(s.name for s in DEVICE)
SETS = {"fifth": FIFTH,
        # the halves, one device call each: two faults and two healthy classes in each, a fault on a in each
        "fifth-a": ("frame_fifo", "prep_rpc_throttled", "hog_spare_cores", "gpu_bound_pool"),
        "fifth-b": ("pool_pod_limit", "mesh_reply_loss", "yield_spin_saturated", "trickle_think")}
DEVICE_BY_NAME = {s.name: s for s in DEVICE}
CPU_BY_NAME = {s.name: s for s in CPU}

# ------------------------------------------------------------------------------------------------
# What a half costs on the device: h200_record.sh in one device call, h200.py skipping a class that
# would not fit its deadline.  Per class: its start (the fourth set took ~63 s a class at a 45 s
# hold, ~18 s to start and stop; more where a big model warms up or the pod starts under its limit),
# the hold, the stop and the 2 s pause.
# ------------------------------------------------------------------------------------------------
DEVICE_CALL_S = 585.0         # one device command, as the lead runs a half
SETUP_S = 20.0                # h200_record.sh before the lab: wheels, BCC, nftables
RECORD_MARGIN_S = 45.0        # h200_record.sh (BUDGET): kept for the replay, the table and copying back
DEADLINE_MARGIN_S = 15.0      # h200_record.sh: the lab's --deadline is its time less this
CLASS_MARGIN_S = 40.0         # h200.py: a class starts only with its hold and this much left
AGENT_START_S = 15.0          # the store's upgrade and the agent's first answer
EXPORT_S = 25.0               # the trace's export at the end
STOP_S = 5.0                  # killed, pods removed, the 2 s pause
START_S = {"frame_fifo": 22.0, "prep_rpc_throttled": 22.0, "pool_pod_limit": 40.0, "mesh_reply_loss": 22.0,
           "hog_spare_cores": 22.0, "yield_spin_saturated": 25.0, "gpu_bound_pool": 35.0, "trickle_think": 25.0}


def device_plan(names: list[str] | tuple[str, ...], hold: float = 45.0) -> tuple[list[str], float]:
    """The classes of ``names`` h200.py would run in one device call at ``hold`` (a class starts
    only with its hold and ``CLASS_MARGIN_S`` left before the deadline) and the seconds the call would
    take with them, by the estimates above."""
    lab_s = DEVICE_CALL_S - SETUP_S - RECORD_MARGIN_S
    deadline = lab_s - DEADLINE_MARGIN_S
    t, ran = AGENT_START_S, []
    for n in names:
        if deadline - t < hold + CLASS_MARGIN_S:
            continue
        t += START_S[n] + hold + STOP_S
        ran.append(n)
    return ran, SETUP_S + t + EXPORT_S + RECORD_MARGIN_S


class Runner(fourth.Runner):
    """``fourth.Runner`` with the fifth set's additions: pod-wide limits and QoS classes made with the
    pods, loss on an upstream's replies only, the named pipes and sockets of a class removed with it,
    and timeline lines that say which set they are.  A fourth-set scenario runs as ``fourth.Runner``
    runs it."""

    @staticmethod
    def _fifth(sc: Scenario) -> bool:
        return any(isinstance(inst, Instance) for _, inst in fourth.Runner._instances(sc))

    def prepare(self, scenarios: list[Scenario]) -> None:
        fourth.Runner.prepare(self, [sc for sc in scenarios if not self._fifth(sc)])
        for sc in (s for s in scenarios if self._fifth(s)):
            for who, inst in self._instances(sc):
                qos = getattr(inst, "qos", "burstable")
                pod = Pod(inst.pod, namespace=fourth.NAMESPACE, qos=qos, logs=self.pods_log_dir)
                for p in inst.procs:
                    if p.container:
                        pod.container(p.container, cpu_max=p.cpu_max)
                if inst.weight is not None:
                    pod.set_weight(inst.weight)
                if getattr(inst, "pod_cpu_max", None) is not None:
                    pod.set_cpu_max(inst.pod_cpu_max)             # type: ignore[attr-defined]
                if qos == "besteffort":
                    _qos_slice_weight(pod, BESTEFFORT_WEIGHT)
                self.pods[(sc.name, who)] = pod

    def start(self, sc: Scenario, timeout: float = 240.0) -> None:
        """As ``fourth.Runner.start``, then the drops on an upstream's replies (with the other faults,
        once every process is ready)."""
        super().start(sc, timeout)
        for inst in (sc.a, sc.b):
            share, port = getattr(inst, "reply_loss", None), getattr(inst, "reply_port", 0)
            if share is not None and port:
                drop_replies(port, share)

    def stop(self) -> None:
        super().stop()                  # flushes the input chain, the reply drops with the rest
        for pattern in ("*.fifo", "*.sock"):
            for f in self.run_dir.glob(pattern):
                f.unlink(missing_ok=True)

    def lines(self, sc: Scenario, t0: float, t1: float) -> list[dict[str, Any]]:
        out = super().lines(sc, t0, t1)
        if not self._fifth(sc):
            return out
        for ln, inst in zip(out, (sc.a, sc.b), strict=True):
            ln["set"], ln["written"] = "fifth", WRITTEN
            ln["service"].update({k: getattr(inst, k, None) for k in ("pod_cpu_max", "qos", "reply_loss",
                                                                       "reply_port")})
        return out


def drop_replies(port: int, share: float) -> None:
    """Drop ``share`` of the TCP segments **from** ``port`` (an upstream's replies) on the input hook,
    as ``lab.drop`` does for both directions: the upstream's segment has left, so it retransmits it
    after a timeout as it would for one lost on the wire; the requests to it pass.  The rule counts
    what it dropped (``nft list table inet triscope_lab``)."""
    pct = int(round(share * 100))
    nft("add", "rule", "inet", NFT_TABLE, "in", "tcp", "sport", str(port), "numgen", "random", "mod", "100", "<",
        str(pct), "counter", "drop")


def _qos_slice_weight(pod: Pod, weight: int) -> None:
    """The pod's QoS slice (``kubepods-besteffort.slice``) at ``weight``, as the kubelet keeps it."""
    for d in pod.dirs:
        parent = d.parent
        if pod.kind == "v2":
            (parent / "cpu.weight").write_text(str(weight))
        elif (parent / "cpu.shares").exists():
            (parent / "cpu.shares").write_text(str(weight_to_shares(weight)))

