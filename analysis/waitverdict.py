"""The verdict from the chain: what a workload's driving threads wait on decides its state.

``chain_finding(w, engaged, th)`` reads one workload's ``WaitEvidence`` (docs/waitfor.md): the
driving threads' time followed along the waits to where it ends, each end with its culprit.  The
ends fall into groups:

* **staging** — the host does not produce what the accelerator needs: a thread on the chain
  working on a CPU (a loader worker, a sidecar, another thread of the process — or the driving
  thread itself, see below), runnable without a CPU (``cpu_wait``), held at its cgroup's CPU limit
  (``cpu_throttled``), copying from pageable memory, reading disk;
* **network** — a network connection on the chain that loses packets (its own retransmits over
  its segments sent, or out-of-order arrivals over segments received, at the per-workload loss
  bars; where the connection's counters are not known, the workload's own sockets' loss);
* **accelerator** — waiting on the accelerator (its driver, a synchronisation call) or on pinned
  copies: the accelerator is the limit;
* **demand** — waiting for requests that do not come (the server's side of a lossless connection,
  a listener), sleeping (pacing), ended by nothing identifiable;
* **upstream** — the client's side of a lossless connection (a slow dependency, not a loss);
* **unseen** — a producer the chain could not follow (not traced yet, past ``max_depth``, nothing
  of it traced in the tick): what it was doing is not known, so it is evidence of nothing.

The driving thread's **own** CPU time is the one end read with care, because a busy thread is a
symptom, not a cause: with the accelerator engaged (``waitfor_engaged``: it runs the work the
thread launches) it is launch overhead (accelerator group); with the workload waiting for demand
(``waitfor_requests_min``: its threads wait for requests longer than anyone waits on the driving
thread) it is polling, nobody waits on it (demand group); otherwise it is the host work the
accelerator waits on (decode on the main thread: staging).

The groups' shares are read over the driving threads' **working** time (their seen time less
demand): an I/O group holding ``waitfor_cause_share`` of it, and more than the accelerator group,
makes the state; with less than ``waitfor_work_floor`` of their seen time working, nothing holds them
back; with less than ``waitfor_seen_floor`` of their time seen (followed to a known end), the chain
decides nothing.  An unseen producer used to count as demand, which let a pool of decoder processes
that the chain could not follow hide a pod-wide CPU limit starving the driving thread (h200-lab-15).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from triscope.analysis.config import MismatchThresholds
from triscope.analysis.features import ChainKey, WaitEvidence, WorkloadEvidence, workload_text
from triscope.core.vocabulary import WorkloadKey

STAGING = "staging"
NETWORK = "network"
ACCELERATOR = "accelerator"
DEMAND = "demand"
UPSTREAM = "upstream"
UNSEEN = "unseen"
GROUPS = (STAGING, NETWORK, ACCELERATOR, DEMAND, UPSTREAM, UNSEEN)
_STAGING_CAUSES = frozenset({"cpu", "cpu_wait", "cpu_throttled", "copy_pageable", "disk"})
_ACCEL_CAUSES = frozenset({"accelerator", "copy_pinned"})


@dataclass(slots=True, frozen=True)
class End:
    """One end of a chain over a window: its cause, the culprit's relation and name, the culprit's
    workload, its share of the driving threads' (or the request path's) time, its group, in words."""

    cause: str
    relation: str
    culprit: str
    workload: WorkloadKey
    share: float
    group: str
    words: str

    def as_dict(self) -> dict[str, object]:
        return {"cause": self.cause, "relation": self.relation, "culprit": self.culprit,
                "workload": list(self.workload), "share": round(self.share, 4), "group": self.group,
                "words": self.words}


@dataclass(slots=True)
class ChainFinding:
    """One workload's reading of its chain over a window."""

    workload: WorkloadKey
    state: str                                  # "staging-bound", "network-bound", or "" (no I/O state)
    strength: float                             # the deciding group's share of the working time
    named: WorkloadKey                          # the workload an I/O verdict names
    groups: dict[str, float]                    # group -> share of the driving threads' time
    work: float                                 # share of their time with work (not demand)
    ends: list[End] = field(default_factory=list)    # the chain's ends, largest first
    reasons: list[str] = field(default_factory=list)
    path: str = "driver"                        # what decided: the driving threads' chain, or "service"
    service: list[End] = field(default_factory=list)  # the request path's ends


