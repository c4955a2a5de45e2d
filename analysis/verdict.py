"""The coordination-mismatch verdict: each accelerator's state from its window's features, and the
node's roll-up.  Pure (no store, no clock); ``triscope.analysis.mismatch`` re-exports every name.

States (docs/workloads.md section 2):

* ``compute-bound``: the accelerator is busy (``compute_busy``); ``balanced`` when its link is
  also near its ceiling (``io_saturated_link``), whatever the SM activity.
* A starved accelerator (busy < ``starved_busy``) with its link near its ceiling is
  ``io-saturated``.  Otherwise an I/O state needs **evidence about its workloads** (each one its
  whole process set): ``staging-bound`` when a workload's host side is saturated — its cgroup
  throttled at its CPU limit, under CPU pressure, a thread pegged, threads waiting for a CPU
  (``host_findings``; no moving link asked for: a host that cannot produce data leaves the link
  quiet) — or it feeds host copies / churns pins with the link moving; ``network-bound`` when a
  workload's own sockets lose packets (``network_finding``), never on other processes'
  retransmits.  A partly busy accelerator (between the two busy bars) with such evidence reads
  the same.  Recordings without per-workload series fall back to the link's utilisation, node CPU
  busy and PSI; without per-workload TCP series to the node's retransmit rate, naming no workload.
* Without evidence a starved accelerator is ``idle`` (nothing runs: quiet link, busy below
  ``idle_busy``) or ``demand-limited`` (its workload is not asking for more: its whole host side
  quiet); a partly busy one ``balanced`` when the link moves data, else ``demand-limited``.

Score: share of the accelerator's time lost to I/O over the window: ``1 - busy`` for the I/O
states, ``(1 - busy) x min(1, link / io_saturated_link)`` for ``balanced`` / ``compute-bound``, 0
for ``demand-limited`` and ``idle``.  The node's roll-up is its worst accelerator: I/O states
first, then the highest score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.config import MismatchThresholds
from triscope.analysis.features import (
    NO_WORKLOAD,
    OTHER_WORKLOAD,
    AcceleratorFeatures,
    WindowFeatures,
    WorkloadEvidence,
    WorkloadKey,
    accelerator_labels,
    workload_labels,
    workload_text,
)
from triscope.analysis.waitverdict import ChainFinding, chain_finding, chain_reasons, no_chain_reason
from triscope.core.vocabulary import IO_STATES, WORST_FIRST

# roll-up order among equal scores: I/O states first, then the busiest
_TIE_ORDER = {s: i for i, s in enumerate(WORST_FIRST)}


@dataclass(slots=True)
class AcceleratorVerdict:
    """One accelerator's state over one window, with its dominant workload."""

    accelerator: str                       # "gpu=0", "chip=0,npu=1"
    state: str
    score: float
    pin_churn: bool                        # DMA maps on its own device (the node's when not told apart)
    workload: dict[str, str]               # namespace, pod, container, workload ("" when unknown)
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        """Its accelerator labels: ``{"gpu": "0"}``, ``{"npu": "1", "chip": "0"}``."""
        return accelerator_labels(self.accelerator)


@dataclass(slots=True)
class NodeVerdict:
    """The node's roll-up over one window, and every accelerator's verdict (``accelerators``)."""

    state: str
    score: float
    pin_churn: bool
    evidence: dict[str, Any] = field(default_factory=dict)
    accelerators: list[AcceleratorVerdict] = field(default_factory=list)


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _device_dma(acc: AcceleratorFeatures, f: WindowFeatures) -> float:
    """DMA maps/s on the accelerator's own device; the node's when they are not told apart."""
    x = acc.dma_map_rate if acc.dma_map_rate is not None else f.dma_map_rate
    return x or 0.0


def _ratio(x: float, t: float) -> float:
    return x / t if t > 0 else 0.0


def _starved(acc: AcceleratorFeatures, th: MismatchThresholds) -> bool:
    """The accelerator's typical tick below ``starved_busy``: it waits for work."""
    b = acc.busy_typical if acc.busy_typical is not None else (acc.busy or 0.0)
    return b < th.starved_busy


