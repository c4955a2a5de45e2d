"""What triscope said about each scenario of a recording, against what the timeline expected.

    python -m examples.inference.report --db sqlite:///h200-inference-1.db --node h200-inference-1 \\
        --timeline h200-inference-1.timeline.jsonl [--audit h200-inference-1.audit.jsonl] [--json] [--markdown]

The recording is a store written by the agent while ``scenarios.py`` ran (``h200_record.sh``), or a
trace imported from one (``triscope import-trace``), and the scenario runner's timeline.  For every
scenario it reads what the agent's tracker published per accelerator (``triscope_mismatch_state``
with its workload labels, one point per tick), and:

* **windows**: the scenario's span after ``settle`` seconds (the fault is set at its start; the
  tracker's 10 s window and 2 s dwell need that long to see it) cut into ``window`` s windows
  aligned to the scenario's start; each window's verdict is the (state, identity) the tracker
  published on most of its ticks (``identity``: the ``workload`` label, or on Kubernetes, where
  it is empty, the pod).  A window is **right** when its state is one the timeline expects for the
  faulty instance and, for an I/O state, it names the faulty instance (its ``workload``, or any
  of the names in its line's ``accept`` list); for the both-healthy scenarios when the state is a healthy
  one.  The faulty instance is the line marked ``faulty`` (``a`` or ``b``; the inference
  timelines, which do not mark it, have ``b`` faulty when a knob is off its default).  **Pages on
  the healthy instance**: I/O windows naming an instance that carried no fault, whichever it is.
* **rca**: ``triscope rca``'s incident timeline over the whole recording; per scenario the bad
  episodes overlapping its settled span, with their top cause.
* **alerts**: the shipped alerting rules on the accelerator's series (``deploy/prometheus/
  triscope-rules.yaml``: score > 0.3 and the state for 5 m / 10 m; the severe page on a 15 m
  average): how long each expression held inside the scenario, and whether it would fire (held
  for its ``for``).  ``tests/integration/test_report_alerts_promtool.py`` checks this against the real
  ``promtool test rules`` on h200-inference-1's replayed verdicts: with ``for`` at 0 s the shipped rules
  fire at exactly the seconds this says their expression holds, and unchanged none fires in a scenario.
* **dma**: for the pin-churn scenario, the bytes the agent saw DMA-mapped against the bytes the
  service page-locked (``inference_host_registered_bytes_total``).
* **loop**: the closed loop's line, with the engine's decision from the audit (``--audit``: the
  JSON lines ``h200_record.sh`` exports) or the store's audit table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triscope.core.vocabulary import IO_STATES as _IO
from triscope.core.vocabulary import accelerator_name

IO_STATES = tuple(sorted(_IO))
HEALTHY_STATES = ("idle", "demand-limited", "compute-bound", "balanced")
# the shipped accelerator alerts (deploy/prometheus/triscope-rules.yaml): state, for
ALERTS = {"TriscopeIOSaturated": ("io-saturated", 300.0), "TriscopeStagingBound": ("staging-bound", 600.0),
          "TriscopeNetworkBound": ("network-bound", 300.0)}
SEVERE = ("TriscopeMismatchSevere", 900.0, 900.0)   # name, avg window, for
SCORE_OVER = 0.3


@dataclass
class Track:
    """One accelerator's published state per tick: ts -> (state, workload label); ``named_by``
    (a replay's only): ts -> why the verdict named that workload (``workload_named_by`` of its
    evidence: "wait-for chain: ...", "host evidence", "SM share", ...)."""

    accelerator: str
    points: dict[float, tuple[str, str]]
    scores: dict[float, float]
    named_by: dict[float, str] = field(default_factory=dict)

    def between(self, a: float, b: float) -> list[tuple[float, str, str]]:
        return [(t, s, w) for t, (s, w) in sorted(self.points.items()) if a <= t < b]


def load_timeline(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def identity(labels: Mapping[str, str]) -> str:
    """What a verdict names, as one string: its ``workload`` label (``cmd:lab-b``,
    ``unit:x.service``, ``Deployment/x``, ``shared``); on Kubernetes, where the agent leaves
    ``workload`` empty and sets the pod labels, ``pod:<namespace>/<pod>`` and ``/<container>``
    when the container is named; ``""`` when it names nothing."""
    w = labels.get("workload", "") or ""
    pod = labels.get("pod", "") or ""
    if w or not pod:
        return w
    ctr = labels.get("container", "") or ""
    return f"pod:{labels.get('namespace', '') or ''}/{pod}" + (f"/{ctr}" if ctr else "")


def identity_names(ident: str) -> set[str]:
    """The names an ``identity`` answers to: ``cmd:lab-b`` -> {lab-b}; ``pod:lab/lab-b/lab-b-prep``
    -> {lab-b, lab-b-prep, lab/lab-b} (the pod, its container, the namespaced pod)."""
    if ident.startswith("pod:"):
        ns, _, rest = ident[len("pod:"):].partition("/")
        pod, _, ctr = rest.partition("/")
        return {n for n in (pod, ctr, f"{ns}/{pod}" if ns and pod else "") if n}
    n = _workload_name(ident)
    return {n} if n else set()


def accepted_names(line: Mapping[str, Any]) -> set[str]:
    """The names a right verdict may give for the instance of timeline ``line``: its ``accept``
    list when it has one (a pod, its containers), else its ``workload``."""
    acc = line.get("accept")
    return {str(x) for x in acc} if acc else {str(line.get("workload", ""))} - {""}


def names_instance(ident: str, line: Mapping[str, Any] | None) -> bool:
    """Does a verdict naming ``ident`` name the instance of timeline ``line``?"""
    return line is not None and bool(identity_names(ident) & accepted_names(line))


def scenario_roles(mine: Mapping[str, dict[str, Any]]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A scenario's lines by instance -> (the faulty instance's line or None, the healthy ones').
    A timeline that marks ``faulty`` (the host labs') is taken at its word, a or b; the inference
    timelines mark none: b is faulty when a knob is off its default (``_faulty``), a healthy."""
    pair = [mine[w] for w in ("a", "b") if w in mine]
    if any("faulty" in ln for ln in pair):
        faulty = next((ln for ln in pair if ln.get("faulty")), None)
        return faulty, [ln for ln in pair if ln is not faulty]
    b = mine.get("b")
    faulty = b if b is not None and b.get("knobs") and _faulty(b) else None
    return faulty, [ln for ln in pair if ln is not faulty]