def _lossy(w: WorkloadEvidence, ev: WaitEvidence, culprit: str, th: MismatchThresholds) -> tuple[bool, str]:
    """Does the connection a network end names lose packets?  (yes, in words)."""
    out, inn = ev.connection_loss(culprit)
    c = ev.connections.get(culprit, {})
    bar, rate = th.workload_retransmit_ratio, th.workload_retransmit_rate
    lost = c.get("retransmits", 0.0) + c.get("ooo_in", 0.0)       # losses either way, per second
    if out is not None and out >= bar and lost >= rate:
        return True, f"retransmits {out:.1%} of its segments ({c['retransmits']:.1f}/s)"
    if inn is not None and inn >= bar and lost >= rate:
        return True, f"receives {inn:.1%} of its segments after a loss ({c['ooo_in']:.1f}/s)"
    if out is None and inn is None:
        # the connection's own counters are not known (an epoll set of several, a socket not read):
        # the workload's own sockets together
        if w.loss is not None and w.loss >= bar and (w.retransmits or 0.0) >= rate:
            return True, f"the workload's sockets retransmit {w.loss:.1%} of their segments"
        if w.loss_in is not None and w.loss_in >= bar and (w.ooo_in or 0.0) >= rate:
            return True, f"the workload's sockets receive {w.loss_in:.1%} of their segments out of order"
    return False, ""


def _group(key: ChainKey, w: WorkloadEvidence, ev: WaitEvidence, engaged: float, demand_waits: bool,
           th: MismatchThresholds) -> tuple[str, str]:
    """The group of one end of the chain, and what it is in words."""
    cause, relation, culprit = key[0], key[1], key[2]
    if cause == "network" and culprit in ("?", ""):
        return UPSTREAM, "on a socket not told apart (an epoll set of several)"
    if cause == "network":
        lossy, how = _lossy(w, ev, culprit, th)
        where = f"connection {'from' if relation == 'inbound' else 'to'} {culprit or 'a peer'}"
        if lossy:
            return NETWORK, f"on its {where}, which {how}"
        return (DEMAND, f"for requests on its {where}") if relation == "inbound" else \
            (UPSTREAM, f"on its {where} (no loss: the peer is slow)")
    if cause in _ACCEL_CAUSES:
        return ACCELERATOR, "on the accelerator" if cause == "accelerator" else "on pinned copies to the accelerator"
    if cause == "cpu" and relation == "self":
        if engaged >= th.waitfor_engaged:
            return ACCELERATOR, "launching work on the accelerator (its own CPU time, the accelerator engaged)"
        if demand_waits:
            return DEMAND, "busy on its own CPU while the workload waits for requests (polling: nobody waits on it)"
        return STAGING, "working on its own CPU between accelerator calls (host work on the accelerator's path)"
    if cause == "cpu_wait" and relation == "self" and demand_waits and (_runs_more_than_it_waits(ev) or _polls(ev, th)):
        return DEMAND, "waiting for a CPU to poll on while the workload waits for requests (nobody waits on it)"
    if cause in _STAGING_CAUSES:
        return STAGING, _staging_words(cause, relation, culprit, key)
    if cause == "producer":
        return UNSEEN, f"on {culprit or 'a process'} (not followed: not traced yet, or too deep)"
    return DEMAND, {"timer": "sleeping (pacing, timeouts)"}.get(cause, "on nothing identifiable")


def _runs_more_than_it_waits(ev: WaitEvidence) -> bool:
    """The driving threads ran on a CPU at least as long as they waited for one: their waits for a
    CPU are their own busy loop's, not a starvation (a thread starved of CPU barely runs)."""
    run = sum(v for k, v in ev.chain.items() if k[0] == "cpu" and k[1] == "self")
    wait = sum(v for k, v in ev.chain.items() if k[0] == "cpu_wait" and k[1] == "self")
    return run >= wait


