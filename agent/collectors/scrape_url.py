"""Validation of --scrape URLs (kept apart so the CLI can check before anything starts)."""

from __future__ import annotations

from urllib.parse import urlparse


def validate_scrape_url(url: str) -> str | None:
    """None when fine, else what is wrong with it."""
    u = urlparse(url)
    if u.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not u.hostname:
        return "has no host"
    try:
        _ = u.port
    except ValueError:
        return "has an invalid port"
    return None
