"""``triscope db upgrade`` and ``triscope db retention``."""

from __future__ import annotations

import argparse

from triscope.commands.common import add_db_option, db_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="database schema and maintenance",
                       description="Database schema (Alembic migrations) and maintenance.")
    dsub = p.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = dsub.add_parser("upgrade", help="create or upgrade the schema to the latest revision",
                         description="Apply Alembic migrations up to head (safe to run twice).")
    add_db_option(up)
    up.set_defaults(func=cmd_upgrade)
    ret = dsub.add_parser("retention", help="delete data older than the retention policy now",
                          description="Apply the retention policy once (the agent also runs it hourly).")
    add_db_option(ret)
    ret.add_argument("--raw-days", type=float, default=7, help="keep raw samples this many days (default 7)")
    ret.add_argument("--rollup-1m-days", type=float, default=90, help="keep 1-minute rollups (default 90)")
    ret.add_argument("--rollup-1h-days", type=float, default=730, help="keep hourly rollups (default 730)")
    ret.set_defaults(func=cmd_retention)


def cmd_upgrade(args: argparse.Namespace) -> int:
    from triscope.store.db import upgrade

    url = db_url(args)
    upgrade(url)
    print(f"schema is at the latest revision: {url}")
    return 0


def cmd_retention(args: argparse.Namespace) -> int:
    from triscope.store import Store
    from triscope.store.api import RetentionPolicy

    st = Store.open(db_url(args))
    st.require_schema()
    removed = st.apply_retention(RetentionPolicy(args.raw_days * 86400, args.rollup_1m_days * 86400,
                                                 args.rollup_1h_days * 86400))
    if removed.get("skipped_standby"):
        print("the database is a standby: retention runs on the leader (use a read-write URL)")
        return 0
    for table, n in removed.items():
        print(f"{table}: removed {n} rows")
    return 0