def _polls(ev: WaitEvidence, th: MismatchThresholds) -> bool:
    """The driving threads never block (running or waiting for a CPU nearly all their time), their
    workload waits for requests, and nobody waits on them (less than ``waitfor_requests_min``
    thread-seconds a second): they poll, so their wait for a CPU is their poll loop's too, however
    contended the CPUs are.  A thread starved of CPU on real work has others waiting on it (its loader
    workers, its handlers), whatever share of the CPU it gets."""
    runnable = ev.states.get("cpu", 0.0) + ev.states.get("cpu_wait", 0.0)
    return runnable >= th.waitfor_polling_runnable and (ev.waited_on or 0.0) < th.waitfor_requests_min


_RELATION = {"self": "itself", "process": "another thread of its process", "workload": "its own workload",
             "pod": "the same pod", "other": "another workload", "kernel": "a kernel thread"}


def _staging_words(cause: str, relation: str, culprit: str, key: ChainKey) -> str:
    who = "itself" if relation == "self" else (
        f"{culprit or 'a producer'} ({_RELATION.get(relation, relation)}"
        + (f", container {key[5]}" if relation == "pod" and key[5] else "") + ")")
    return {"cpu": f"on {who} working on a CPU",
            "cpu_wait": f"on {who} waiting for a CPU" if relation != "self" else "waiting for a CPU",
            "cpu_throttled": f"on {who} held at its CPU limit (throttled)" if relation != "self"
            else "held at its CPU limit (throttled)",
            "copy_pageable": "copying from pageable memory" if relation == "self" else f"on {who} copying from pageable memory",
            "disk": f"on disk ({who})"}[cause]


def chain_finding(w: WorkloadEvidence, engaged: float, th: MismatchThresholds) -> ChainFinding | None:
    """The workload's state from its chain; None without enough wait-for evidence (the older rules
    decide then)."""
    ev = w.wait
    if ev is None or ev.seconds < th.waitfor_min_seconds or not ev.chain:
        return None
    req, waited = ev.requests_wait or 0.0, ev.waited_on or 0.0
    demand_waits = req >= th.waitfor_requests_min and req > waited
    groups = dict.fromkeys(GROUPS, 0.0)
    ends: list[End] = []
    for key, share in sorted(ev.chain.items(), key=lambda kv: -kv[1]):
        g, words = _group(key, w, ev, engaged, demand_waits, th)
        groups[g] += share
        ends.append(End(key[0], key[1], key[2], (key[3], key[4], key[5], key[6]), share, g, words))
    seen = 1.0 - groups[UNSEEN]
    work = seen - groups[DEMAND]
    named = w.key
    f = ChainFinding(w.key, "", 0.0, named, groups, work, ends)
    if seen < th.waitfor_seen_floor:
        return f
    if groups[DEMAND] >= 0.5 * seen:
        _service_finding(f, w, ev, engaged, demand_waits, th)
        if f.state:
            return f
    if work < th.waitfor_work_floor * seen or work <= 0:
        return f
    staging, network, accel = groups[STAGING] / work, groups[NETWORK] / work, groups[ACCELERATOR] / work
    best = max(staging, network)
    if best < th.waitfor_cause_share or best <= accel:
        return f
    f.strength = best
    if network >= staging:
        f.state = "network-bound"
    else:
        f.state = "staging-bound"
        top = next(e for e in ends if e.group == STAGING)
        if top.relation in ("pod", "other") and any(top.workload):
            f.named = top.workload
    return f


