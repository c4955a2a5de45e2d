"""Root cause that agrees with the verdict: an I/O episode's top cause is the one its wait-for chain
names (docs/waitfor.md).

The verdict decided a ``staging-bound`` or ``network-bound`` episode on what its accelerator's
driving threads waited on; ``chain_cause`` reads the same evidence over the whole episode (its
wait-for series, one window as long as the episode, through ``window_feature_list`` and the
verdict's own ``deciding_chain``) and makes it the episode's first cause: ``host_staging`` naming
the starving producer (the container, process or thread the chain ends on, and what held it:
its CPU work, its CPU limit, a CPU it could not get, pageable copies), ``network`` naming the
connection that lost packets.  The other causes stay, ranked below it, as supporting context.
Episodes without wait-for series (older recordings, agents run with ``--no-waitfor``) are ranked
as before.  Pure.
"""

from __future__ import annotations

from typing import Any

from triscope.analysis.episodes import NODE, Episode
from triscope.analysis.features import (
    GPU_BUSY,
    GPU_UTIL,
    NPU_BUSY,
    WAIT_KEYED,
    WORKLOAD_METRICS,
    workload_text,
)
from triscope.analysis.mismatch import window_feature_list
from triscope.analysis.mismatch_inputs import mismatch_inputs_from_series
from triscope.analysis.rca.evidence import EvidenceContext
from triscope.analysis.rca.score import Cause
from triscope.analysis.verdict import deciding_chain, engaged
from triscope.analysis.waitverdict import NETWORK, STAGING, chain_reasons

CHAIN_KEY = {"staging-bound": "host_staging", "network-bound": "network"}
_METRICS = (GPU_BUSY, NPU_BUSY, GPU_UTIL, *WORKLOAD_METRICS)


def chain_cause(e: Episode, ctx: EvidenceContext) -> Cause | None:
    """The cause an I/O episode's chain names; None where the episode has no such chain."""
    if e.accelerator == NODE or e.state not in CHAIN_KEY or e.end <= e.start:
        return None
    series = [sp for m in _METRICS for sp in ctx.by_metric.get(m, ())]
    if not any(sp.metric in WAIT_KEYED for sp in series):
        return None
    inputs = mismatch_inputs_from_series(series, e.start, e.end)
    feats = window_feature_list(inputs, e.start, e.end, max(1.0, e.end - e.start), ctx.th)
    acc = next((a for _s, _e, f in feats for a in f.accelerators if a.name == e.accelerator), None)
    if acc is None:
        return None
    got = deciding_chain(acc, ctx.th)
    if got is None:
        return None
    f, w = got
    key = CHAIN_KEY[f.state]
    group = STAGING if key == "host_staging" else NETWORK
    ends = [x for x in (f.service if f.path == "service" else f.ends) if x.group == group]
    top = ends[0] if ends else None
    b = engaged(acc)
    reasons = chain_reasons(f, acc.name.replace("=", " ").upper(), b, w, ctx.th)
    if top is None:
        return None
    who = workload_text(f.named)
    if key == "host_staging":
        title = f"Host staging: {workload_text(w.key)}'s driving thread waits {top.words}"
    elif f.path == "service":
        title = f"Network: {workload_text(w.key)}'s requests wait {top.words}"
    else:
        title = f"Network: {workload_text(w.key)}'s driving thread waits {top.words}"
    evidence: list[dict[str, Any]] = [{
        "type": "chain", "detail": reasons[0], "state": f.state, "workload": list(w.key), "named": list(f.named),
        "strength": round(f.strength, 4), "work": round(f.work, 4),
        "groups": {k: round(v, 4) for k, v in f.groups.items()},
        "ends": [x.as_dict() for x in f.ends[:6]], "path": f.path,
        "service": [x.as_dict() for x in f.service[:4]],
    }]
    summary = "; ".join(reasons[:2]) + (f" (names {who})" if who != workload_text(w.key) else "")
    return Cause(key, title, 0.0, e.start, summary, evidence)


def put_first(causes: list[Cause], chain: Cause | None) -> list[Cause]:
    """``causes`` with the chain's cause first: merged into the same family's cause where there is
    one (its evidence after the chain's), scored above every other; the rest keep their order."""
    if chain is None:
        return causes
    top = max((c.score for c in causes), default=0.0)
    same = next((c for c in causes if c.key == chain.key), None)
    if same is not None:
        chain.evidence += same.evidence
        chain.peers = same.peers
    chain.score = max(1.0, top) + 0.5
    return [chain, *(c for c in causes if c is not same)]