def host_findings(w: WorkloadEvidence, th: MismatchThresholds, *, starved: bool) -> list[tuple[float, str]]:
    """Each sign that one workload's host side is saturated, whatever its accelerator's link does:
    (strength against its threshold, reason).  Its cgroup throttled at its CPU limit, its cgroup
    under CPU pressure, its busiest thread pegged (a loader worker, a feeder, a launch loop: a
    single thread cannot go faster), its threads waiting for a CPU; and, where its accelerator is
    ``starved``, its work placed off the accelerator's NUMA node (``numa_finding``).  Empty: the
    host side is quiet."""
    out: list[tuple[float, str]] = []
    who = workload_text(w.key)
    t = w.throttled
    if t is not None and th.cpu_throttled > 0 and t >= th.cpu_throttled:
        out.append((_ratio(t, th.cpu_throttled), f"{who} throttled in {_pct(t)} of its CPU periods "
                                                  f"(>= {_pct(th.cpu_throttled)}): held at its CPU limit"))
    if w.feeder is not None and th.feeder_busy > 0 and w.feeder >= th.feeder_busy:
        out.append((_ratio(w.feeder, th.feeder_busy), f"feeder pegged: the busiest thread of {who} at "
                                                       f"{_pct(w.feeder)} of a core (>= {_pct(th.feeder_busy)})"))
    if w.cpu_wait is not None and th.cpu_wait > 0 and w.cpu_wait >= th.cpu_wait:
        out.append((_ratio(w.cpu_wait, th.cpu_wait), f"{who} waits for a CPU {_pct(w.cpu_wait)} of its runnable "
                                                      f"time (>= {_pct(th.cpu_wait)})"))
    if w.cpu_pressure is not None and th.workload_cpu_pressure > 0 and w.cpu_pressure >= th.workload_cpu_pressure:
        out.append((_ratio(w.cpu_pressure, th.workload_cpu_pressure),
                    f"CPU pressure of {who}'s cgroup {_pct(w.cpu_pressure)} (>= {_pct(th.workload_cpu_pressure)})"))
    numa = numa_finding(w, th, starved=starved)
    if numa is not None:
        out.append(numa)
    return out


def numa_finding(w: WorkloadEvidence, th: MismatchThresholds, *, starved: bool) -> tuple[float, str] | None:
    """A working workload (``numa_min_cores``) whose staging work runs or lives mostly off its
    accelerator's NUMA node while the accelerator is ``starved``: every copy it stages crosses the
    socket link, and the accelerator waits.  (strength, reason), or None.

    Remote means at least ``numa_remote`` of its host pages off the node, or of its CPU time off
    the node's CPUs **where its affinity holds it there** (at least ``numa_remote`` of the CPUs
    it may use are remote; unknown affinity: the share alone).  A workload allowed on the node's
    CPUs runs wherever the scheduler puts it this window (an unpinned service's reading swings
    between 0 and 1 from one window to the next), so its CPU side is no finding; its pages are.
    A service spread over both sockets (half its work remote) reads below the bar, and an
    accelerator that is busy or partly busy is not waiting on where its feeder runs: neither is
    paged."""
    if not starved or th.numa_remote <= 0 or w.cores is None or w.cores < th.numa_min_cores:
        return None
    parts: list[str] = []
    worst = 0.0
    held = w.allowed_local is None or w.allowed_local <= 1.0 - th.numa_remote
    if w.cpu_local is not None and 1.0 - w.cpu_local >= th.numa_remote and held:
        worst = max(worst, 1.0 - w.cpu_local)
        parts.append(f"runs {_pct(1.0 - w.cpu_local)} of its CPU time")
    if w.mem_local is not None and 1.0 - w.mem_local >= th.numa_remote:
        worst = max(worst, 1.0 - w.mem_local)
        parts.append(f"keeps {_pct(1.0 - w.mem_local)} of its host pages")
    if not parts:
        return None
    why = ""
    if w.allowed_local is not None and w.allowed_local < 0.05:
        why = "; its CPU affinity allows none of that node's CPUs: it is pinned there"
    elif w.allowed_local is not None and w.allowed_local <= 1.0 - th.numa_remote:
        why = f"; its CPU affinity allows only {_pct(w.allowed_local)} of its CPUs on that node"
    return (_ratio(worst, th.numa_remote), f"{workload_text(w.key)} {' and '.join(parts)} off its accelerator's "
                                            f"NUMA node (>= {_pct(th.numa_remote)}) while it is starved: its "
                                            f"copies cross the socket link{why}")


