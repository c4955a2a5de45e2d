"""Limits on the names and label values triscope stores, checked where they come in.

* **Node names**: 1 to ``MAX_NODE_NAME`` (253) characters, letters, digits, ``.``, ``-`` and ``_``,
  starting and ending with a letter or a digit.  Every Kubernetes node name (an RFC 1123 DNS
  subdomain, at most 253 characters) and every host name fits.  ``triscope agent --node``,
  ``triscope import-trace --node`` and the node named inside a trace file are refused with one
  line when they do not; the store refuses to create such a node.
* **Label names**: Prometheus' rule, ``[a-zA-Z_][a-zA-Z0-9_]*``, at most ``MAX_LABEL_NAME`` (128)
  characters.  **Metric names**: ``[a-zA-Z_:][a-zA-Z0-9_:]*``, at most ``MAX_METRIC_NAME`` (200,
  the store's column).  Trace files are checked against both.
* **Label values**: at most ``MAX_LABEL_VALUE`` (1,024) characters.  The store does not fail a
  tick for a longer one (an application's ``/metrics`` is not ours to fix): it keeps the first
  1,014 characters, then ``~`` and 9 hex digits of a hash of the whole value, so two long values
  that share a prefix stay two series, and counts it (``Store.truncated_label_values``, a log
  line for each new label set).

The dashboard shows long names and values cut to a few dozen characters with an ellipsis and the
whole text in a tooltip (``shorten``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

MAX_NODE_NAME = 253
MAX_LABEL_NAME = 128
MAX_LABEL_VALUE = 1024
MAX_METRIC_NAME = 200

_NODE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_HASH_LEN = 9


def shorten(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis (for display and error messages)."""
    text = str(text)
    return text if len(text) <= limit else text[: max(1, limit - 1)] + "\u2026"


def _shown(name: str) -> str:
    return repr(shorten(name, 60)) + (f" ({len(name):,} characters)" if len(name) > 60 else "")


def node_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid node name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "a node name must be a non-empty string"
    if len(name) > MAX_NODE_NAME:
        return (f"node name {_shown(name)} is longer than {MAX_NODE_NAME} characters "
                "(the limit of a Kubernetes node name)")
    if not _NODE.fullmatch(name):
        return (f"node name {_shown(name)} may only hold letters, digits, '.', '-' and '_', and must start "
                "and end with a letter or a digit")
    return None


def label_name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not _LABEL.fullmatch(name):
        return f"label name {_shown(str(name))} is not [a-zA-Z_][a-zA-Z0-9_]*"
    if len(name) > MAX_LABEL_NAME:
        return f"label name {_shown(name)} is longer than {MAX_LABEL_NAME} characters"
    return None


def metric_name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not _METRIC.fullmatch(name):
        return f"metric name {_shown(str(name))} is not [a-zA-Z_:][a-zA-Z0-9_:]*"
    if len(name) > MAX_METRIC_NAME:
        return f"metric name {_shown(name)} is longer than {MAX_METRIC_NAME} characters"
    return None


def bound_label_value(value: str) -> str:
    """``value`` when it fits ``MAX_LABEL_VALUE``; else its first characters, ``~`` and a hash of
    the whole value (exactly ``MAX_LABEL_VALUE`` characters)."""
    if len(value) <= MAX_LABEL_VALUE:
        return value
    return value[: MAX_LABEL_VALUE - _HASH_LEN - 1] + "~" + _digest(value)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()[:_HASH_LEN]


def bound_labels(labels: Mapping[str, str]) -> tuple[dict[str, str], int]:
    """The label set with over-long values (and names) bounded, and how many were cut."""
    out: dict[str, str] = {}
    cut = 0
    for k, v in labels.items():
        k, v = str(k), str(v)
        if len(v) > MAX_LABEL_VALUE:
            v = bound_label_value(v)
            cut += 1
        if len(k) > MAX_LABEL_NAME:
            k = k[: MAX_LABEL_NAME - _HASH_LEN - 1] + "_" + _digest(k)
            cut += 1
        out[k] = v
    return out, cut