def tracks(store: Any, node: str, start: float, end: float) -> dict[str, Track]:
    """Every accelerator's published (state, identity) per tick from the stored state series."""
    out: dict[str, Track] = {}
    for sd in store.query("triscope_mismatch_state", node=node, start=start, end=end, max_points=None):
        lab = sd.info.labels
        acc = accelerator_name(lab)
        if not acc:
            continue        # the node's roll-up
        tr = out.setdefault(acc, Track(acc, {}, {}))
        for t, v in zip(sd.ts, sd.values, strict=True):
            if v >= 0.5:
                tr.points[round(t, 3)] = (lab.get("state", ""), identity(lab))
    for sd in store.query("triscope_mismatch_score", node=node, start=start, end=end, max_points=None):
        lab = sd.info.labels
        acc = accelerator_name(lab)
        if acc in out:
            for t, v in zip(sd.ts, sd.values, strict=True):
                out[acc].scores[round(t, 3)] = v
    return out


def _majority(points: Sequence[tuple[float, str, str]]) -> tuple[str, str] | None:
    if not points:
        return None
    (sw, _), = Counter((s, w) for _, s, w in points).most_common(1)
    return sw


def _workload_name(w: str) -> str:
    """``cmd:inference-b`` / ``unit:inference-b.service`` / ``Deployment/inference-b`` -> inference-b."""
    for p in ("cmd:", "unit:"):
        if w.startswith(p):
            w = w[len(p):]
    return w.split("/", 1)[-1].removesuffix(".service")


