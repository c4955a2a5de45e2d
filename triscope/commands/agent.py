"""``triscope agent``: the node agent alone."""

from __future__ import annotations

import argparse
import signal
import socket

from triscope.commands.common import add_db_option, add_web_config_option, db_url, parse_hostport


def add_agent_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between ticks; every collector runs once per tick (default 1)")
    p.add_argument("--write-every", type=float, default=5.0, metavar="SECONDS",
                   help="write ticks to the store in one transaction every this many seconds (default 5; "
                        "0 = every tick). /metrics is current every tick either way; the store, and the "
                        "dashboard and stored-data triggers that read it, trail by up to this much, and "
                        "a killed agent (SIGKILL, OOM) loses the ticks not written yet (SIGTERM writes them)")
    p.add_argument("--node", default=socket.gethostname(), help="node name the samples are stored under "
                   "(default: this host's name)")
    p.add_argument("--scrape", action="append", default=[], metavar="URL",
                   help="also read an application's Prometheus endpoint each tick (repeatable), e.g. "
                        "http://127.0.0.1:8000/metrics — its request/error counters and latency histograms "
                        "are the SLIs the SLO pages use")
    p.add_argument("--scrape-timeout", type=float, default=2.0, metavar="SECONDS",
                   help="deadline for one read of a --scrape target, connect to last byte (default 2). Each "
                        "target is read on its own worker: a tick waits for it at most a quarter of --interval, "
                        "then uses its last good answer (for up to max(3 intervals, timeout + interval)) and "
                        "reports triscope_collector_up 0 and triscope_collector_staleness_seconds")
    p.add_argument("--scrape-interval", action="append", default=[], metavar="[URL=]SECONDS",
                   help="read --scrape targets only every SECONDS (a whole number of --interval ticks, rounded) "
                        "instead of every tick: SECONDS alone for every target, URL=SECONDS (the URL as given to "
                        "--scrape) for one; repeatable, a URL's own figure wins. The ticks between store nothing "
                        "of the target (its series have one point per read, as in Prometheus) and keep its last "
                        "read's collector_up; a counter's rate is unchanged, its resolution is SECONDS "
                        "(default: every tick)")
    p.add_argument("--otlp-listen", default="off", metavar="HOST:PORT",
                   help="receive OpenTelemetry over OTLP/HTTP here (POST /v1/traces and /v1/metrics, protobuf or "
                        "JSON, gzip accepted), e.g. 127.0.0.1:4318: spans and histograms that carry a pipeline "
                        "stage become the stage-duration series (docs/otlp.md). Default off. Loopback only "
                        "unless --otlp-allow-remote (the receiver has no authentication)")
    p.add_argument("--otlp-allow-remote", action="store_true",
                   help="allow --otlp-listen on a non-loopback address (anyone who reaches it can send data)")
    p.add_argument("--otlp-max-body-mb", type=float, default=4.0, metavar="MB",
                   help="largest OTLP request body, as sent and once decompressed (default 4; larger: 413)")
    p.add_argument("--otlp-max-items", type=int, default=50_000, metavar="N",
                   help="spans + data points taken between two ticks (default 50000); the rest are dropped and "
                        "counted in triscope_otlp_dropped_total, later requests in that tick get 429")
    p.add_argument("--budget-total-samples", type=int, default=None, metavar="N",
                   help="samples a tick that every sender together may add: OTLP senders and --scrape targets "
                        "alike (default 4096, or the budget file's total_samples). A series costs what it stores "
                        "every tick: a histogram its bounds + 3 (17 for 14 bounds, 67 for OTLP's maximum of 64), "
                        "a counter or a scraped sample 1. Beyond it new series are refused (counted in "
                        "triscope_budget_refused_series_total, logged once a minute); series already kept go on. "
                        "Each sample a tick is ~1.7 MB a day of SQLite: 4096 fill ~7 GB a day (docs/otlp.md)")
    p.add_argument("--budget-sender-samples", type=int, default=None, metavar="N",
                   help="samples a tick one sender may add (default 2048, or the budget file's sender_samples): "
                        "an OTLP sender is its service.name and peer address, a scrape target its URL")
    p.add_argument("--budget-file", default=None, metavar="FILE",
                   help="the budget as YAML: total_samples, sender_samples, idle (how long an absent scraped "
                        "series keeps its share, default 10m) and senders (a sender's own figure, by scrape URL, "
                        "OTLP service.name, or service.name@address); the flags above override it (docs/otlp.md)")
    p.add_argument("--spool", default=None, metavar="DIR",
                   help="the spool's root: ticks wait under DIR/<node>/db-<id>/ while their database is "
                        "unreachable, and are replayed only into that database (default $TRISCOPE_SPOOL_DIR, "
                        "else /var/lib/triscope/spool as root, else $XDG_STATE_HOME/triscope/spool)")
    p.add_argument("--spool-max-mb", type=float, default=256, help="spool size bound; beyond it the oldest "
                   "ticks are dropped and counted (default 256)")
    p.add_argument("--no-ebpf", action="store_true", help="do not load the eBPF probes (procfs fallbacks only)")
    p.add_argument("--no-waitfor", action="store_true",
                   help="do not trace what the workloads' threads wait on (the sched_switch/sched_waking probes; "
                        "the verdict then decides on the older symptoms and says the evidence is missing)")
    p.add_argument("--no-cuda-probes", action="store_true",
                   help="do not put uprobes on the CUDA driver's sync and copy calls (which thread drives each GPU, "
                        "time spinning in a sync, pageable vs pinned copies)")
    p.add_argument("--cuda-launch-probe", action="store_true",
                   help="also probe every kernel launch (off by default: ~1 us or more per launch, "
                        "see 'python -m bench --only cuda_uprobes')")
    p.add_argument("--no-nvml", action="store_true", help="do not start the NVML (NVIDIA GPU) collector")
    p.add_argument("--no-npu", action="store_true", help="do not start the npu-smi (Ascend NPU) collector")
    p.add_argument("--npu-smi", metavar="PATH", help="npu-smi executable (default: found on PATH)")
    p.add_argument("--no-workloads", action="store_true",
                   help="do not attribute accelerators to workloads (which pod, container or unit uses each GPU/NPU, "
                        "and the per-workload host evidence: CPU, busiest thread, run-queue wait, cgroup CPU pressure)")
    p.add_argument("--pod-resources-socket", metavar="PATH", default="/var/lib/kubelet/pod-resources/kubelet.sock",
                   help="the kubelet's pod-resources socket, read every 30 s to name the pod and container given each "
                        "device (default /var/lib/kubelet/pod-resources/kubelet.sock; absent off Kubernetes, which is "
                        "fine: workloads are then named by systemd unit or command)")
    p.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)
    p.add_argument("--sys", default="/sys", help=argparse.SUPPRESS)
    p.add_argument("--no-migrate", action="store_true", help="do not upgrade the schema at start")
    p.add_argument("--huge-pages", action="store_true",
                   help="put the agent's memory on transparent huge pages: the dense parts of its heap and, in "
                        "'triscope agent', the interpreter's code and the Python objects, for which the agent starts "
                        "itself again once (same PID) with PYTHONMALLOC=malloc and glibc's malloc on huge pages. "
                        "Off by default: it changes the process (perf/gdb cannot name the interpreter's C "
                        "functions, 2-4 MB more memory) for fewer pages touched per tick, which matters only "
                        "where the host ages guest memory (docs/ebpf.md)")
    p.add_argument("--no-huge-pages", action="store_true", help=argparse.SUPPRESS)   # the default now
    p.add_argument("--no-retention", action="store_true",
                   help="do not run the hourly retention job (in a fleet, one maintenance job does it for all)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "agent", help="run the node agent (collectors -> store + /metrics)",
        description="Run the node agent: every tick, all collectors (eBPF probes, NVML, npu-smi, procfs/sysfs, "
        "scraped application metrics, and with --otlp-listen the stage spans and histograms sent over "
        "OpenTelemetry) are read on one clock; the tick goes to the store in one batch and to "
        "the Prometheus exporter. If the database is unreachable, ticks wait in an on-disk spool and are "
        "written back in order when it returns.",
    )
    add_db_option(p)
    add_agent_options(p)
    p.add_argument("--duration", type=float, default=0.0, metavar="SECONDS",
                   help="stop after this many seconds (0 = run until interrupted; default 0)")
    p.add_argument("--listen", default="127.0.0.1:9464", metavar="HOST:PORT",
                   help="where /metrics is served (default 127.0.0.1:9464; 'off' to disable)")
    add_web_config_option(p, "/metrics (TLS and basic auth)")
    p.set_defaults(func=cmd_agent, default_verbosity=0)


