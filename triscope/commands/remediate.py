"""``triscope remediate``: the remediation engine alone, ``check`` a policy, ``reset-breaker``, ``audit``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading

from triscope.commands.common import (
    add_db_option,
    add_web_config_option,
    db_url,
    fmt_ts,
    parse_hostport,
    parse_time,
)
from triscope.commands.stopping import bound_the_stop
from triscope.web.loopback import is_loopback

TOKEN_ENV = "TRISCOPE_WEBHOOK_TOKEN"
DEFAULT_LISTEN = "127.0.0.1:9095"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "remediate", help="run the remediation engine (policies -> safety rails -> Kubernetes actions)",
        description="Run the remediation engine: evaluate the policy's stored-data triggers on a schedule and "
        "take Alertmanager alerts on POST /api/v1/alerts (webhook v4, bearer token), pass every trigger through "
        "the safety rails (dry-run, cooldowns, rate limits, caps, circuit breaker, namespace allow-list, leader "
        "election) and act: rolling restart, dependency fallback, rescheduling, or a fixed command. Every "
        "decision goes to the audit table. Sub-commands: check, reset-breaker, audit.",
        epilog="Examples:  triscope remediate --policy deploy/policy.example.yaml --dry-run --token-file token\n"
               "           triscope remediate check deploy/policy.example.yaml\n"
               "           triscope remediate reset-breaker --db sqlite:///triscope.db",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_db_option(p)
    p.add_argument("--policy", metavar="FILE", help="the policy file (YAML; see deploy/policy.example.yaml)")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where the webhook listens (default {DEFAULT_LISTEN}; 'off' for stored-data triggers only)")
    p.add_argument("--dry-run", action="store_true", help="decide and audit everything, change nothing")
    p.add_argument("--token-file", metavar="FILE",
                   help=f"file holding the webhook's bearer token (else ${TOKEN_ENV})")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="run the webhook without a token (refused unless it listens on loopback)")
    p.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES",
                   help="largest webhook body accepted (default 1 MiB; larger -> 400)")
    add_web_config_option(p, "the webhook (TLS only: basic_auth_users is refused, the bearer token is its auth)")
    p.set_defaults(func=cmd_run)
    rsub = p.add_subparsers(dest="remediate_command", metavar="ACTION")

    c = rsub.add_parser("check", help="validate a policy file without running it",
                        description="Parse and validate a policy; print its rules, or FILE:LINE: reason and exit 1.")
    c.add_argument("file", metavar="FILE")
    c.set_defaults(func=cmd_check)

    r = rsub.add_parser("reset-breaker", help="close the circuit breaker (stale triggers are not replayed)",
                        description="Close the remediation circuit breaker and start a fresh breaker window: "
                        "decisions taken before the reset no longer count towards it (in running engines too). "
                        "Triggers that started before the reset are suppressed as stale, so nothing queued up "
                        "while it was open is replayed.")
    add_db_option(r)
    r.add_argument("--by", default=os.environ.get("USER", "operator"), help="who resets it (recorded)")
    r.set_defaults(func=cmd_reset_breaker)

    a = rsub.add_parser("audit", help="print the remediation audit log",
                        description="Print audit rows (newest first): every decision with its rule, trigger, "
                        "target, outcome, rail and the API's answer.")
    add_db_option(a)
    a.add_argument("--since", default="-24h", help="start (ISO 8601, -2h, now; default -24h)")
    a.add_argument("--until", default="now", help="end (default now)")
    a.add_argument("--rule", help="only this rule")
    a.add_argument("--outcome", choices=["acted", "dry_run", "suppressed", "failed", "in_progress"])
    a.add_argument("--limit", type=int, default=100)
    a.add_argument("--json", action="store_true", help="one JSON object per line")
    a.set_defaults(func=cmd_audit)


def _open_store(url: str):
    from sqlalchemy import inspect

    from triscope.core.errors import UserError
    from triscope.store import Store

    st = Store.open(url)
    st.require_schema()
    missing = [t for t in ("remediation_audit", "remediation_inbox") if not inspect(st.engine).has_table(t)]
    if missing:
        st.close()
        raise UserError(f"database {url} has no table {missing[0]} (its schema is older than this triscope): "
                        f"run 'triscope db upgrade --db {url}'")
    return st


def cmd_check(args: argparse.Namespace) -> int:
    from triscope.remediation.filefallback import KnobsFileParams
    from triscope.remediation.policy import PolicyError, load_policy

    try:
        pol = load_policy(args.file)
    except PolicyError as e:
        print(f"{e}")   # a linter: its verdict is its output
        return 1
    s = pol.settings
    print(f"{args.file}: OK, {len(pol.rules)} rule(s); namespaces {list(s.namespaces)}; "
          f"{'nodes ' + s.describe_nodes() + '; ' if s.nodes_bounded else ''}"
          f"kubernetes {s.kubernetes.mode}; dry_run {s.dry_run}; leader election {s.leader_election.enabled}")
    for r in pol.rules:
        tgt = ", ".join(f"{k}={v.literal or ('from:workload' if v.from_workload else 'label:' + str(v.label))}"
                        for k, v in r.target.items())
        if isinstance(r.params, KnobsFileParams):
            tgt += f", file={r.params.file.dir}/NAME.yaml"
        print(f"  line {r.line}: {r.name}: {r.trigger.describe()} -> {r.action} [{tgt}] cooldown {r.cooldown_s:g}s, "
              f"max {r.max_actions}/{r.per_s:g}s{' (dry-run)' if r.dry_run else ''}")
    return 0


def cmd_reset_breaker(args: argparse.Namespace) -> int:
    from triscope.store import audit

    st = _open_store(db_url(args))
    try:
        before = audit.breaker_state(st)
        after = audit.reset_breaker(st, by=args.by)
    finally:
        st.close()
    was = f"was open since {fmt_ts(before.opened_at)} ({before.reason})" if before.is_open and before.opened_at else "was closed"
    print(f"circuit breaker closed by {after.reset_by} at {fmt_ts(after.reset_at or 0)}; it {was}. "
          "Decisions before now no longer count towards it; triggers that started before now will not be replayed.")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from triscope.store import audit

    st = _open_store(db_url(args))
    try:
        rows = audit.audit_log(st, since=parse_time(args.since), until=parse_time(args.until), rule=args.rule,
                               outcome=args.outcome, limit=args.limit)
    finally:
        st.close()
    for r in rows:
        if args.json:
            print(json.dumps(r.as_dict(), default=str))
        else:
            rail = f" [{r.rail}]" if r.rail else ""
            print(f"{fmt_ts(r.ts)} {r.outcome}{rail} {r.rule} {r.action} {r.target or '-'}: {r.reason}")
    if not rows and not args.json:
        print("no audit rows in that window")
    return 0


def _read_token(args: argparse.Namespace) -> str | None:
    """The webhook token from --token-file or the environment, normalised (surrounding whitespace
    dropped) and checked: empty, short or with whitespace inside → one line, before anything starts."""
    from triscope.core.errors import UserError
    from triscope.remediation.webhook import normalise_token

    if args.token_file:
        try:
            with open(args.token_file) as f:
                raw: str | None = f.read(4096)
        except OSError as e:
            raise UserError(f"cannot read --token-file {args.token_file}: {e.strerror}") from None
        where = f"--token-file {args.token_file}"
    else:
        raw = os.environ.get(TOKEN_ENV)
        if raw is not None and not raw.strip():
            raw = None
        where = f"${TOKEN_ENV}"
    try:
        return normalise_token(raw, where)
    except ValueError as e:
        raise UserError(str(e)) from None


STOP_BOUND_S = 20.0   # the webhook (5 s), the scheduler's running job and the actions' drain (10 s)


def cmd_run(args: argparse.Namespace) -> int:
    from triscope.core.errors import UserError
    from triscope.remediation.kube.errors import KubeError
    from triscope.remediation.policy import PolicyError, load_policy
    from triscope.remediation.service import start

    if not args.policy:
        raise UserError("--policy FILE is required (see deploy/policy.example.yaml)")
    try:
        policy = load_policy(args.policy)
    except PolicyError as e:
        raise UserError(f"policy refused: {e}") from None
    listen = None if args.listen == "off" else parse_hostport(args.listen)
    token = _read_token(args)
    if listen is not None and token is None:
        if not args.insecure_no_auth:
            raise UserError(f"no webhook token: use --token-file FILE or ${TOKEN_ENV} "
                            "(or --insecure-no-auth on a loopback address)")
        if not is_loopback(listen[0]):
            raise UserError(f"--insecure-no-auth is only allowed on loopback, not {listen[0]}")
    if args.max_body < 1024:
        raise UserError("--max-body must be at least 1024 bytes")
    from triscope.web.config import load_for_cli

    web = load_for_cli(args.web_config_file, allow_auth=False)   # the bearer token is the webhook's auth
    st = _open_store(db_url(args))
    try:
        handle = start(st, policy, listen=listen, dry_run=args.dry_run, token=token, owns_store=True,
                       max_body=args.max_body, web=web)
    except KubeError as e:
        st.close()
        raise UserError(str(e)) from None
    except OSError as e:
        st.close()
        raise UserError(f"cannot listen on {args.listen}: {e.strerror}") from None
    eng = handle.engine
    print(f"remediation engine {eng.engine_id}: {len(policy.rules)} rule(s) from {args.policy}"
          f"{' (dry-run)' if eng.dry_run else ''}; kubernetes: {eng.kube.describe if eng.kube else 'none'}", flush=True)
    rerun, undecided = eng.resumed
    if rerun or undecided:
        print(f"resumed after a stop: {rerun} action(s) left in progress re-run, {undecided} accepted trigger(s) "
              "decided", flush=True)
    if handle.url:
        print(f"webhook: POST {handle.url}/api/v1/alerts{' (no auth)' if token is None else ' (bearer token)'}",
              flush=True)
    done = threading.Event()

    def _stop(signum, frame):
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        # a timed wait: a signal the kernel hands to another thread only sets a flag, and a main thread
        # blocked in an untimed wait would never look at it
        while not done.wait(1.0):
            pass
    finally:
        bound_the_stop("triscope remediate", STOP_BOUND_S)
        handle.stop()
    return 0