def alert_holds(track: Track, a: float, b: float) -> dict[str, dict[str, Any]]:
    """Each shipped accelerator alert inside [a, b): seconds its expression held (longest run) and
    whether it fires (the run reaches its ``for``), with the workload it names."""
    out: dict[str, dict[str, Any]] = {}
    pts = track.between(a, b)
    for name, (state, for_s) in ALERTS.items():
        best, run_start, who = 0.0, None, ""
        for t, s, w in pts:
            ok = s == state and track.scores.get(t, 0.0) > SCORE_OVER
            if ok:
                run_start = t if run_start is None else run_start
                if t - run_start >= best:
                    best, who = t - run_start, w
            else:
                run_start = None
        out[name] = {"held_s": round(best, 1), "for_s": for_s, "fires": best >= for_s, "workload": who}
    # the severe page: a 15-minute average score > 0.5 held 15 minutes: a recording shorter than
    # 30 minutes cannot fire it; say how high the average got
    scores = [v for t, v in sorted(track.scores.items()) if a <= t < b]
    out[SEVERE[0]] = {"held_s": 0.0, "for_s": SEVERE[2], "fires": False,
                      "mean_score": round(sum(scores) / len(scores), 3) if scores else None}
    return out


def scenario_rows(store: Any, node: str, lines: Sequence[dict[str, Any]], settle: float = 15.0,
                  window: float = 10.0) -> list[dict[str, Any]]:
    """One row per scenario: the faulty instance's expectation, the windows' verdicts, pages on the
    healthy instance, the alerts (the verdicts the store holds)."""
    scen = [ln for ln in lines if ln.get("scenario") != "loop_closed"]
    if not scen:
        return []
    t0 = min(float(ln["start"]) for ln in lines)
    t1 = max(float(ln["end"]) for ln in lines)
    return score_tracks(tracks(store, node, t0 - 30, t1 + 30), lines, settle, window)


def score_tracks(trs: dict[str, Track], lines: Sequence[dict[str, Any]], settle: float = 15.0,
                 window: float = 10.0) -> list[dict[str, Any]]:
    """``scenario_rows`` over verdicts already in hand (a replay's ``Track`` per accelerator)."""
    scen = [ln for ln in lines if ln.get("scenario") != "loop_closed"]
    rows: list[dict[str, Any]] = []
    for name in dict.fromkeys(ln["scenario"] for ln in scen):
        mine = {ln["instance"]: ln for ln in scen if ln["scenario"] == name}
        b, a = mine.get("b"), mine.get("a")
        if b is None or a is None:
            continue
        faulty, healthy = scenario_roles(mine)
        both_healthy = faulty is None
        expect = list((faulty or b)["expected_state"])
        hog = next((ln for ln in scen if ln["scenario"] == name and ln["instance"] == "b:neighbour"), None)
        one_gpu = a["gpu"] == b["gpu"]
        if hog is not None and one_gpu:
            # one GPU: the hog shares it, so the GPU's verdict is the hog's line's
            expect, both_healthy = list(hog["expected_state"]), True
        gpu_b = f"gpu={(faulty or b)['gpu']}"
        tr = trs.get(gpu_b)
        s0, s1 = float(b["start"]) + settle, float(b["end"])
        wins: list[dict[str, Any]] = []
        right = pages = 0
        t = s0
        while t + window <= s1 + 1e-6 and tr is not None:
            v = _majority(tr.between(t, t + window))
            if v is not None:
                state, wl = v
                ok = state in expect and (both_healthy or state not in IO_STATES or names_instance(wl, faulty))
                page = state in IO_STATES and any(names_instance(wl, h) for h in healthy)
                right += ok
                pages += page
                why = Counter(tr.named_by[p] for p, st, _w in tr.between(t, t + window)
                              if st == state and p in tr.named_by).most_common(1)
                wins.append({"start": round(t, 1), "state": state, "workload": wl, "right": ok,
                             "named_by": why[0][0] if why else None})
            t += window
        states = Counter(w["state"] for w in wins)
        named = Counter(w["workload"] for w in wins if w["state"] in IO_STATES)
        named_by = Counter(w["named_by"] for w in wins if w["state"] in IO_STATES and w.get("named_by"))
        first_right = None
        if tr is not None and faulty is not None and not both_healthy and set(expect) & set(IO_STATES):
            # the fault's onset is the scenario's start (the workload script's own time stamp, taken once
            # the fault is in place): the first tick the published verdict is right, seconds after it
            first_right = next((round(t - float(b["start"]), 1) for t, st, wl in tr.between(float(b["start"]), s1)
                                if st in expect and names_instance(wl, faulty)), None)
        rows.append({
            "scenario": name, "title": b.get("title", ""), "start": float(b["start"]), "end": float(b["end"]),
            "gpu_a": a["gpu"], "gpu_b": b["gpu"], "faulty": (faulty or {}).get("instance"),
            "expected_b": expect, "expected_cause": (faulty or b).get("expected_cause"),
            "expected_page": bool(b.get("page")), "load": {"a": (a.get("load") or {}).get("level"),
                                                           "b": (b.get("load") or {}).get("level")},
            "windows": len(wins), "right": right, "pages_on_healthy": pages, "first_right_s": first_right,
            "states": dict(states.most_common()), "io_named": dict(named.most_common()),
            "io_named_by": dict(named_by.most_common()),
            "verdict": states.most_common(1)[0][0] if states else None,
            "client_p99_ms": {"a": (a.get("client") or {}).get("p99_ms"), "b": (b.get("client") or {}).get("p99_ms")},
            "alerts": alert_holds(tr, s0, s1) if tr is not None else {},
            "neighbour": hog.get("note") if hog is not None else None, "one_gpu": one_gpu,
            "window_detail": wins,
        })
    return rows


