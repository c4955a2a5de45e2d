"""Helpers shared by the subcommands: the --db option, host:port parsing, time arguments."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from triscope.core import timeparse
from triscope.store.db import ENV_DB_URL, default_url

if TYPE_CHECKING:
    from triscope.store.reader import StoreReader

TIME_HELP = timeparse.HELP


def add_db_option(p: argparse.ArgumentParser) -> None:
    """``--db URL``; every command that reads a store also takes relative times written without
    ``=`` (``--since -2h``: see ``timeparse.allow_relative_times``)."""
    timeparse.allow_relative_times(p)
    p.add_argument("--db", metavar="URL", default=None,
                   help=f"database URL (sqlite:///FILE or postgresql://USER@HOST/DB); default ${ENV_DB_URL} "
                        "or ./triscope.db")


def add_web_config_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--web.config.file FILE`` (``triscope.web.config``, loaded by the command before it listens)."""
    p.add_argument("--web.config.file", dest="web_config_file", metavar="FILE", default=None,
                   help=f"TLS (and, where said, basic auth) for {what}, in the Prometheus exporter-toolkit "
                        "format: tls_server_config, basic_auth_users, http_server_config (docs/security.md); "
                        "default: plain HTTP")


def db_url(args: argparse.Namespace) -> str:
    return args.db or default_url()


def parse_hostport(value: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    from triscope.core.errors import UserError

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


def parse_time(value: str, now: float | None = None, option: str | None = None) -> float:
    """A time argument (``triscope.core.timeparse``: ``now``, ``2h`` / ``-2h`` ago, ISO 8601 with naive =
    UTC, epoch seconds) as epoch seconds; a bad one is a ``UserError`` naming ``option``."""
    from triscope.core.errors import UserError

    try:
        return timeparse.parse_time(value, now)
    except timeparse.TimeParseError as e:
        raise UserError(f"{option}: {e}" if option else str(e)) from None


def known_nodes(store: StoreReader, most: int = 10) -> str:
    """The stored node names for an error message: a few, each cut short, and how many in all."""
    from triscope.core.names import shorten

    names = sorted(n.name for n in store.nodes())
    text = ", ".join(shorten(n, 60) for n in names[:most]) or "none"
    return text + (f", ... ({len(names)} in all)" if len(names) > most else "")


def fmt_ts(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
