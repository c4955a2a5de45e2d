"""The ``triscope`` command line.

Each subcommand lives in its own module under ``triscope.commands`` and exposes
``register(subparsers)``; the handler it sets with ``set_defaults(func=...)`` returns an exit code.
Errors meant for the user are raised as ``UserError`` (or ``triscope.store.db.StoreError``) and printed as
one line, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys

from triscope.core.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triscope",
        description="Find and fix GPU / I/O / NPU coordination mismatch on AI inference nodes.",
        epilog="Database: --db URL or TRISCOPE_DB_URL; default a SQLite file ./triscope.db. "
        "Run 'triscope COMMAND --help' for each command.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # each command module imports its part only inside its handler: `triscope --help` stays light
    from triscope.commands import agent, dashboard, db, doctor, query, rca, remediate, run, slo, trace

    for mod in (run, agent, dashboard, remediate, db, query, rca, slo, doctor, trace):
        mod.register(sub)
    return parser


def setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    from triscope.core.errors import (
        UserError as _UserError,  # the one class, also under "python -m triscope.cli"
    )
    from triscope.store.db import StoreError

    parser = build_parser()
    # the process may start itself again with its own command line (triscope agent): only when
    # these arguments are that command line's, not a wrapper's that called main()
    orig = getattr(sys, "orig_argv", [])
    own_command_line = argv is None and len(sys.argv) >= 1 and orig[len(orig) - len(sys.argv) + 1:] == sys.argv[1:]
    argv = list(sys.argv[1:] if argv is None else argv)
    # -v / -vv / --verbose work before or after the subcommand
    verbosity = 0
    rest: list[str] = []
    for i, a in enumerate(argv):
        if a == "--":
            rest.extend(argv[i:])
            break
        if a == "--verbose" or (a.startswith("-v") and set(a[1:]) == {"v"}):
            verbosity += 1 if a == "--verbose" else len(a) - 1
        else:
            rest.append(a)
    args = parser.parse_args(rest)
    args.verbose = max(args.verbose, verbosity)
    args.own_command_line = own_command_line
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    setup_logging(max(args.verbose, getattr(args, "default_verbosity", 0)))
    try:
        rc = args.func(args)
    except (_UserError, StoreError) as e:
        print(f"triscope {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `triscope query ... | head`: the reader left, which is fine
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return int(rc or 0)


__all__ = ["UserError", "build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