def _service_finding(f: ChainFinding, w: WorkloadEvidence, ev: WaitEvidence, engaged: float, demand_waits: bool,
                     th: MismatchThresholds) -> None:
    """The driving threads mostly wait for work: what delays it once a request is in (the request
    path)?  Its handlers' own CPU time is the serving itself; of the rest — the time a request is
    held waiting — connections losing packets holding ``waitfor_cause_share``, and at least
    ``waitfor_service_loss_floor`` of the whole path, make ``network-bound``."""
    if not ev.service or ev.service_seconds < th.waitfor_service_min_seconds:
        return
    net = own = 0.0
    for key, share in sorted(ev.service.items(), key=lambda kv: -kv[1]):
        g, words = _group(key, w, ev, engaged, demand_waits, th)
        if key[0] == "cpu" and key[1] == "self":
            own += share
            words = "working on its own CPU (the serving itself)"
        f.service.append(End(key[0], key[1], key[2], (key[3], key[4], key[5], key[6]), share, g, words))
        if g == NETWORK:
            net += share
    held = sum(ev.service.values()) - own
    if held > 0 and net >= th.waitfor_service_loss_floor and net / held >= th.waitfor_cause_share:
        f.state, f.strength, f.path = "network-bound", net / held, "service"


def chain_reasons(f: ChainFinding, accelerator: str, busy: float, w: WorkloadEvidence,
                  th: MismatchThresholds) -> list[str]:
    """The chain in words an SRE can act on: who waited on what, how much, and what that was doing."""
    ev = w.wait
    assert ev is not None
    who = workload_text(w.key)
    deciding = {"staging-bound": STAGING, "network-bound": NETWORK}.get(f.state)
    if f.path == "service":
        lead = [e for e in f.service if e.group == NETWORK]
        parts = [f"{e.share:.0%} {e.words}" for e in lead[:2]]
        return [f"{accelerator} busy {busy:.0%}: {workload_text(w.key)}'s driving threads wait for work "
                f"{f.groups[DEMAND]:.0%} of the window; once a request is in, its handlers wait {'; '.join(parts)} "
                f"({ev.service_seconds:.1f} thread-seconds of request handling in the window)",
                f"the lossy connections hold {f.strength:.0%} of the time its requests wait (the rest of the "
                f"request path is its handlers' own CPU work): its requests arrive late"]
    lead = [e for e in f.ends if e.group == deciding] if deciding else f.ends[:1]
    parts = [f"{e.share:.0%} {e.words}" for e in lead[:2]]
    first = ", ".join(f"{k} {v:.0%}" for k, v in sorted(ev.states.items(), key=lambda kv: -kv[1])[:3] if v >= 0.01)
    out = [f"{accelerator} busy {busy:.0%}: {who}'s driving thread{'s' if ev.found_by != 'main_thread' else ''} "
           f"waited {'; '.join(parts)} of the window" + (f" (it blocked in: {first})" if first else "")]
    unseen = f.groups.get(UNSEEN, 0.0)
    seen = 1.0 - unseen
    aside = f"; {unseen:.0%} on producers not followed, left out" if unseen >= 0.01 else ""
    if deciding:
        out.append(f"the {deciding} causes hold {f.strength:.0%} of its working time "
                   f"({f.work:.0%} of its time had work; the accelerator itself "
                   f"{f.groups[ACCELERATOR] / max(f.work, 1e-9):.0%}{aside})")
    elif seen < th.waitfor_seen_floor:
        out.append(f"only {seen:.0%} of its time followed to a known end ({unseen:.0%} on producers not followed): "
                   "the chain decides nothing")
    elif f.work < th.waitfor_work_floor * seen:
        out.append(f"{seen - f.work:.0%} of its time waiting for requests, pacing or idle{aside}: nothing holds it back")
    else:
        out.append(f"no I/O cause holds {th.waitfor_cause_share:.0%} of its working time ({f.work:.0%} of its time "
                   f"had work; staging {f.groups[STAGING] / f.work:.0%}, network {f.groups[NETWORK] / f.work:.0%}, "
                   f"the accelerator {f.groups[ACCELERATOR] / f.work:.0%})")
    if ev.found_by and ev.found_by != "driver_calls":
        out.append(f"driving thread found by {ev.found_by.replace('_', ' ')} (no driver API probes)")
    return out


def no_chain_reason(acc_has_workloads: bool) -> str:
    """Said where the older rules decided: the wait-for evidence was missing."""
    return ("no wait-for evidence (the driving thread's waits were not traced: an older agent or "
            "recording, a kernel without the sched tracepoints, or --no-waitfor): decided on host symptoms"
            if acc_has_workloads else "no workload evidence: decided on the accelerator and its link")
