"""Text from outside (a scraped target's bytes, an HTTP reason phrase, an alert label) made safe
for one log line: control characters escaped, length bounded."""

from __future__ import annotations

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: object, limit: int = 300) -> str:
    """``text`` as one printable line: control and other non-printable characters escaped
    (``\\x1b``, ``\\n``, ``\\u200b``), cut to ``limit`` characters with an ellipsis."""
    s = str(text)
    if not s.isprintable():
        s = "".join(ch if ch.isprintable() else _ESCAPES.get(ch) or ascii(ch)[1:-1] for ch in s)
    if len(s) > limit:
        s = s[: max(0, limit - 1)] + "…"
    return s


def label_text(text: str, limit: int = 256) -> str:
    """A label value from outside (a scraped target, the kubelet, a log directory's name) as stored
    and shown: every non-printable character — controls, and bidi overrides and isolates such as
    U+202E, which would make a page show a name reversed — replaced by ``?``, cut to ``limit``."""
    if text.isprintable() and len(text) <= limit:
        return text
    return "".join(ch if ch.isprintable() else "?" for ch in text[:limit])