def build_config(args: argparse.Namespace, listen: tuple[str, int] | None):
    from triscope.agent.collectors.scrape import parse_scrape_url
    from triscope.agent.registry import AgentOptions
    from triscope.agent.runtime import AgentConfig, default_spool_dir
    from triscope.core.errors import UserError

    if args.interval <= 0:
        raise UserError(f"--interval must be > 0 (got {args.interval})")
    if args.write_every < 0:
        raise UserError(f"--write-every must be >= 0 seconds (got {args.write_every})")
    if not args.spool_max_mb >= 1 or args.spool_max_mb == float("inf"):
        raise UserError(f"--spool-max-mb must be a size of at least 1 MB (got {args.spool_max_mb:g}): the spool "
                        "keeps ticks while the database is unreachable, the oldest dropped past it")
    from triscope.core.names import node_name_problem

    problem = node_name_problem(args.node)
    if problem:
        raise UserError(f"--node: {problem}")
    if not args.scrape_timeout > 0 or args.scrape_timeout > 60:
        raise UserError(f"--scrape-timeout must be between 0 and 60 seconds (got {args.scrape_timeout})")
    for url in args.scrape:
        try:
            parse_scrape_url(url)
        except ValueError as e:
            raise UserError(f"--scrape {url!r}: {e}") from None
    scrape_every = scrape_intervals(args.scrape_interval, args.scrape, args.interval)
    opts = AgentOptions(proc=args.proc, sys=args.sys, scrape=list(args.scrape), ebpf=not args.no_ebpf,
                        nvml=not args.no_nvml, npu=not args.no_npu, npu_smi=args.npu_smi,
                        workloads=not args.no_workloads, pod_resources_socket=args.pod_resources_socket,
                        waitfor=not args.no_waitfor, cuda_probes=not args.no_cuda_probes,
                        cuda_launch_probe=bool(args.cuda_launch_probe),
                        scrape_timeout=args.scrape_timeout, interval=args.interval, scrape_every=scrape_every)
    return AgentConfig(db_url=db_url(args), node=args.node, interval=args.interval, write_every=args.write_every,
                       listen=listen, otlp=otlp_options(args), budget=budget_options(args),
                       spool_dir=args.spool or default_spool_dir(), spool_max_bytes=int(args.spool_max_mb * (1 << 20)),
                       migrate=not args.no_migrate, retention=not args.no_retention,
                       huge_pages=bool(args.huge_pages), options=opts)