def network_finding(w: WorkloadEvidence, th: MismatchThresholds) -> tuple[float, str] | None:
    """One workload's own connections losing packets: (strength, reason), or None.  Its own sockets'
    retransmits over the segments they sent, and enough of them to be a rate."""
    if th.workload_retransmit_ratio <= 0:
        return None
    found: list[tuple[float, str]] = []
    loss, rtx = w.loss, w.retransmits
    if loss is not None and rtx is not None and loss >= th.workload_retransmit_ratio \
            and rtx >= th.workload_retransmit_rate:
        found.append((_ratio(loss, th.workload_retransmit_ratio),
                      f"{workload_text(w.key)} retransmits {_pct(loss)} of the segments its own sockets send "
                      f"({rtx:.1f}/s; >= {_pct(th.workload_retransmit_ratio)} and {th.workload_retransmit_rate:g}/s)"))
    # the way in (a service fetching its inputs): the peer retransmits, the workload sees the gaps
    loss_in, ooo = w.loss_in, w.ooo_in
    if loss_in is not None and ooo is not None and loss_in >= th.workload_retransmit_ratio \
            and ooo >= th.workload_retransmit_rate:
        found.append((_ratio(loss_in, th.workload_retransmit_ratio),
                      f"{workload_text(w.key)} receives {_pct(loss_in)} of its data segments out of order, after "
                      f"a loss ({ooo:.1f}/s; >= {_pct(th.workload_retransmit_ratio)} and "
                      f"{th.workload_retransmit_rate:g}/s)"))
    return max(found) if found else None


def _workload_evidence(acc: AcceleratorFeatures) -> list[WorkloadEvidence]:
    """Each workload's evidence; features built by hand with only the highest values (no
    per-workload list) read as one workload, the feeder's."""
    if acc.per_workload:
        return acc.per_workload
    if acc.feeder_busy is None and acc.cpu_wait is None and acc.cpu_pressure is None:
        return []
    return [WorkloadEvidence(acc.feeder_of or acc.cpu_wait_of or acc.cpu_pressure_of or NO_WORKLOAD,
                             acc.feeder_busy, acc.cpu_wait, acc.cpu_pressure)]


def _staging(acc: AcceleratorFeatures, f: WindowFeatures, th: MismatchThresholds, u: float | None
             ) -> tuple[bool, float, list[str]]:
    """Is there evidence that the host limits this starved accelerator?  (staging, strength of the
    host evidence against its thresholds, reasons).

    With per-workload evidence a saturated host side decides alone (``host_findings``): a host that
    cannot produce data leaves the link quiet, so no moving link is asked for.  Copies fed by the
    host (a workload keeping ``host_copy_cores`` busy while the link carries a pageable copy's share
    of its ceiling) and pin churn on the accelerator's own device count with the link moving.
    Without per-workload evidence (older recordings, NPUs without processes): the link's own load,
    the node's CPU and PSI, with the link moving."""
    dma = _device_dma(acc, f)
    moving = u is None or u >= th.idle_link        # no link data (NPUs): the host evidence decides alone
    if acc.has_workload_evidence:
        starved = _starved(acc, th)
        found: list[tuple[float, str]] = [x for w in _workload_evidence(acc)
                                          for x in host_findings(w, th, starved=starved)]
        feeders = _copy_feeders(acc, th, u)
        cores, cores_of = feeders[0] if feeders else (0.0, None)
        if cores_of is not None:
            found.append((min(th.copy_strength_cap, _ratio(cores, th.host_copy_cores)),
                          f"copies fed by the host: link at {_pct(u or 0.0)} of its ceiling (>= "
                          f"{_pct(th.staging_link_floor)}) while {workload_text(cores_of)} keeps {cores:.2f} cores busy "
                          f"(>= {th.host_copy_cores:g})"))
        if dma >= th.pin_churn_rate and (moving or found):
            found.append((_ratio(dma, th.pin_churn_rate), f"pin churn: {dma:.0f} DMA maps/s"))
        strength = max((x[0] for x in found), default=0.0)
        reasons = [x[1] for x in found]
        if found and u is not None:
            reasons.insert(0, f"link at {_pct(u)} of its ceiling")
        return bool(found), strength, reasons
    # a recording without per-workload evidence: the link, the node's CPU and PSI
    old: list[str] = []
    cpu, psi = f.cpu_busy or 0.0, f.pressure or 0.0
    if cpu >= th.cpu_busy:
        old.append(f"host CPU busy {_pct(cpu)}")
    if psi >= th.cpu_pressure:
        old.append(f"host pressure {_pct(psi)}")
    if dma >= th.pin_churn_rate:
        old.append(f"pin churn: {dma:.0f} DMA maps/s")
    strength = max(_ratio(cpu, th.cpu_busy), _ratio(psi, th.cpu_pressure), _ratio(dma, th.pin_churn_rate))
    floor = u is not None and u >= th.staging_link_floor
    reasons = []
    if floor:
        reasons.append(f"link only at {_pct(u or 0.0)} of its ceiling (>= {_pct(th.staging_link_floor)}, "
                       f"< {_pct(th.io_saturated_link)}): copies staged by the host")
        return True, strength, reasons + old
    if old and moving:
        if u is not None:
            reasons.append(f"link moving data at {_pct(u)} of its ceiling")
        return True, strength, reasons + old
    if old:   # the node is busy but the link is quiet: it is not feeding this accelerator
        reasons += old + [f"but the link is quiet ({_pct(u or 0.0)} < {_pct(th.idle_link)})"]
    return False, strength, reasons