def _faulty(line: Mapping[str, Any]) -> bool:
    """Did b carry a fault (any knob off its start-up default) in this scenario?  A timeline that
    says so itself (``faulty``: the host lab's) is taken at its word."""
    if "faulty" in line:
        return bool(line["faulty"])
    k = line.get("knobs") or {}
    return (k.get("pinned") is False or k.get("pin_churn") is True or (k.get("workers") or 4) < 2
            or bool(k.get("cpu_affinity")) or (k.get("upload_mib") or 0) > 0 or (k.get("net_drop") or 0) > 0
            or k.get("noisy_neighbour", "off") != "off")


def rca_rows(store: Any, node: str, rows: list[dict[str, Any]], start: float, end: float) -> None:
    """Attach to each row the bad episodes of ``triscope rca`` overlapping its settled span."""
    from triscope.analysis.rca.timeline import rca_timeline

    tl = rca_timeline(store, node, start, end)
    for r in rows:
        a, b = r["start"] + 15.0, r["end"]
        eps = []
        for e in tl.episodes:
            if not e.bad or min(e.end, b) - max(e.start, a) < 5.0:    # overlapping its settled span by 5 s
                continue
            top = e.causes[0] if e.causes else None
            eps.append({"state": e.state, "kind": e.kind, "accelerator": e.accelerator,
                        "workload": e.workload[3] if isinstance(e.workload, tuple) else str(e.workload),
                        "start": round(e.start, 1), "end": round(e.end, 1),
                        "top_cause": getattr(top, "key", None) if top is not None else None})
        r["episodes"] = eps
        r["top_cause"] = next((e["top_cause"] for e in eps if e["kind"] == "state" and e["top_cause"]), None)