def scrape_intervals(given: list[str], urls: list[str], interval: float) -> dict[str, int]:
    """--scrape-interval [URL=]SECONDS -> ticks between reads for each --scrape URL that is not read
    every tick; a UserError names a bad figure or a URL that is no --scrape target."""
    from triscope.core.errors import UserError

    default: float | None = None
    own: dict[str, float] = {}
    for item in given:
        url, eq, text = item.rpartition("=")
        try:
            seconds = float(text)
        except ValueError:
            seconds = float("nan")
        if not 0 < seconds <= 86_400:
            raise UserError(f"--scrape-interval {item!r}: expected SECONDS or URL=SECONDS, SECONDS a number from "
                            f"{interval:g} (the tick) to 86400")
        if not eq:
            default = seconds
        elif url not in urls:
            raise UserError(f"--scrape-interval {item!r}: {url!r} is no --scrape target (give the URL as on --scrape)")
        else:
            own[url] = seconds
    out: dict[str, int] = {}
    for url in urls:
        want = own.get(url, default)
        if want is None:
            continue
        if want < interval:
            raise UserError(f"--scrape-interval {want:g} s for {url}: shorter than --interval ({interval:g} s); "
                            "a target is read at most once a tick")
        ticks = max(1, round(want / interval))
        if ticks > 1:
            out[url] = ticks
    return out


def budget_options(args: argparse.Namespace):
    """The sample budget: the defaults, the --budget-file over them, the --budget-* flags over both."""
    import dataclasses

    from triscope.agent.budget import BudgetOptions
    from triscope.core.errors import UserError

    opts = BudgetOptions()
    if args.budget_file:   # pydantic only when asked
        from triscope.agent.budget_file import load
        from triscope.core.configfile import ConfigFileError

        try:
            opts = load(args.budget_file)
        except ConfigFileError as e:
            raise UserError(f"--budget-file: {e}") from None
    for flag, key in (("budget_total_samples", "total_samples"), ("budget_sender_samples", "sender_samples")):
        value = getattr(args, flag)
        if value is None:
            continue
        if not 0 <= value <= 10_000_000:
            raise UserError(f"--{flag.replace('_', '-')} must be a number of samples from 0 to 10000000 (got {value})")
        opts = dataclasses.replace(opts, **{key: value})
    return opts