def _network(acc: AcceleratorFeatures, f: WindowFeatures, th: MismatchThresholds) -> tuple[float, list[str]]:
    """Network evidence for this accelerator: (strength, reasons).  Its workloads' own sockets when
    the agent attributes them (other processes' retransmits never count); the node's retransmit
    rate only where no workload on it has TCP series (older recordings)."""
    if acc.has_workload_tcp:
        found = [x for w in acc.per_workload if (x := network_finding(w, th)) is not None]
        return max((x[0] for x in found), default=0.0), [x[1] for x in found]
    rtx = f.retransmit_rate or 0.0
    strength = _ratio(rtx, th.retransmit_rate)
    if strength >= 1:
        return strength, [f"{rtx:.1f} TCP retransmits/s on the node >= {th.retransmit_rate:g} (whose is not known: "
                          "no per-workload TCP evidence)"]
    return strength, []


def _copy_feeders(acc: AcceleratorFeatures, th: MismatchThresholds, u: float | None
                  ) -> list[tuple[float, WorkloadKey]]:
    """The workloads that keep ``host_copy_cores`` busy while the link carries between
    ``staging_link_floor`` and ``io_saturated_link`` of its ceiling (busiest first); none when the
    link is outside that band or the threshold is off.  The agent's ``other`` (a sum of small
    workloads) is never one: no one process's copies are in it."""
    if u is None or th.host_copy_cores <= 0 or not th.staging_link_floor <= u < th.io_saturated_link:
        return []
    return sorted(((c, k) for k, c in acc.workload_cores.items()
                   if c >= th.host_copy_cores and k[3] != OTHER_WORKLOAD), reverse=True)


def engaged(acc: AcceleratorFeatures) -> float:
    """How much of the time the accelerator runs work: the higher of its typical SM activity and
    NVML's kernel-time utilisation (many small kernels keep a GPU running with few SMs active)."""
    b = acc.busy_typical if acc.busy_typical is not None else (acc.busy or 0.0)
    return max(b, acc.util_typical or 0.0)


def chain_findings(acc: AcceleratorFeatures, th: MismatchThresholds) -> list[tuple[ChainFinding, WorkloadEvidence]]:
    """Each workload's reading of its wait-for chain (those with enough evidence)."""
    e = engaged(acc)
    return [(f, w) for w in acc.per_workload if (f := chain_finding(w, e, th)) is not None]


def deciding_chain(acc: AcceleratorFeatures, th: MismatchThresholds
                   ) -> tuple[ChainFinding, WorkloadEvidence] | None:
    """The chain finding that makes the accelerator's I/O state: the strongest one with an I/O
    state; None when none has one."""
    io = [(f, w) for f, w in chain_findings(acc, th) if f.state]
    return max(io, key=lambda fw: (fw[0].strength, fw[0].state == "staging-bound")) if io else None


def _without(acc: AcceleratorFeatures, keys: set[WorkloadKey]) -> AcceleratorFeatures:
    """The accelerator's features without the workloads in ``keys`` (their chain decided them):
    the symptom rules then read only the workloads that were not traced."""
    from dataclasses import replace

    rest = [w for w in acc.per_workload if w.key not in keys]

    def top(attr: str) -> tuple[float | None, WorkloadKey | None]:
        got = [(v, w.key) for w in rest if (v := getattr(w, attr)) is not None]
        return max(got) if got else (None, None)

    fb, fb_of = top("feeder")
    cw, cw_of = top("cpu_wait")
    cp, cp_of = top("cpu_pressure")
    return replace(acc, per_workload=rest, feeder_busy=fb, feeder_of=fb_of, cpu_wait=cw, cpu_wait_of=cw_of,
                   cpu_pressure=cp, cpu_pressure_of=cp_of,
                   workload_cores={k: v for k, v in acc.workload_cores.items() if k not in keys})