def dma_check(store: Any, node: str, row: dict[str, Any]) -> dict[str, Any]:
    """Bytes DMA-mapped by the agent's count vs bytes page-locked by the service, over a scenario."""
    a, b = row["start"], row["end"]

    def delta(metric: str, labels: dict[str, str] | None = None) -> float:
        total = 0.0
        for sd in store.query(metric, node=node, labels=labels, start=a - 5, end=b + 5, max_points=None, rate=False):
            inside = [v for t, v in zip(sd.ts, sd.values, strict=True) if a <= t <= b]
            if len(inside) >= 2:
                total += max(0.0, inside[-1] - inside[0])
        return total

    pinned = delta("inference_host_registered_bytes_total")
    mapped = delta("triscope_dma_map_bytes_total", {"direction": "bidirectional"}) + \
        delta("triscope_dma_map_bytes_total", {"direction": "to_device"})
    estimated = delta("triscope_dma_map_sg_estimated_bytes_total")
    maps = delta("triscope_dma_map_total")
    regs = delta("inference_host_registrations_total")
    return {"bytes_pinned": pinned, "bytes_mapped": mapped, "bytes_estimated": estimated,
            "maps": maps, "registrations": regs,
            "mapped_over_pinned": round(mapped / pinned, 4) if pinned else None}


