"""The Remediation page's rows: each audited decision with its node (a revert names the node of the
decision it reverts), the accelerator it was about, whether it is a recording's, a link to its
episode on the Root cause page and to its node, and its outcome: the verdict of its accelerator
before it and after it, from the verdict history (``StoreReader.verdict_runs``).

No Dash here: plain data from the audit rows (``triscope.dashboard.data.audit_rows``) and the store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

from triscope.core.vocabulary import IO_STATES, accelerator_labels
from triscope.dashboard.data import AuditRecord
from triscope.store import audit
from triscope.store.reader import StoreReader, VerdictRun

if TYPE_CHECKING:
    from triscope.store.api import Store

OUTCOME_HORIZON_S = 600.0
"""How long after a decision its accelerator's next state counts as the decision's outcome."""
EPISODE_PAD_S = 30.0
"""Seconds shown on each side of the episode a decision links to."""
_GPU_IN_TRIGGER = re.compile(r"[{,]gpu=([^,}]+)")


@dataclass
class Outcome:
    before: str            # the accelerator's state when the decision was made ("" unknown)
    after: str             # the next other state within OUTCOME_HORIZON_S ("" none)
    after_s: float | None  # seconds from the decision to ``after``
    seen_s: float          # seconds of history after the decision (how far "still" reaches)
    episode: tuple[float, float] | None   # the run the decision was made in

    def text(self) -> str:
        if not self.before:
            return "no verdict stored around it"
        if self.after:
            return f"{self.before} \u2192 {self.after} after {_dur(self.after_s or 0.0)}"
        if self.seen_s <= 0:
            return f"{self.before}; nothing stored after it"
        return f"still {self.before} {_dur(self.seen_s)} later"

    @property
    def better(self) -> bool | None:
        """True: a fault that ended; False: a fault that went on; None: not a fault, or unknown."""
        if self.before not in IO_STATES:
            return None
        return bool(self.after) and self.after not in IO_STATES


def _dur(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def decision_accelerator(row: AuditRecord) -> str:
    """The accelerator (``gpu=0``) a decision was about: its params' workload, else its trigger's
    labels (a revert: the one it reverts, ``fill_revert_nodes``); "" for a decision about no
    accelerator (then the node's roll-up is read)."""
    if row.get("accelerator"):
        return str(row["accelerator"])
    wl = _workload_param(row.get("params") or {})
    if wl.get("gpu") not in (None, ""):
        return f"gpu={wl['gpu']}"
    if wl.get("npu") not in (None, ""):
        return ",".join(f"{k}={wl[k]}" for k in ("chip", "npu") if wl.get(k) not in (None, ""))
    m = _GPU_IN_TRIGGER.search(str(row.get("trigger") or ""))
    return f"gpu={m.group(1)}" if m else ""


def _workload_param(params: Mapping[str, object]) -> dict[str, str | None]:
    """The ``workload`` of an action's params ({} when it names none): its values as text, None kept."""
    wl = params.get("workload")
    if not isinstance(wl, Mapping):
        return {}
    return {str(k): None if v is None else str(v) for k, v in wl.items()}


def fill_revert_nodes(store: Store, rows: Sequence[AuditRecord]) -> None:
    """A decision without a node (a revert: the engine undoes what it did on a target) takes the
    node of the newest earlier decision on the same target that names one (in place)."""

    cache: dict[str, tuple[str, str]] = {}
    for r in rows:
        key = str(r.get("target_key") or "")
        if r.get("node") or not key or r.get("ts") is None:
            continue
        if key not in cache:
            earlier = audit.audit_log(store, until=float(r["ts"]), target_key=key, limit=50)
            first = next((e for e in earlier if e.node), None)
            cache[key] = ("", "") if first is None else (
                str(first.node), decision_accelerator(AuditRecord(params=first.params, trigger=first.trigger)))
        node, acc = cache[key]
        if node:
            r["node"], r["node_from"] = node, "the decision it reverts"
            r.setdefault("accelerator", acc)


def outcome(runs: Sequence[VerdictRun], accelerator: str, ts: float, data_end: float) -> Outcome:
    """The verdict of ``accelerator`` (``""``: the node's roll-up) before ``ts`` and the next other
    one after it, from the node's verdict runs."""
    mine = sorted((r for r in runs if r.accelerator == accelerator), key=lambda r: r.start)
    if not mine and accelerator:
        mine = sorted((r for r in runs if r.accelerator == ""), key=lambda r: r.start)
    cur = next((r for r in reversed(mine) if r.start <= ts), None)
    if cur is None:
        return Outcome("", "", None, 0.0, None)
    nxt = next((r for r in mine if r.start > ts and r.state != cur.state
                and r.start - ts <= OUTCOME_HORIZON_S), None)
    seen = min(OUTCOME_HORIZON_S, max(0.0, max((r.end for r in mine), default=ts) - ts, data_end - ts))
    if nxt is not None:
        return Outcome(cur.state, nxt.state, nxt.start - ts, seen, (cur.start, max(cur.end, ts)))
    return Outcome(cur.state, "", None, seen, (cur.start, max(cur.end, ts)))


def episode_link(node: str, ts: float, episode: tuple[float, float] | None) -> str:
    """The Root cause page over the decision's episode (the run it was made in), else the ten
    minutes around it."""
    a, b = episode if episode is not None else (ts - 300.0, ts + 300.0)
    q = urlencode({"node": node, "start": f"{a - EPISODE_PAD_S:.0f}", "end": f"{b + EPISODE_PAD_S:.0f}"})
    return f"/rootcause?{q}"


def node_link(node: str, ts: float, accelerator: str) -> str:
    """The Node page around the decision, on its accelerator when it names one."""
    q: dict[str, str] = {"range": "custom", "start": f"{ts - 600:.0f}", "end": f"{ts + 600:.0f}"}
    q.update(accelerator_labels(accelerator) if accelerator else {})
    return f"/node/{quote(node)}?{urlencode(q)}"


def recorded_nodes(store: StoreReader) -> dict[str, str]:
    """node -> the trace file it was imported from, for the nodes that are recordings."""
    return {n.name: n.recording for n in store.nodes() if n.recording is not None}


@dataclass
class Decision:
    row: AuditRecord
    node: str
    accelerator: str
    recorded: str            # the trace a recording's decision came with; "" for this store's engine
    outcome: Outcome | None  # None without a node


def decisions(store: Store, rows: Sequence[AuditRecord]) -> list[Decision]:
    """The page's decisions: nodes filled, recordings marked, outcomes read (one verdict-history
    read per node, over the decisions' span and the horizon after it)."""
    fill_revert_nodes(store, rows)
    recs = recorded_nodes(store)
    by_node: dict[str, list[float]] = {}
    for r in rows:
        if r.get("node") and r.get("ts") is not None:
            by_node.setdefault(str(r["node"]), []).append(float(r["ts"]))
    runs = {n: store.verdict_runs(n, min(ts) - OUTCOME_HORIZON_S, max(ts) + OUTCOME_HORIZON_S)
            for n, ts in by_node.items()}
    last = {n.name: n.last_seen for n in store.nodes()}
    out = []
    for r in rows:
        node = str(r.get("node") or "")
        acc = decision_accelerator(r)
        oc = None
        if node and r.get("ts") is not None:
            oc = outcome(runs.get(node, []), acc, float(r["ts"]), last.get(node, float(r["ts"])))
        out.append(Decision(r, node, acc, recs.get(node, ""), oc))
    return out