def classify_accelerator(acc: AcceleratorFeatures, f: WindowFeatures,
                         th: MismatchThresholds) -> tuple[str, float, list[str]]:
    """State, score and the reasons for one accelerator.  ``acc.busy`` must not be None.

    The state is decided on the window's typical tick (medians), the score on its means.  Where its
    workloads' driving threads were traced (wait-for), their chains decide (``waitverdict``): a
    busy thread nobody waits on is never a cause; the older symptom rules read only the workloads
    that were not traced."""
    if acc.has_waitfor:
        return _classify_traced(acc, f, th)
    state, score, reasons = _classify_symptoms(acc, f, th)
    if state in IO_STATES and state != "io-saturated" and (acc.has_workload_evidence or acc.has_workload_tcp):
        reasons = [*reasons, no_chain_reason(True)]
    return state, score, reasons


def _classify_traced(acc: AcceleratorFeatures, f: WindowFeatures, th: MismatchThresholds) -> tuple[str, float, list[str]]:
    """An accelerator with wait-for evidence: compute and link states as ever; then the chains."""
    b = max(0.0, min(1.0, acc.busy_typical if acc.busy_typical is not None else (acc.busy or 0.0)))
    bm = max(0.0, min(1.0, acc.busy or 0.0))
    u = acc.link_util_typical
    saturated = u is not None and u >= th.io_saturated_link
    if b >= th.compute_busy or (saturated and b < th.starved_busy):
        return _classify_symptoms(acc, f, th)
    found = chain_findings(acc, th)
    io = [(c, w) for c, w in found if c.state]
    name = acc.name.replace("=", " ").upper() if acc.name.startswith("gpu=") else acc.name
    if io:
        c, w = max(io, key=lambda fw: (fw[0].strength, fw[0].state == "staging-bound"))
        return c.state, 1 - bm, chain_reasons(c, name, b, w, th)
    traced = {c.workload for c, _w in found}
    rest = _without(acc, traced)
    if rest.per_workload and (rest.has_workload_evidence or rest.has_workload_tcp):
        state, score, reasons = _classify_symptoms(rest, f, th)
        if state in IO_STATES:
            return state, score, [*reasons, "decided on host symptoms for the workloads whose waits were not traced"]
    # no chain found a cause: the non-I/O state of the accelerator, on its own evidence only (the
    # node's CPU, PSI and retransmits are other processes' as much as its workloads')
    quiet = replace_evidence(acc, traced)
    from dataclasses import replace

    state, score, reasons = _classify_symptoms(quiet, replace(f, cpu_busy=None, pressure=None, retransmit_rate=None), th)
    if state in ("staging-bound", "network-bound"):
        # only the link's share was left to read, and a moving link is no cause where the chains
        # saw the copies (they would have shown as pageable copies or waits on the accelerator)
        u = acc.link_util_typical
        moving = u is not None and u >= th.idle_link
        state = "balanced" if moving and b >= th.starved_busy else "idle" if b < th.idle_busy and not moving \
            else "demand-limited"
        score = 0.0
        reasons = [f"accelerator busy {b:.0%}, {'link ' + format(u, '.0%') + ' of its ceiling' if u is not None else 'no link data'}: "
                   "the traced workloads' chains hold no I/O cause"]
    if found:
        c, w = max(found, key=lambda fw: fw[1].wait.seconds if fw[1].wait else 0.0)
        reasons = [*reasons, *chain_reasons(c, name, b, w, th)]
    return state, score, reasons


def replace_evidence(acc: AcceleratorFeatures, traced: set[WorkloadKey]) -> AcceleratorFeatures:
    """The accelerator with its traced workloads' symptoms taken out and none left to read: what the
    non-I/O states are decided on (idle, demand-limited, balanced) once the chains found no cause."""
    from dataclasses import replace

    return replace(_without(acc, traced), per_workload=[], feeder_busy=None, cpu_wait=None, cpu_pressure=None,
                   workload_cores={})