def loop_row(lines: Sequence[dict[str, Any]], audit: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The closed loop: onset, the engine's acting decision, p99 before / during / after, the
    healthy instance untouched."""
    loop = next((ln for ln in lines if ln.get("scenario") == "loop_closed"), None)
    if loop is None:
        return None
    onset = float(loop["fault_onset"])
    def when(d: dict[str, Any]) -> float:      # when the action was issued, else decided
        return float(d.get("issued_ts") or d.get("ts") or 0.0)

    acts = [d for d in audit if d.get("outcome") == "acted" and when(d) >= onset - 1]
    first = min(acts, key=when) if acts else None
    healthy_acts = [d for d in audit if d.get("outcome") in ("acted", "dry_run")
                    and loop["healthy"]["workload"] in json.dumps(d.get("target") or d.get("target_key") or "")]
    p99 = loop.get("p99_ms") or {}
    return {"fault": loop.get("fault"), "onset": onset,
            "decision_ts": when(first) if first else None,
            "onset_to_action_s": round(when(first) - onset, 1) if first else None,
            "onset_to_service_s": loop.get("onset_to_fallback_s"),
            "action": (first or {}).get("action"), "target": (first or {}).get("target_key"),
            "reason": (first or {}).get("reason"),
            "p99_ms": p99, "after_within_20pct": loop.get("after_within_20pct"),
            "healthy_acted_on": len(healthy_acts), "healthy_knobs_file": loop["healthy"].get("knobs_file_exists")}


def audit_rows(store: Any, since: float, until: float) -> list[dict[str, Any]]:
    from triscope.store import audit as audit_mod

    return [json.loads(json.dumps(r.as_dict(), default=str))
            for r in audit_mod.audit_log(store, since=since, until=until, limit=100_000)]


EVIDENCE = {   # per-workload series: (key in the report, metric); counters are read as per-second rates
    "cores": "triscope_workload_cpu_seconds_total",
    "busiest_thread": "triscope_workload_feeder_busy_ratio",
    "cpu_wait": "triscope_workload_cpu_wait_ratio",
}


def _mean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None and v == v]
    return round(sum(vals) / len(vals), 3) if vals else None


def host_evidence(store: Any, node: str, a: float, b: float, gpu: str) -> dict[str, Any]:
    """What the verdict weighed over [a, b] on one GPU, as window means: per workload its cores
    (CPU seconds per second), its busiest thread's share of a core and its threads' CPU wait; the
    GPU's SM activity and PCIe receive/transmit GB/s.  The figures docs/inference-validation.md
    cites come from here."""
    wl: dict[str, dict[str, Any]] = {}
    for key, metric in EVIDENCE.items():
        for sd in store.query(metric, node=node, labels={"gpu": gpu}, start=a, end=b, max_points=None):
            name = sd.info.labels.get("workload", "") or "(none)"
            wl.setdefault(name, {})[key] = _mean(list(sd.values))
    out: dict[str, Any] = {"workloads": {k: v for k, v in sorted(wl.items()) if any(x is not None for x in v.values())}}
    for key, metric, scale in (("sm_active", "triscope_gpu_sm_active_ratio", 1.0),
                               ("pcie_rx_gbps", "triscope_gpu_pcie_rx_bytes_total", 1e-9),
                               ("pcie_tx_gbps", "triscope_gpu_pcie_tx_bytes_total", 1e-9)):
        sds = store.query(metric, node=node, labels={"gpu": gpu}, start=a, end=b, max_points=None)
        m = _mean(list(sds[0].values)) if sds else None
        out[key] = None if m is None else round(m * scale, 3)
    return out


def build_report(store: Any, node: str, lines: Sequence[dict[str, Any]],
                 audit: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    start = min(float(ln["start"]) for ln in lines)
    end = max(float(ln["end"]) for ln in lines)
    rows = scenario_rows(store, node, lines)
    rca_rows(store, node, rows, start - 60, end)
    for r in rows:
        r["host"] = host_evidence(store, node, r["start"] + 15.0, r["end"], str(r["gpu_b"]))
    for r in rows:
        if r["scenario"] in ("pin_churn", "loop_closed"):
            r["dma"] = dma_check(store, node, r)
    if audit is None:
        audit = audit_rows(store, start - 60, end + 60)
    wins = sum(r["windows"] for r in rows)
    right = sum(r["right"] for r in rows)
    return {"node": node, "start": start, "end": end, "scenarios": rows,
            "summary": {"windows": wins, "right": right, "right_share": round(right / wins, 4) if wins else None,
                        "pages_on_healthy": sum(r["pages_on_healthy"] for r in rows),
                        "alerts_firing": sorted({f"{r['scenario']}:{n}" for r in rows
                                                 for n, x in r["alerts"].items() if x.get("fires")})},
            "loop": loop_row(lines, audit), "decisions": len(audit)}


def markdown(rep: dict[str, Any]) -> str:
    """The scenario table for docs/inference-validation.md."""
    out = ["| scenario | load a / b | expected for b | verdict (windows) | right | I/O named | "
           "pages on a | rca top cause | shipped alert |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rep["scenarios"]:
        states = ", ".join(f"{s} {n}" for s, n in r["states"].items())
        named = ", ".join(f"{w or '—'} {n}" for w, n in r["io_named"].items()) or "—"
        al = [f"{n} held {x['held_s']:g} s of {x['for_s']:g}" for n, x in r["alerts"].items()
              if x.get("held_s")]
        fires = [n for n, x in r["alerts"].items() if x.get("fires")]
        out.append(f"| `{r['scenario']}` | {r['load']['a']} / {r['load']['b']} | {' or '.join(r['expected_b'])}"
                   f"{' / `' + r['expected_cause'] + '`' if r['expected_cause'] else ''} | {states} | "
                   f"{r['right']}/{r['windows']} | {named} | {r['pages_on_healthy']} | "
                   f"{r.get('top_cause') or '—'} | {('fires: ' + ', '.join(fires)) if fires else 'none fires'}"
                   f"{' (' + '; '.join(al) + ')' if al else ''} |")
    s = rep["summary"]
    out.append("")
    out.append(f"Right verdict and workload: {s['right']}/{s['windows']} windows "
               f"({100 * (s['right_share'] or 0):.1f} %); I/O verdicts naming the healthy instance: "
               f"{s['pages_on_healthy']}.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="the recording's store (sqlite:///FILE)")
    ap.add_argument("--node", required=True)
    ap.add_argument("--timeline", type=Path, required=True)
    ap.add_argument("--audit", type=Path, default=None, help="the engine's decisions as JSON lines")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    from triscope.store import Store

    st = Store.open(args.db)
    try:
        audit = load_timeline(args.audit) if args.audit else None
        rep = build_report(st, args.node, load_timeline(args.timeline), audit)
    finally:
        st.close()
    if args.json:
        print(json.dumps(rep, indent=1, default=str))
    if args.markdown or not args.json:
        print(markdown(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
