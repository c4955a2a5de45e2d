"""``triscope run``: the main job on one machine.

Agent (this node, live) + the recorded H200 trace as a second node + remediation engine
(dry-run) + dashboard, on a SQLite file store.  Prints where everything is.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from triscope import defaults
from triscope.commands.agent import add_agent_options, build_config
from triscope.commands.common import add_db_option, parse_hostport
from triscope.commands.stopping import bound_the_stop

# package data (triscope/defaults): found without the repository
DEFAULT_TRACE = defaults.TRACES
DEFAULT_POLICY = defaults.POLICY
DEFAULT_SLO = defaults.SLO_DEMO     # the recordings' SLOs over a 1h period (deploy/slo.demo.yaml)

log = logging.getLogger("triscope.run")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="the main job: agent + remediation engine (dry-run) + dashboard on a local store",
        description="Run everything on this machine: the node agent (live samples of this host), the recorded "
        "H200 trace imported as a second node, the remediation engine in dry-run, and the dashboard. "
        "Prints the dashboard URL. Stop with Ctrl-C.",
    )
    add_db_option(p)
    add_agent_options(p)
    p.add_argument("--duration", type=float, default=0.0, help="stop after SECONDS (default: run until Ctrl-C)")
    p.add_argument("--metrics-listen", default="127.0.0.1:9464", metavar="HOST:PORT", help="agent /metrics (default 127.0.0.1:9464)")
    p.add_argument("--dashboard", default="127.0.0.1:8050", metavar="HOST:PORT", help="dashboard address (default 127.0.0.1:8050)")
    p.add_argument("--webhook", default="127.0.0.1:9095", metavar="HOST:PORT",
                   help="remediation webhook for Alertmanager (default 127.0.0.1:9095)")
    p.add_argument("--policy", default=str(DEFAULT_POLICY), help="remediation policy (default deploy/policy.example.yaml)")
    p.add_argument("--slo", default=str(DEFAULT_SLO), help="SLO file (default deploy/slo.demo.yaml: the recordings' SLOs, 1h period)")
    p.add_argument("--trace", action="append", default=None, metavar="FILE",
                   help="a recorded trace to show as another node (repeatable; default: the inference recordings "
                        "examples/traces/h200-inference-*.jsonl.gz, each its own node, else "
                        "examples/traces/h200-phases.*; 'none' to skip)")
    p.set_defaults(func=cmd_run)


def _find_traces(args: list[str] | None) -> list[Path]:
    """The traces ``make run`` shows: those given, else the recordings of the inference scenarios
    (each its own node), else the older phase recording."""
    if args:
        return [] if args == ["none"] else [Path(a) for a in args if a != "none"]
    if not DEFAULT_TRACE.is_dir():
        return []
    found = sorted(DEFAULT_TRACE.glob("h200-inference-*.jsonl.gz"))
    return found or sorted(DEFAULT_TRACE.glob("h200-phases.*"))[:1]


def _import_trace(url: str, path: Path) -> str | None:
    try:
        return str(import_for_demo(url, path))
    except Exception as e:  # noqa: BLE001 - the demo goes on without the trace
        log.error("could not import the trace %s: %s", path, e)
        return None


def _start_engine(url: str, policy: str, listen: tuple[str, int]) -> Any:
    try:
        from triscope.remediation.service import start_embedded
    except ImportError:
        return None
    try:
        return start_embedded(url, policy, listen, dry_run=True)
    except Exception as e:  # noqa: BLE001 - the embedded engine is optional here: whatever stops it, the agent and dashboard run on
        log.error("remediation engine did not start: %s", e)
        return None


def _start_dashboard(url: str, slo: str, listen: tuple[str, int]) -> Any:
    try:
        from triscope.dashboard.app import create_app, serve_in_thread
    except ImportError:
        return None
    slo_file = slo if Path(slo).exists() else None
    app = create_app(url, slo_file=slo_file)
    return serve_in_thread(app, listen[0], listen[1])


def cmd_run(args: argparse.Namespace) -> int:
    from triscope.agent.runtime import Agent
    from triscope.core.errors import UserError
    from triscope.store.db import upgrade

    metrics = parse_hostport(args.metrics_listen)
    dash_addr = parse_hostport(args.dashboard)
    hook = parse_hostport(args.webhook)
    cfg = build_config(args, metrics)
    logging.getLogger("triscope").setLevel(logging.INFO)
    upgrade(cfg.db_url)
    cfg.migrate = False
    lines = [f"store:       {cfg.db_url}"]
    for trace in _find_traces(args.trace):
        node = _import_trace(cfg.db_url, trace)
        if node:
            lines.append(f"trace:       {trace.name} imported as node '{node}' (shifted to end now; its inputs "
                         "replayed through today's classifier, the recorded verdicts kept as triscope_recorded_*)")
    agent = Agent(cfg)
    try:
        agent.start_exporter()
    except OSError as e:
        raise UserError(f"cannot listen on {args.metrics_listen} for /metrics: {e.strerror or e}") from None
    agent.cfg.listen = None
    try:
        agent.start_otlp()
    except OSError as e:
        raise UserError(f"cannot listen on {args.otlp_listen} for OTLP: {e.strerror or e}") from None
    if agent.otlp is not None:
        lines.append(f"otlp:        http://{agent.otlp.address[0]}:{agent.otlp.address[1]}/v1/traces and /v1/metrics")
    lines.append(f"agent:       node '{cfg.node}', every {cfg.interval:g}s, metrics http://{metrics[0]}:{metrics[1]}/metrics")
    engine = _start_engine(cfg.db_url, args.policy, hook)
    if engine is not None:
        lines.append(f"remediation: DRY-RUN, policy {args.policy}, webhook http://{hook[0]}:{hook[1]}/api/v1/alerts")
    dash = None
    try:
        dash = _start_dashboard(cfg.db_url, args.slo, dash_addr)
    except OSError as e:
        raise UserError(f"cannot listen on {args.dashboard} for the dashboard: {e.strerror or e}") from None
    if dash is not None:
        lines.append(f"dashboard:   http://{dash_addr[0]}:{dash_addr[1]}/")
    lines.append(f"look at it:  {_prog()} query --db {cfg.db_url} --metric triscope_tcp_retransmits_total --since 5m")
    lines.append(f"             {_prog()} rca --db {cfg.db_url} --start -30m   (root cause, as an incident timeline)")
    print("triscope is running (Ctrl-C to stop)\n  " + "\n  ".join(lines), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())     # set even when inherited ignored (a background job)
    t = agent.start_background()
    try:
        deadline = time.monotonic() + args.duration if args.duration else None
        while not stop.is_set() and t.is_alive():
            if deadline and time.monotonic() >= deadline:
                break
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        bound_the_stop("triscope run", 45.0)   # the agent writes its ticks (bounded), then the engine and dashboard
        agent.stop()
        t.join(30)
        for h in (engine, dash):
            if h is not None and hasattr(h, "stop"):
                with contextlib.suppress(Exception):
                    h.stop()
    return 0


def import_for_demo(url: str, path: Path | str, node: str | None = None, now: float | None = None) -> str:
    """``make run``'s second node: load the trace shifted to end now, unless a copy loaded earlier is
    still within the last trace-length of time (then nothing is added).  Returns the node name.

    The recording's inputs are replayed through today's tracker as it loads
    (``triscope.commands.replay``): every page, ``triscope rca`` and the engine read today's
    verdicts; the recorded ones stay as ``triscope_recorded_mismatch_*`` series, the recording
    engine's decisions marked ``recorded``."""
    from triscope.commands.replay import replay_trace
    from triscope.commands.trace import import_decisions, mark_recording
    from triscope.core.trace import import_trace, read_trace
    from triscope.store import Store

    trace_node = node or str(read_trace(path).header.get("node") or "trace")
    st = Store.open(url)
    try:
        st.upgrade()
        now = time.time() if now is None else now
        tr = read_trace(path)
        span = float(tr.header.get("end", 0) or 0) - float(tr.header.get("start", 0) or 0)
        bounds = st.time_bounds(trace_node)
        if bounds is not None and bounds[1] >= now - max(span, 60.0):
            mark_recording(st, trace_node, Path(path).name, bounds[1])   # a copy loaded before the mark existed
            return trace_node
        tr = replay_trace(tr)
        info = import_trace(st, path, node=trace_node, shift_to_now=True, now=now, trace=tr)
        mark_recording(st, trace_node, Path(path).name, info.end)
        import_decisions(st, tr, info)
        return trace_node
    finally:
        st.close()


def _prog() -> str:
    """How to run triscope again as this was run: ``.venv/bin/triscope`` after ``make run`` (not on
    PATH), ``triscope`` when it is on PATH."""
    import os
    import shutil
    import sys

    argv0, on_path = sys.argv[0], shutil.which("triscope")
    if os.path.basename(argv0) == "triscope" and os.sep in argv0:
        here = os.path.abspath(argv0)
        if on_path and os.path.abspath(on_path) == here:
            return "triscope"
        rel = os.path.relpath(here)
        return here if rel.startswith("..") else rel
    return "triscope" if on_path else f"{sys.executable} -m triscope"