def _classify_symptoms(acc: AcceleratorFeatures, f: WindowFeatures,
                       th: MismatchThresholds) -> tuple[str, float, list[str]]:
    """The older rules: host symptoms of the workloads (a busy thread, throttling, CPU wait, their
    sockets' loss) and the link."""
    b = max(0.0, min(1.0, acc.busy_typical if acc.busy_typical is not None else (acc.busy or 0.0)))
    u = acc.link_util_typical
    u0 = 0.0 if u is None else u
    bm = max(0.0, min(1.0, acc.busy or 0.0))  # means: the score
    um = acc.link_util or 0.0
    link_share = min(1.0, um / th.io_saturated_link) if th.io_saturated_link > 0 else 0.0
    saturated = u is not None and u0 >= th.io_saturated_link
    moving = u is not None and u0 >= th.idle_link
    if b >= th.compute_busy:
        if saturated:
            return "balanced", (1 - bm) * link_share, [
                f"accelerator busy {_pct(b)} >= {_pct(th.compute_busy)} and link at {_pct(u0)} of its ceiling "
                f">= {_pct(th.io_saturated_link)}: both near their ceilings"]
        return "compute-bound", (1 - bm) * link_share, [f"accelerator busy {_pct(b)} >= {_pct(th.compute_busy)}"]
    link = "no link data" if u is None else f"link {_pct(u0)} of its ceiling"
    starved = b < th.starved_busy
    if saturated and starved:
        return "io-saturated", 1 - bm, [f"accelerator starved: busy {_pct(b)} < {_pct(th.starved_busy)}",
                                        f"link at {_pct(u0)} of its ceiling >= {_pct(th.io_saturated_link)}"]
    # partly busy with per-workload evidence, or starved: what holds it back?  (A partly busy
    # accelerator without per-workload evidence keeps the older reading: the link or nothing.)
    if starved or acc.has_workload_evidence or acc.has_workload_tcp:
        waits = (f"accelerator starved: busy {_pct(b)} < {_pct(th.starved_busy)}" if starved else
                 f"accelerator waits: busy {_pct(b)} < {_pct(th.compute_busy)}")
        net_strength, net_why = _network(acc, f, th)
        staging, host_strength, why = _staging(acc, f, th, u)
        if not starved and not acc.has_workload_evidence:
            staging = False
        if net_strength >= 1 and net_why and (net_strength >= host_strength or not staging):
            return "network-bound", 1 - bm, [waits, *net_why]
        if staging:
            return "staging-bound", 1 - bm, [waits, *why]
    else:
        why = []
    if not starved:
        if saturated or moving:
            return "balanced", (1 - bm) * link_share, [f"accelerator busy {_pct(b)}, {link}"]
        return "demand-limited", 0.0, [f"accelerator busy {_pct(b)}, {link}: not asked for more"]
    if b < th.idle_busy and not moving:
        return "idle", 0.0, [f"accelerator busy {_pct(b)}, {link}: nothing to do", *why]
    quiet = ("its workloads' host side quiet (no pegged feeder, no CPU wait, no CPU pressure, no throttling), "
             "no loss on their own connections, no pin churn" if acc.has_workload_evidence else
             f"link below {_pct(th.staging_link_floor)} of its ceiling, no host pressure, no pin churn, no retransmits")
    return "demand-limited", 0.0, [f"accelerator busy {_pct(b)}, {link}: {quiet}", *why]


def accelerator_evidence(acc: AcceleratorFeatures) -> dict[str, Any]:
    """What one accelerator's verdict was decided on."""
    out: dict[str, Any] = {
        "busy": _r(acc.busy),
        "busy_median": _r(acc.busy_typical),
        "link_util": _r(acc.link_util),
        "link_util_median": _r(acc.link_util_typical),
        "link_bytes_per_second": _r(acc.link_bytes_per_second, 0),
        "link_ceiling_bytes_per_second": _r(acc.link_ceiling, 0),
        "device_dma_map_rate": _r(acc.dma_map_rate, 2),
    }
    if acc.has_workload_evidence or acc.workloads:
        out.update(feeder_busy=_r(acc.feeder_busy), cpu_wait=_r(acc.cpu_wait), cpu_pressure=_r(acc.cpu_pressure),
                   workloads=acc.workloads)
        if acc.workload_cores:
            out["workload_cores_max"] = _r(max(acc.workload_cores.values()), 3)
        throttled = [t for w in acc.per_workload if (t := w.throttled) is not None]
        if throttled:
            out["cpu_throttled_max"] = _r(max(throttled))
        losses = [x for w in acc.per_workload if (x := w.loss) is not None]
        if acc.has_workload_tcp:
            out["tcp_loss_max"] = _r(max(losses, default=0.0), 5)
            out["tcp_retransmits_per_second"] = _r(sum(w.retransmits or 0.0 for w in acc.per_workload), 3)
    return out