def otlp_options(args: argparse.Namespace):
    """The OTLP receiver's options from --otlp-*, None when off; a non-loopback address is refused
    without --otlp-allow-remote."""
    from triscope.core.errors import UserError

    if args.otlp_listen == "off":
        return None
    from triscope.agent.otlp import OtlpOptions
    from triscope.web.loopback import is_loopback

    addr = parse_hostport(args.otlp_listen)
    if not is_loopback(addr[0]) and not args.otlp_allow_remote:
        raise UserError(f"--otlp-listen {args.otlp_listen}: refusing a non-loopback address without "
                        "--otlp-allow-remote (the receiver has no authentication)")
    if not 0 < args.otlp_max_body_mb <= 256:
        raise UserError(f"--otlp-max-body-mb must be between 0 and 256 (got {args.otlp_max_body_mb})")
    if args.otlp_max_items < 1:
        raise UserError(f"--otlp-max-items must be at least 1 (got {args.otlp_max_items})")
    return OtlpOptions(listen=addr, max_body=int(args.otlp_max_body_mb * (1 << 20)), max_items=args.otlp_max_items,
                       proc=args.proc)


def _compact_heap(args: argparse.Namespace) -> str | None:
    """First thing the agent does, before its heavy imports: start itself again with the Python
    objects on glibc's huge-page heap (agent/hugepages.py), or say why not.  Returns the log line."""
    if not getattr(args, "huge_pages", False):
        return None
    from triscope.agent import hugepages

    if hugepages.after_heap_reexec():
        return "Python objects on glibc's heap (PYTHONMALLOC=malloc, glibc.malloc.hugetlb=1)"
    # returns only when the agent was not started again (never from main(argv) inside another program)
    why = (hugepages.reexec_for_heap() if getattr(args, "own_command_line", False)
           else "called from another program, not started from the command line")
    return f"Python objects not moved onto the huge-page heap ({why})"


def cmd_agent(args: argparse.Namespace) -> int:
    import logging

    heap_note = _compact_heap(args)
    from triscope.agent.runtime import Agent
    from triscope.core.errors import UserError

    listen = None if args.listen == "off" else parse_hostport(args.listen)
    if args.duration < 0:
        raise UserError("--duration must be >= 0")
    cfg = build_config(args, listen)
    if args.web_config_file:   # pydantic and the web config's models only when asked (~4 MB of RSS)
        from triscope.web.config import load_for_cli

        cfg.web = load_for_cli(args.web_config_file)   # a bad file is one line, before the store is touched
    logging.getLogger("triscope.agent").setLevel(logging.INFO)
    if cfg.huge_pages:   # before the agent starts any thread: the code is swapped while nothing else runs
        from triscope.agent import hugepages

        logging.getLogger("triscope.agent").info("huge pages: %s", heap_note)
        try:
            logging.getLogger("triscope.agent").info("%s", hugepages.describe(hugepages.remap_text(), None))
        except Exception as e:  # noqa: BLE001 - an optimisation never stops the agent
            logging.getLogger("triscope.agent").warning("huge pages for the interpreter's code: %s", e)
    agent = Agent(cfg)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    # set, not inherited: a shell that started the agent in the background (``&`` in a script,
    # nohup) leaves SIGINT ignored, and Python then never turns it into KeyboardInterrupt
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    try:
        agent.start_exporter()
    except OSError as e:
        raise UserError(f"cannot listen on {args.listen}: {e.strerror or e}") from None
    try:
        agent.start_otlp()
    except OSError as e:
        raise UserError(f"cannot listen on {args.otlp_listen} for OTLP: {e.strerror or e}") from None
    if listen:
        scheme = cfg.web.scheme if cfg.web is not None else "http"
        auth = " (basic auth)" if cfg.web is not None and cfg.web.auth else ""
        print(f"triscope agent: node {cfg.node}, /metrics on {scheme}://{listen[0]}:{listen[1]}/metrics{auth}, "
              f"store {agent.store.engine.url.render_as_string(hide_password=True)}", flush=True)
    if agent.otlp is not None:
        host, port = agent.otlp.address
        print(f"triscope agent: OTLP/HTTP on http://{host}:{port}/v1/traces and /v1/metrics", flush=True)
    agent.cfg.listen = None  # already serving
    try:
        agent.run(args.duration)
    except KeyboardInterrupt:
        agent.stop()
    return 0
