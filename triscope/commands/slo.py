"""``triscope slo``: check an SLO file, write its Prometheus rules, print SLO status from the store."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from triscope.commands.common import TIME_HELP, add_db_option, db_url, fmt_ts, parse_time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "slo", help="SLOs: validate a spec, write Prometheus rules, print status (burn rates, budget)",
        description="SLO files use Sloth's prometheus/v1 spec (see docs/analysis.md); the shipped example "
        "is deploy/slo.example.yaml.",
    )
    ssub = p.add_subparsers(dest="slo_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    c = ssub.add_parser("check", help="validate an SLO file (prints FILE:LINE: reason on errors)",
                        description="Validate an SLO file and list its SLOs.")
    c.add_argument("file", type=Path, help="SLO file (Sloth prometheus/v1 YAML)")
    c.set_defaults(func=cmd_check)

    r = ssub.add_parser(
        "rules", help="write the Prometheus recording and alerting rules of an SLO file",
        description="Write Prometheus rules equivalent to triscope's SLO evaluation: error ratios over "
        "5m/30m/1h/6h/1d/3d and the period (ratio of sums), budget metadata, and multi-window "
        "multi-burn-rate page/ticket alerts (SRE workbook). Check them with 'promtool check rules'.",
    )
    r.add_argument("file", type=Path, help="SLO file (Sloth prometheus/v1 YAML)")
    r.add_argument("-o", "--output", type=Path, help="write to this file instead of standard output")
    r.add_argument("--format", choices=("rules", "prometheusrule"), default="rules",
                   help="rules: a plain Prometheus rule file (default); prometheusrule: a "
                   "monitoring.coreos.com/v1 PrometheusRule for the Prometheus Operator")
    r.add_argument("--include", type=Path, action="append", default=[], metavar="RULE_FILE",
                   help="prometheusrule: put this plain rule file's groups first (repeatable), e.g. "
                   "deploy/prometheus/triscope-rules.yaml")
    r.add_argument("--name", default="triscope", help="prometheusrule: metadata.name (default triscope)")
    r.add_argument("--namespace", help="prometheusrule: metadata.namespace (default none: kustomize sets it)")
    r.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="prometheusrule: metadata label (repeatable; replaces the defaults "
                   "app.kubernetes.io/name=triscope, release=kube-prometheus-stack)")
    r.set_defaults(func=cmd_rules)

    s = ssub.add_parser(
        "status", help="print each SLO's SLI, error budget, burn rates and alert state from the store",
        description="Evaluate SLOs over stored series: SLI and error budget remaining over the SLO period, "
        "burn rates over 5m..3d, data coverage, and page/ticket status (multi-window multi-burn-rate). "
        "A window with too little of it covered by data says 'not enough data yet' and decides no alert "
        "(the minimum coverage per window: docs/analysis.md).",
    )
    add_db_option(s)   # also lets --at -2h through
    s.add_argument("--slo", type=Path, default=None, metavar="FILE",
                   help="SLO file (default $TRISCOPE_SLO_FILE or deploy/slo.example.yaml)")
    s.add_argument("--node", help="only series of this node (default: all nodes)")
    s.add_argument("--at", default="now", metavar="TIME", help=f"evaluate at this time (default now): {TIME_HELP}")
    s.add_argument("--json", action="store_true", help="one JSON object per SLO")
    s.set_defaults(func=cmd_status)


def _load(path: Path | None) -> tuple[Path, list[Any]]:
    from triscope.analysis.slo import SLOSpecError, default_slo_file, load_slo_file
    from triscope.core.errors import UserError

    path = path or default_slo_file()
    if path is None:
        raise UserError("no SLO file: pass --slo FILE or set TRISCOPE_SLO_FILE")
    try:
        return path, load_slo_file(path)
    except SLOSpecError as e:
        raise UserError(str(e)) from None


def cmd_check(args: argparse.Namespace) -> int:
    path, slos = _load(args.file)
    for s in slos:
        print(f"{s.source}: {s.id}: objective {s.objective:g}% over {s.period}, "
              f"{len(s.error_query.terms)} error term(s), {len(s.total_query.terms)} total term(s)"
              + (f", alert {s.alerting.name}" if s.alerting else ""))
    print(f"{path}: OK, {len(slos)} SLO(s)")
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    from triscope.analysis.slo import rules_yaml
    from triscope.core.errors import UserError

    path, slos = _load(args.file)
    if args.format == "prometheusrule":
        text = _prometheusrule(args, path, slos)
    else:
        if args.include or args.label or args.namespace:
            raise UserError("--include, --label and --namespace go with --format prometheusrule")
        text = rules_yaml(slos, path.name)
    if args.output:
        try:
            args.output.write_text(text)
        except OSError as e:
            raise UserError(f"cannot write {args.output}: {e.strerror or e}") from None
        print(f"wrote {args.output} ({sum(1 for line in text.splitlines() if line.lstrip().startswith(('- record:', '- alert:')))} rules)",
              file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _prometheusrule(args: argparse.Namespace, path: Path, slos: list[Any]) -> str:
    """The PrometheusRule text; its header names the sources and repeats the command line, so whoever
    opens the generated file knows what to edit and how to regenerate it."""
    import shlex

    import yaml

    from triscope.analysis.slo import prometheusrule_yaml
    from triscope.core.errors import UserError

    groups: list[dict[str, Any]] = []
    for inc in args.include:
        try:
            doc = yaml.safe_load(inc.read_text())
        except OSError as e:
            raise UserError(f"cannot read {inc}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise UserError(f"{inc}: not YAML: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
            raise UserError(f"{inc}: not a Prometheus rule file (no 'groups' list)")
        groups.extend(doc["groups"])
    labels = None
    if args.label:
        labels = {}
        for kv in args.label:
            k, sep, v = kv.partition("=")
            if not sep or not k:
                raise UserError(f"--label {kv!r}: expected KEY=VALUE")
            labels[k] = v
    cmd = ["triscope", "slo", "rules", str(args.file), "--format", "prometheusrule"]
    cmd += [a for inc in args.include for a in ("--include", str(inc))]
    if args.name != "triscope":
        cmd += ["--name", args.name]
    if args.namespace:
        cmd += ["--namespace", args.namespace]
    cmd += [a for kv in args.label for a in ("--label", kv)]
    if args.output:
        cmd += ["-o", str(args.output)]
    sources = ", ".join([str(args.file), *map(str, args.include)])
    header = (f"# Generated from {sources}: do not edit, edit those and regenerate with\n"
              f"#   {shlex.join(cmd)}\n"
              "# (a test fails while this file differs from what that command writes).\n")
    try:
        return prometheusrule_yaml(slos, name=args.name, namespace=args.namespace, labels=labels,
                                   extra_groups=groups, header=header)
    except ValueError as e:
        raise UserError(str(e)) from None


def _pct(x: float | None, nd: int = 3) -> str:
    return "no data" if x is None else f"{x * 100:.{nd}f}%"


def _burn(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _window_burn(w: Any) -> str:
    """A window's burn rate, or why there is none: ``-`` (no traffic) or ``not-enough-data``."""
    return _burn(w.burn_rate) if w.burn_rate is not None or w.enough_data else "not-enough-data"