def waitfor_evidence(acc: AcceleratorFeatures, state: str, th: MismatchThresholds) -> dict[str, Any]:
    """The chains behind a verdict, for the pages and root cause: per traced workload, where its
    driving threads' time went (first hop), the chain's ends (largest first, with their group) and
    the groups' shares; ``deciding``: the workload whose chain made the I/O state."""
    out: dict[str, Any] = {"workloads": []}
    got = deciding_chain(acc, th) if state in ("staging-bound", "network-bound") else None
    for c, w in chain_findings(acc, th):
        ev = w.wait
        assert ev is not None
        out["workloads"].append({
            "workload": list(w.key), "text": workload_text(w.key), "state": c.state, "strength": round(c.strength, 4),
            "named": list(c.named), "work": round(c.work, 4), "seconds": round(ev.seconds, 2), "found_by": ev.found_by,
            "states": {k: round(v, 4) for k, v in sorted(ev.states.items(), key=lambda kv: -kv[1])},
            "groups": {k: round(v, 4) for k, v in c.groups.items()},
            "requests_wait": _r(ev.requests_wait, 3), "waited_on": _r(ev.waited_on, 3),
            "ends": [e.as_dict() for e in c.ends[:6]],
            "path": c.path, "service_seconds": round(ev.service_seconds, 2),
            "service": [e.as_dict() for e in c.service[:4]]})
        if got is not None and got[0].workload == c.workload:
            out["deciding"] = workload_text(w.key)
    return out


def _workload_of(acc: AcceleratorFeatures) -> WorkloadKey:
    return acc.workload or NO_WORKLOAD


def _key(labels: dict[str, str]) -> WorkloadKey:
    return (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""),
            labels.get("workload", ""))


def _named_workload(acc: AcceleratorFeatures, state: str, th: MismatchThresholds) -> tuple[WorkloadKey, str]:
    """The workload a verdict names, and why.

    ``staging-bound`` decided on per-workload host evidence names the workload the host is failing
    to feed: of the workloads with a host finding (``host_findings``), one held at its own CPU limit
    first, else the one whose busiest thread works hardest.  A neighbour that only waits — a light
    service whose few threads queue behind a heavy one's on a saturated host, or one sharing the
    heavy one's cgroup and so its pressure — is the victim, not the workload to act on; on a shared
    GPU the starved workload is often not the one with the larger SM share either.  Several
    workloads with findings and none clearly the hardest-working (``host_wide_margin``): the host
    is short for all of them, and the verdict names none.  ``network-bound`` on per-workload TCP
    evidence names the workload whose own sockets lose the most; on the node's retransmits alone,
    none.  Everything else names the dominant workload (SM share, processes)."""
    if state in ("staging-bound", "network-bound") and acc.has_waitfor:
        got = deciding_chain(acc, th)
        if got is not None and got[0].state == state:
            return got[0].named, f"wait-for chain: {got[0].state}"
        acc = _without(acc, {c.workload for c, _w in chain_findings(acc, th)})
    if state == "staging-bound" and acc.has_workload_evidence:
        named = _staging_workload(acc, th)
        if named is not None:
            return named
    if state == "network-bound":
        return _network_workload(acc, th)
    if state == "io-saturated" and acc.workloads >= 2:
        return _link_workload(acc, th)
    return _workload_of(acc), "SM share"


def _staging_workload(acc: AcceleratorFeatures, th: MismatchThresholds) -> tuple[WorkloadKey, str] | None:
    """``staging-bound`` on per-workload host evidence (see ``_named_workload``); None when no
    workload has a finding and none feeds the copies (the dominant workload is named then)."""
    cands: list[tuple[bool, float, WorkloadKey]] = []
    starved = _starved(acc, th)
    for w in _workload_evidence(acc):
        if host_findings(w, th, starved=starved):
            at_limit = w.throttled is not None and th.cpu_throttled > 0 and w.throttled >= th.cpu_throttled
            cands.append((at_limit, w.feeder if w.feeder is not None else 0.0, w.key))
    cands.sort(reverse=True)
    held = [c for c in cands if c[0]]
    if len(held) == 1:
        return held[0][2], "host evidence: held at its CPU limit"
    if held:
        cands = held
    if len(cands) >= 2 and cands[0][1] < th.host_wide_margin * cands[1][1]:
        # several workloads wait alike (a saturated host): naming one would be a guess
        return NO_WORKLOAD, "host-wide"
    feeders = _copy_feeders(acc, th, acc.link_util_typical)
    if cands:
        if feeders and feeders[0][1] != cands[0][2]:
            # one workload's threads starve while another's feed the copies: which to act on is a guess
            return NO_WORKLOAD, "host-wide"
        return cands[0][2], "host evidence"
    if len(feeders) >= 2 and feeders[0][0] < th.host_wide_margin * feeders[1][0]:
        return NO_WORKLOAD, "host-wide"
    if feeders:
        return feeders[0][1], "host evidence: its threads feed the copies"
    return None


def _network_workload(acc: AcceleratorFeatures, th: MismatchThresholds) -> tuple[WorkloadKey, str]:
    """``network-bound``: the workload whose own sockets lose the most; none on node-wide evidence."""
    if not acc.has_workload_tcp:
        return NO_WORKLOAD, "node-wide retransmits: whose is not known"
    lossy = [(w.retransmits or 0.0, w.key) for w in acc.per_workload if network_finding(w, th) is not None]
    if lossy:
        return max(lossy)[1], "its own connections lose packets"
    return NO_WORKLOAD, "network"


