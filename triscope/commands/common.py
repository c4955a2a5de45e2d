"""Helpers shared by the subcommands: the --db option, host:port parsing, time parsing."""

from __future__ import annotations

import argparse
import re
import time
from datetime import UTC, datetime

from store.db import ENV_DB_URL, default_url


def add_db_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", default=None,
                   help=f"database URL (sqlite:///FILE or postgresql://USER@HOST/DB); default ${ENV_DB_URL} "
                        "or ./triscope.db")


def db_url(args: argparse.Namespace) -> str:
    return args.db or default_url()


def parse_hostport(value: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    from triscope.cli import UserError

    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = default_host, value
    host = host.strip("[]") or default_host
    try:
        p = int(port)
    except ValueError:
        raise UserError(f"{value!r} is not HOST:PORT (port must be a number)") from None
    if not 0 <= p <= 65535:
        raise UserError(f"{value!r}: port {p} is out of range")
    return host, p


_REL = re.compile(r"^-(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: str, now: float | None = None) -> float:
    """``now``, relative (``-2h``, ``-30m``, ``-90s``, ``-7d``), epoch seconds, or ISO 8601."""
    from triscope.cli import UserError

    now = time.time() if now is None else now
    v = value.strip()
    if v == "now":
        return now
    m = _REL.match(v)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(v)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"cannot read time {value!r}: use ISO 8601 (2026-11-29T17:00:00Z), -2h, -30m or now") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def fmt_ts(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
