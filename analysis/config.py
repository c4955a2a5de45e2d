"""Thresholds of the coordination-mismatch detector: one dataclass, documented defaults.

Override them from a YAML file (``load_thresholds(path)``, keys are the field names, optionally
under a top-level ``mismatch:`` key) and/or from the environment: ``TRISCOPE_MISMATCH_<FIELD>``
(upper case), e.g. ``TRISCOPE_MISMATCH_IO_SATURATED_LINK=0.7``.  Environment wins over the file.
The file is read with ``triscope.core.yamlsafe`` (size, depth and alias bounds) and validated by a
pydantic model built from the dataclass (``thresholds_file_model()``, built on first use: the agent running on the defaults never loads pydantic): every value a finite number >= 0
(numbers written as text, ``"0.7"``, are read too), fields ending in ``_s`` durations in the
grammar of ``triscope.core.durations`` (``10``, ``10s``, ``500ms``).  Unknown keys and bad values are
errors, one line: ``FILE:LINE: field: what is wrong`` (``environment VAR: what is wrong``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from triscope.core import yamlsafe
from triscope.core.configerror import ConfigFileError

ENV_PREFIX = "TRISCOPE_MISMATCH_"
ENV_FILE = "TRISCOPE_MISMATCH_FILE"


class ConfigError(ConfigFileError):
    """A bad threshold file or environment value: ``FILE:LINE: field: what is wrong``
    (``environment TRISCOPE_MISMATCH_X: what is wrong``)."""


@dataclass(frozen=True, slots=True)
class MismatchThresholds:
    """Every number the classifier uses.  Ratios are 0..1, rates per second.

    Defaults were chosen against what DESIGN.md reports for the H200 (PCIe Gen5 x16): pinned
    copies run at ~50-60 GB/s (~0.85-0.95 of the link), pageable copies at 5-23 GB/s, a bf16
    matmul keeps SM activity at ~0.90-0.96, re-pinning host buffers maps ~55-1,100 regions/s.
    """

    window_s: float = 10.0
    """Sliding window the state is computed over (seconds)."""
    compute_busy: float = 0.70
    """Accelerator busy (GPM SM activity / AICore) at or above this: ``compute-bound`` (``balanced``
    when the link is also at ``io_saturated_link``)."""
    starved_busy: float = 0.30
    """Accelerator busy below this counts as starved (the I/O states need a starved accelerator
    and evidence; without evidence it is ``demand-limited`` or ``idle``)."""
    idle_busy: float = 0.05
    """Accelerator busy below this, with a quiet link and no I/O evidence: ``idle``."""
    idle_link: float = 0.03
    """Link utilisation below this counts as a quiet link; at or above it the link is moving data
    (what the staging evidence needs: a host that is busy while the link is quiet is not feeding
    the accelerator)."""
    io_saturated_link: float = 0.75
    """Link utilisation at or above this (of the effective ceiling) is a link near its ceiling:
    ``io-saturated`` with a starved accelerator, ``balanced`` with a busy one."""
    link_efficiency: float = 0.85
    """Share of the negotiated gen x width capacity a real link can carry (TLP/DLLP overhead).  The
    effective ceiling is max(negotiated x efficiency, highest rate observed on the link)."""
    fallback_link_bytes_per_second: float = 0.0
    """Ceiling used when the link's generation and width are unknown (0: only the highest observed
    rate, floored at ``min_ceiling_bytes_per_second``)."""
    min_ceiling_bytes_per_second: float = 1e9
    """Never treat a link as saturated below this rate (1 GB/s) when the ceiling is only observed."""
    staging_link_floor: float = 0.06
    """Recordings without per-workload evidence: a starved accelerator whose link carries at least
    this share of its ceiling counts as staging evidence (a pageable copy, staged through the
    driver's pinned buffers, moves data at a fraction of the link while the SM idles).  The
    slowest pageable copy measured on the H200 host ran at 8.6-9.9 % of the link (4.8-5.5 GB/s,
    the recorded trace; 23 GB/s when the copy loop does nothing else), a lightly loaded serving
    GPU (2.5 GB/s on Gen5 x16) at 4.2-4.7 %: 0.06 (3.2 GB/s on Gen5 x16) lies between them.  With
    per-workload series the floor alone is not evidence: it counts when a workload on the
    accelerator also keeps ``host_copy_cores`` busy (the host doing the copies' work)."""
    host_copy_cores: float = 1.0
    """With per-workload series: a starved accelerator whose link carries between
    ``staging_link_floor`` and ``io_saturated_link`` of its ceiling while one of its workloads keeps
    at least this many cores busy (``triscope_workload_cpu_seconds_total`` per second) is fed by
    host copies.  A pageable copy is the CPU's work: the driver copies every byte into its pinned
    staging buffers, on whichever thread issued the copy, so no single thread need be pegged.  On
    the H200 host, a service copying 512 MiB per batch from pageable memory kept 1.24-1.43 cores
    busy with the link at 12-14 % (four threads taking turns, none above 0.45 of a core); the same
    service healthy at 20 requests/s used 0.5-0.7 cores and 0.1 % of the link.  0 switches it off."""
    cpu_busy: float = 0.50
    """Host CPU busy (all CPUs) at or above this is host staging evidence (recordings without
    per-workload evidence; with the link moving data).  Node-wide, so weak on a many-core host:
    one copying thread is 1/16 of the H200 host."""
    cpu_pressure: float = 0.10
    """PSI ``cpu some`` / ``memory some`` avg10 at or above this is host staging evidence
    (recordings without per-workload evidence; with the link moving data)."""
    feeder_busy: float = 0.90
    """A workload's busiest thread (``triscope_workload_feeder_busy_ratio``, share of one core over
    the tick) at or above this is pegged: a single-threaded feeder (copy, decode, tokenise, launch)
    cannot go faster, so a starved accelerator waits on it.  A thread that feeds on demand sits
    far below (0.05-0.3); a pegged one reads 0.95-1.0, and 0.9 leaves room for the tick's scheduling
    noise.  Over the workload's whole process set: a DataLoader worker pegged decoding images counts.
    It counts with a quiet link too (a host that cannot produce data leaves the link quiet); a thread
    spin-waiting on a GPU that is idle most of the time cannot fill itself with the spin, so a pegged
    thread there is its own serial work the GPU waits on."""
    cpu_wait: float = 0.20
    """A workload's run-queue wait over (run + wait) of its threads
    (``triscope_workload_cpu_wait_ratio``) at or above this: its threads are runnable but get no
    CPU a fifth of the time, so the host, not the workload's demand, sets its pace.  An
    uncontended host keeps this near 0 (a runnable thread waits microseconds).  It counts with a
    quiet link too."""
    workload_cpu_pressure: float = 0.10
    """A workload's cgroup ``cpu.pressure`` ``some avg10`` (``triscope_workload_cpu_pressure_ratio``)
    at or above this: its tasks stalled waiting for a CPU (or on their CPU limit's throttling) 10 %
    of the last 10 s; the same bar as the node's ``cpu_pressure``."""
    cpu_throttled: float = 0.25
    """A workload whose cgroup has a CPU limit (``cpu.max`` / ``cpu.cfs_quota_us``) and was throttled
    in at least this share of its CFS enforcement periods over the window
    (``triscope_workload_cpu_throttled_periods_total`` over ``_periods_total``) runs at its limit: the
    host, not demand, sets its pace.  25 % is the bar of kubernetes-mixin's ``CPUThrottlingHigh``
    alert, the one most clusters already run; a pod kept at its limit reads far above it (746 of 751
    periods, 99 %, for eight loader workers under a 1-CPU limit on the H200 host), one that bursts
    now and then far below."""
    numa_remote: float = 0.75
    """A workload whose staging work runs or lives at least this share off its accelerator's NUMA
    node feeds it across the socket link: its host pages (``triscope_workload_memory_local_ratio``),
    or its CPU time off the accelerator's local CPUs (``triscope_workload_cpu_local_ratio``) where
    its affinity holds it there (at least this share of the CPUs it may use are remote,
    ``triscope_workload_cpus_allowed_local_ratio``).  It counts only while the accelerator is
    starved (below ``starved_busy``): placement alone is no fault.  Three quarters is midway
    between the even split a service spread over two sockets reads (0.5: one thread pinned to each
    socket read 0.48-0.54 per read on the two-socket fixture, pages interleaved over two nodes
    read 0.5) and a feeder wholly on the far socket (1.0; the kubelet Topology Manager's
    ``single-numa-node`` placement reads 0): the majority bar before this (0.5) paged the even split
    itself.  A workload allowed on the node's CPUs is read by its pages only: an unpinned
    two-thread service on that fixture read 0.0 or 1.0 remote for whole minutes, wherever the
    scheduler kept it.  Not fitted on a recording (none made on a machine with two NUMA nodes)."""
    numa_min_cores: float = 0.2
    """... and uses at least this many cores (a fifth): an idle process's placement is no feeder's."""
    pin_churn_rate: float = 10.0
    """DMA map operations per second at or above this: pin churn (the node's flag: the accelerators'
    own PCI devices when known; an accelerator's staging evidence: its own device when known).  Maps happen when host memory is pinned, not per copy, so a healthy
    steady state (cached pinned buffers) maps ~0/s; the H200 trace's pin-churn phase (a fresh
    64 MiB buffer registered per request) maps ~55/s, pinning page by page ~1,100/s."""
    workload_retransmit_ratio: float = 0.01
    """A workload whose own TCP sockets retransmit at least this share of the segments they send
    (``triscope_workload_tcp_retransmits_total`` over ``_segments_sent_total``) loses packets on its
    own connections: ``network-bound`` for its starved accelerator.  A healthy data-centre path
    retransmits well under 0.1 % of segments; at 1 % loss TCP's throughput is already bounded far
    below the link (Mathis et al.: rate ~ MSS / (RTT x sqrt(loss))) and every lost request segment
    costs a retransmission timeout (>= 200 ms on Linux) of tail latency."""
    workload_retransmit_rate: float = 0.3
    """... and at least this many of its own segments retransmitted per second (3 in a 10 s window):
    one retransmit among a dozen segments of a quiet connection is no loss rate."""
    retransmit_rate: float = 5.0
    """Node-wide TCP retransmits per second at or above this: network trouble — read **only** for
    accelerators whose workloads have no per-workload TCP series (recordings and agents from before
    them, NPUs without processes); such a verdict names no workload (whose packets they were is not
    known).  With per-workload series, other processes' retransmits never make an accelerator
    ``network-bound`` (they are a node-level cause in root cause)."""
    host_wide_margin: float = 1.5
    """A staging verdict names a workload only when its busiest thread works this much harder than the
    next workload's with host evidence; closer than that, the host is short for all of them and the
    verdict names none (an action on one of them would be a guess).  A workload held at its own CPU
    limit is named before ones that only wait."""
    copy_strength_cap: float = 1.5
    """The host-copy evidence's strength (cores over ``host_copy_cores``) counts at most this much:
    past the threshold more cores say more CPU work, not a stronger case for the copies (a CPU-heavy
    service must not outweigh retransmits by its size)."""
    link_feeder_floor: float = 0.5
    """An ``io-saturated`` verdict on a shared accelerator names a workload only when its busiest
    thread is busy at least this share of the window (issuing copies and waiting on them keeps a
    thread busy: measured on an H200, 0.55-0.69 for a service uploading 2 GiB batches, 0.72-0.80 for
    a copy hog)."""
    state_dwell_s: float = 2.0
    """Per-tick tracker: a new state is reported once the window has shown it this long in a row
    (0: at once).  Transition ticks (a GPM sample half idle, half copying) do not make states."""
    min_coverage: float = 0.5
    """A window needs accelerator data for at least this share of its ticks to be classified."""
    # --- wait-for (docs/waitfor.md).  None of these was fitted on a recording: they are set from what
    # each means, before the recordings they are scored on (h200-lab-7 and later) were made.
    waitfor_min_seconds: float = 4.0
    """Wait-for evidence decides a workload's verdict only when its driving threads were traced for
    at least this many thread-seconds in the window (two fifths of a 10 s window for one thread);
    less (a thread just found, a process that just started) and the older rules decide."""
    waitfor_cause_share: float = 0.5
    """An I/O cause — host staging (a thread on the chain working on a CPU, waiting for one, held at
    its CPU limit, copying from pageable memory, reading disk) or a connection that loses packets —
    makes the verdict when it holds at least this share of the driving threads' **working** time
    (their time less what they spent waiting for requests, pacing or idle) and more than the
    accelerator itself does: the accelerator waits on it more than on everything else together."""
    waitfor_work_floor: float = 0.5
    """Below this share of their time with work (the rest waiting for requests, sleeping to keep a
    pace, idle) the driving threads keep up with their demand: they have slack, so nothing on their
    chain holds the accelerator back, whatever their busy moments waited on (a paced consumer that
    waits on its loader workers between its sleeps is healthy; one that cannot keep up never
    sleeps).  Only the request path's loss is read then (``waitfor_service_min_seconds``).  Was 0.1
    when h200-lab-7 was recorded (held out: 14/18, two classes paged the healthy heavy instance,
    a paced DataLoader service with 36 % of its time working); 0.5 after it, so h200-lab-7 is
    fitted for this value and no held-out recording scores it yet."""
    waitfor_seen_floor: float = 0.25
    """The chain decides a workload's state only when at least this share of its driving threads'
    time was followed to a known end; the rest waited on producers the chain could not follow (not
    traced yet, too deep), which are evidence of nothing and left out of every share.  Set with
    h200-lab-15 (a pod-wide CPU limit starving a pool of decoder processes: 55-62 % of the driving
    thread's time on those unfollowed producers, read as demand before, so its fault read idle), so
    h200-lab-15 is fitted for it."""
    waitfor_requests_min: float = 0.2
    """A workload whose threads wait for requests (blocked on the server's side of a connection or on
    a listener) at least this many thread-seconds per second, and longer than its threads wait on its
    driving thread, is waiting for demand: its driving thread's own CPU time then is polling (a
    worker spinning on an empty queue), not work the accelerator waits on."""
    waitfor_service_min_seconds: float = 1.0
    """A workload whose driving threads mostly wait for work (demand at least half their time) is
    judged by its **request path** too — the time its intake and handler threads spend once a request
    is in (``triscope_workload_service_chain_seconds_total``) — when that path holds at least this many
    thread-seconds in the window: a connection losing packets that holds ``waitfor_cause_share`` of it
    makes the accelerator ``network-bound`` (its requests arrive late: an upstream dependency losing
    packets).  Only loss counts there: CPU work on the request path is what serving is, so the share
    is of the time a request waits (the path less its handlers' own CPU time).  Until 2026-12-06
    the share was of the whole path; held out on h200-lab-8/9/10 that read a heavy service whose
    handlers waited 37-49 % of the path on a connection retransmitting 1.4-2.2 % (the rest mostly
    their own CPU work) as idle in 4 of 6 windows: those recordings are fitted for this rule."""
    waitfor_service_loss_floor: float = 0.25
    """And the lossy connections hold at least this share of the whole request path (a quarter of
    a request's time): a CPU-heavy service whose few waits happen to be on a lossy connection is not
    held back by it.  Set with the rule above (h200-lab-8/10 showed 37-51 %), so fitted there."""
    waitfor_polling_runnable: float = 0.9
    """Driving threads running or waiting for a CPU at least this share of their time (they never
    block) while their workload waits for requests and nobody waits on them (less than
    ``waitfor_requests_min``) are polling: their wait for a CPU is their poll loop's, not a
    starvation, however contended the CPUs are.  Before 2026-12-06 only "runs at least
    as long as it waits for a CPU" said so, which a spinning worker on a node with every CPU busy
    fails (it runs a third of its time there: the real-kernel test with a busy loop per core read it
    staging-bound).  Set from what it means; no recording has a spinning worker on a saturated node."""
    waitfor_engaged: float = 0.3
    """An accelerator engaged at least this share of the time (the higher of SM activity and NVML's
    kernel-time utilisation) is being driven: its driving thread's own CPU time is launching work
    (launch overhead), not host staging.  The same bar as ``starved_busy``."""

    def with_overrides(self, values: Mapping[str, Any], source: str = "overrides") -> MismatchThresholds:
        """These thresholds with ``values`` (field name: value) applied; ``ConfigError`` naming
        ``source`` for an unknown name or a bad value."""
        from pydantic import ValidationError

        from triscope.core.configfile import describe

        try:
            model = thresholds_file_model().model_validate(dict(values))
        except ValidationError as e:
            _, where, what = describe(e.errors(include_url=False)[0])
            raise ConfigError(source, None, f"{where}: {what}" if where else what, field=where) from None
        return replace(self, **{k: getattr(model, k) for k in model.model_fields_set})


# ---------------------------------------------------------------------------------------------- the file
# pydantic is loaded only when a file or a value is read: the agent's detector runs on the defaults
def _threshold(value: Any) -> float:
    """A threshold: a finite number >= 0 (a number written as text, ``"0.7"``, is read)."""
    from triscope.core.configfile import show

    x = value
    if isinstance(x, str):
        try:
            x = float(x.strip())
        except ValueError:
            raise ValueError(f"must be a number, not {show(value)}") from None
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise ValueError(f"must be a number, not {show(value)}")
    try:
        x = float(x)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"must be a finite number >= 0, not {show(value)}")
    return x


@cache
def thresholds_file_model() -> Any:
    """The thresholds file (or its ``mismatch:`` section) as a pydantic model: one field per
    threshold, so a new threshold is readable at once; any subset of them may be given."""
    from typing import Annotated

    from pydantic import BeforeValidator, create_model

    from triscope.core.configfile import ConfigModel
    from triscope.core.durations import Duration

    class _ThresholdsBase(ConfigModel):
        unknown_key_noun = "mismatch threshold"

    threshold = Annotated[float, BeforeValidator(_threshold)]
    fields_: dict[str, Any] = {f.name: (Duration if f.name.endswith("_s") else threshold, f.default)
                               for f in fields(MismatchThresholds)}
    return create_model("ThresholdsFile", __base__=_ThresholdsBase, **fields_)


def thresholds_from_env(base: MismatchThresholds | None = None,
                        environ: Mapping[str, str] | None = None) -> MismatchThresholds:
    env = os.environ if environ is None else environ
    th = base or MismatchThresholds()
    known = {f.name for f in fields(th)}
    for k, v in env.items():
        if k.startswith(ENV_PREFIX) and k != ENV_FILE:
            name = k[len(ENV_PREFIX):].lower()
            if name not in known:
                raise ConfigError(f"environment {k}", None, f"unknown mismatch threshold {name!r}")
            try:
                th = th.with_overrides({name: v}, f"environment {k}")
            except ConfigError as e:   # the variable names the field: say only what is wrong
                raise ConfigError(e.file, None, e.reason.removeprefix(f"{name}: ")) from None
    return th


def load_thresholds(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> MismatchThresholds:
    """Defaults, then the YAML file (if given), then ``TRISCOPE_MISMATCH_*`` environment variables."""
    th = MismatchThresholds()
    if path is not None:
        try:
            doc = yamlsafe.load(path)
        except yamlsafe.YAMLFileError as e:
            raise ConfigError(e.file, e.line, e.reason) from None
        at: tuple[str, ...] = ("mismatch",) if isinstance(doc.root, dict) and "mismatch" in doc.root else ()
        from triscope.core.configfile import validate as validate_config

        model = validate_config(thresholds_file_model(), doc, at=at, error=ConfigError)
        th = replace(th, **{k: getattr(model, k) for k in model.model_fields_set})
    return thresholds_from_env(th, environ)


def default_thresholds() -> MismatchThresholds:
    """What the detector uses when no thresholds are passed: the defaults, then the YAML file named
    by ``$TRISCOPE_MISMATCH_FILE`` (if set), then ``TRISCOPE_MISMATCH_*`` variables."""
    return load_thresholds(os.environ.get(ENV_FILE) or None)