def _link_workload(acc: AcceleratorFeatures, th: MismatchThresholds) -> tuple[WorkloadKey, str]:
    """The workload an ``io-saturated`` verdict names on an accelerator several workloads share.

    The SM share says nothing about who fills the link: a process that only copies (a copy hog, a
    loader) has none, and naming the busiest computer would name its victim (measured on an H200:
    a copy hog beside two services, the verdict named the healthy one).  No per-process link bytes
    exist (NVML's PCIe counters are per device), so the evidence is the thread that issues the
    copies: the workload whose busiest thread is busy at least ``link_feeder_floor`` of the window
    and works clearly harder than every other workload's (``host_wide_margin``).  Otherwise, or
    where a workload on it has no thread evidence, the verdict names none: a shared link, and
    acting on one of them would be a guess."""
    known = [(w.feeder, w.key) for w in acc.per_workload if w.feeder is not None]
    if not known or len(known) < acc.workloads:
        return NO_WORKLOAD, "shared link (no thread evidence for every workload)"
    known.sort(key=lambda c: (c[0], c[1]), reverse=True)
    top = known[0]
    if top[0] >= th.link_feeder_floor and (len(known) == 1 or top[0] >= th.host_wide_margin * known[1][0]):
        return top[1], "shared link: its thread issues the copies"
    return NO_WORKLOAD, "shared link"


def classify_window(features: WindowFeatures, thresholds: MismatchThresholds | None = None) -> NodeVerdict | None:
    """Classify one window of one node: every accelerator with enough data, and the node's roll-up;
    ``None`` when no accelerator has enough data.

    Each accelerator is classified on its own link, device and workloads; the node takes the state
    of its worst accelerator (I/O states first, then the highest score, then the busiest).  The
    roll-up's evidence names that accelerator and its workload, carries the node's inputs and
    every accelerator's state, score and workload."""
    th = thresholds or MismatchThresholds()
    per: list[tuple[bool, float, int, AcceleratorVerdict, AcceleratorFeatures]] = []
    for acc in features.accelerators:
        if acc.busy is None or acc.coverage < th.min_coverage or math.isnan(acc.busy):
            continue
        state, score, reasons = classify_accelerator(acc, features, th)
        score = round(max(0.0, min(1.0, score)), 4)
        ev = accelerator_evidence(acc)
        ev["reasons"] = reasons
        if acc.has_waitfor:
            ev["waitfor"] = waitfor_evidence(acc, state, th)
        dma = _device_dma(acc, features)
        named, why = _named_workload(acc, state, th)
        if acc.workloads:
            ev["workload_named_by"] = why
        av = AcceleratorVerdict(acc.name, state, score, dma >= th.pin_churn_rate, workload_labels(named), ev)
        per.append((state not in IO_STATES, -score, _TIE_ORDER[state], av, acc))
    if not per:
        return None
    worst = min(per, key=lambda p: p[:3])
    av, acc = worst[3], worst[4]
    dma = features.dma_map_rate or 0.0
    pin_churn = dma >= th.pin_churn_rate
    evidence: dict[str, Any] = {
        "accelerator": acc.name,
        "workload": dict(av.workload),
        "busy": _r(acc.busy),
        "busy_median": _r(acc.busy_typical),
        "link_util": _r(acc.link_util),
        "link_util_median": _r(acc.link_util_typical),
        "link_bytes_per_second": _r(acc.link_bytes_per_second, 0),
        "link_ceiling_bytes_per_second": _r(acc.link_ceiling, 0),
        "cpu_busy": _r(features.cpu_busy),
        "pressure": _r(features.pressure),
        "dma_map_rate": _r(features.dma_map_rate, 2),
        "retransmit_rate": _r(features.retransmit_rate, 2),
        "pin_churn": pin_churn,
        "reasons": av.evidence["reasons"],
    }
    if acc.has_workload_evidence:
        evidence.update(feeder_busy=_r(acc.feeder_busy), cpu_wait=_r(acc.cpu_wait), cpu_pressure=_r(acc.cpu_pressure))
    if len(per) > 1:
        evidence["accelerators"] = {p[3].accelerator: {"state": p[3].state, "score": p[3].score,
                                                       "workload": workload_text(_key(p[3].workload))}
                                    for p in per}
    return NodeVerdict(av.state, av.score, pin_churn, evidence, [p[3] for p in per])