def cmd_status(args: argparse.Namespace) -> int:
    from triscope.analysis.slo import NOT_ENOUGH_DATA, coverage_pct, evaluate
    from triscope.store import Store

    path, slos = _load(args.slo)
    now = parse_time(args.at, None, "--at")
    st = Store.open(db_url(args))
    st.require_schema()
    for slo in slos:
        status = evaluate(st, slo, now, node=args.node)
        if args.json:
            print(json.dumps(status.as_dict()))
        else:
            print(f"{slo.service}/{slo.name}  objective {slo.objective:g}% over {slo.period}  "
                  f"[{status.status.upper()}]  at {fmt_ts(now)}")
            if status.budget_note:
                print(f"  SLI and error budget: {status.budget_note}")
            else:
                print(f"  SLI {_pct(status.sli)}   error budget remaining {_pct(status.budget_remaining, 1)}   "
                      f"coverage {coverage_pct(status.coverage)}")
            print("  burn   " + "  ".join(f"{w}={_window_burn(f)}" for w, f in status.windows.items()))
            print("  cover  " + "  ".join(f"{w}={coverage_pct(f.coverage).replace(' ', '')}"
                                          for w, f in status.windows.items()))
            for a in status.alerts:
                head = f"  {a.severity:<6} {a.long_window}/{a.short_window} > {a.factor:g}x: "
                if not a.enough_data:
                    print(f"{head}{NOT_ENOUGH_DATA} ({coverage_pct(a.long_coverage)} of the {a.long_window} window covered)")
                else:
                    print(f"{head}{'FIRING' if a.firing else 'ok'} ({_burn(a.long_burn)} / {_burn(a.short_burn)})")
    st.close()
    return 0
