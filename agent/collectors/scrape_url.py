"""Validation of --scrape URLs before anything starts (the scrape collector's own parser)."""

from __future__ import annotations


def validate_scrape_url(url: str) -> str | None:
    """None when fine, else what is wrong with it."""
    from agent.collectors.scrape import parse_scrape_url

    try:
        parse_scrape_url(url)
    except ValueError as e:
        return str(e)
    return None
