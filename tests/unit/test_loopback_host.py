"""``triscope.web.loopback.is_loopback``: the one check the dashboard, the remediation webhook and the
agent's OTLP receiver use before they serve without authentication."""

from __future__ import annotations

import pytest

from triscope.web.loopback import is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LocalHost.",
                                  "ip6-localhost", "ip6-loopback", "::ffff:127.0.0.1", " 127.0.0.1 "])
def test_loopback(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "", "10.1.2.3", "[10.1.2.3]", "::ffff:10.0.0.1",
                                  "dash.example.com", "localhost.example.com", "127.0.0.1.nip.io", "[::1", "[localhost]x"])
def test_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_every_part_uses_the_shared_check() -> None:
    from triscope.commands import remediate
    from triscope.dashboard import app

    assert app.is_loopback is is_loopback and remediate.is_loopback is is_loopback
