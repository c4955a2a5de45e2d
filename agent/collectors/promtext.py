"""Prometheus text (0.0.4) parsed once per series, not once per scrape.

An application's ``/metrics`` says the same series every scrape with new values.  prometheus-client's
parser reads every character of every line in Python (~16 us a series with the agent's own work on
top); ``TextCache`` keeps, per target, each sample line's text before its value (``name{labels}``)
with what prometheus-client made of it, so a line seen before costs a dictionary look-up and a
``float()`` of its last token.

The result is exactly prometheus-client's: the walk over the lines is the one of
``prometheus_client.parser.text_fd_to_metric_families`` (0.26: HELP/TYPE lines open a family, a
sample whose name the family does not allow is an untyped family of its own, counters renamed to
``_total``), a line not seen before is parsed by prometheus-client's own ``_parse_sample``, a new
family is checked by its own ``Metric``.  A line is kept only when its last token is its value (no
timestamp, no exemplar), and that token is read as that parser reads it (no ``_``, an integer beyond
a float's range fails as it does there).  Anything else this walk does not handle -- any error, any
doubt -- makes the caller parse the whole body with prometheus-client itself, which gives the answer
or the error it always gave (``ScrapeCollector.parse``).

What the agent makes of a sample (``job``/``instance``, kind, the budget's group) is computed once
per line and family too (``entry``), by the same function the slow path uses.

Most scrapes of a target say the very lines of the last one with new values: the same text before
every value, the same comments in the same places.  Such a body is read without a Python step per
line (``_Skeleton``): its lines' texts before their last space are compared with the last body's as
one list, the values are read by ``map(float, ...)``, and each sample is the last one's with its
value (the very same sample where the value did not move).  Anything else -- a line added, gone,
moved or changed, a comment changed, a value that is no number, has a ``_`` or became NaN/Inf --
is read by the walk above (which gives the errors and the corners as before).

The caches hold what the last scrape held (lines and families not in it are dropped), so a target
whose series change keeps no more than one exposition's worth.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter, methodcaller
from typing import Any

from triscope.core.samples import Sample

TIMESTAMPED = ("counter", "histogram", "summary", "gaugehistogram")
GROUPED = ("histogram", "summary", "gaugehistogram")   # one budget group per label set: buckets, count, sum
COUNTER_SUFFIXES = {
    "counter": ("_total", ""),
    "histogram": ("_bucket", "_count", "_sum"),
    "gaugehistogram": (),
    "summary": ("_count", "_sum"),
}
# the names a family allows after its TYPE line (prometheus_client.parser, text_fd_to_metric_families)
ALLOWED = {"counter": ("",), "gauge": ("",), "summary": ("_count", "_sum", ""), "histogram": ("_count", "_sum", "_bucket")}

# Entry: what the agent stores for one sample line in one family:
# (name, labels with job/instance, kind, budget group key, skipped: a _created sample of a timestamped family)
GroupKey = tuple[str, tuple[tuple[str, str], ...]]
Entry = tuple[str, dict[str, str], str, GroupKey, bool]


def entry(fam_name: str, fam_type: str, name: str, raw_labels: dict[str, str], job: str, instance: str,
          clean: Callable[[str], str]) -> Entry:
    """What the agent makes of sample ``name{raw_labels}`` of family ``fam_name`` of ``fam_type``
    (prometheus-client's names and types: a counter family without ``_total``, ``unknown``)."""
    skip = name.endswith("_created") and fam_type in TIMESTAMPED
    counters = COUNTER_SUFFIXES.get(fam_type)
    if counters is not None:
        kind = "counter" if any(name == fam_name + suf for suf in counters) else "gauge"
    elif fam_type == "unknown":
        kind = "counter" if name.endswith("_total") else "gauge"
    else:
        kind = "gauge"
    labels = {k: v if v.isprintable() else clean(v) for k, v in raw_labels.items()}
    for key, value in (("job", job), ("instance", instance)):
        if key in labels:
            labels[f"exported_{key}"] = labels.pop(key)
        labels[key] = value
    grouped = fam_type in GROUPED
    gkey = (fam_name if grouped else name,
            tuple(sorted((k, v) for k, v in labels.items() if not (grouped and k in ("le", "quantile")))))
    return name, labels, kind, gkey, skip


class Fallback(Exception):
    """The fast walk cannot answer this body: parse it with prometheus-client."""


class _Family:
    """One family as prometheus-client builds it (its ``build_metric``), checked by its ``Metric``."""

    __slots__ = ("name", "type", "rename", "created_of")

    def __init__(self, name: str, typ: str, metric: Any) -> None:
        rename = typ == "counter" and not name.endswith("_total")
        if typ == "counter" and not rename:
            name = name[:-6]
        m = metric(name, "", typ)          # raises on a bad name or type, as the parser's build_metric does
        self.name: str = m.name
        self.type: str = m.type
        self.rename = rename               # samples get _total appended
        self.created_of = self.name[:-8] if self.name.endswith("_created") else None


class _Line:
    """A sample line's text before its value, parsed once."""

    __slots__ = ("name", "labels", "fam", "entry", "gkey", "sample")

    def __init__(self, name: str, labels: dict[str, str]) -> None:
        self.name = name
        self.labels = labels
        self.fam: _Family | None = None       # the family ``entry`` was made for
        self.entry: Entry | None = None
        self.gkey: GroupKey | None = None
        self.sample: Sample | None = None     # what the last scrape stored for it (kept while unchanged)


_IGNORE = ("", "", "")
_HELP, _TYPE = "HELP", "TYPE"
_RPARTITION = methodcaller("rpartition", " ")
_HEAD, _TAIL = itemgetter(0), itemgetter(2)


def _picker(positions: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``positions`` of a sequence as a tuple, picked in C (``itemgetter``)."""
    if not positions:
        return lambda seq: ()
    if len(positions) == 1:
        only = positions[0]
        return lambda seq: (seq[only],)
    return itemgetter(*positions)


class _Skeleton:
    """The last body walked, its values taken out: each line's text before its last space, the
    lines that are no sample (comments, blank lines) whole, where the samples' values stand and which
    of them the agent stores.  A body with the same skeleton holds the same samples, new values."""

    __slots__ = ("heads", "keys", "n", "nonfinite", "other_lines", "others", "out", "out_of", "values_at")

    def __init__(self, heads: list[str], others: list[int], other_lines: tuple[str, ...], values_at: list[int],
                 out_of: list[int], nonfinite: list[int], out: list[Sample], keys: list[GroupKey], n: int) -> None:
        self.heads = heads                         # every line's text before its last space
        self.others = _picker(others)              # the lines that are no sample ...
        self.other_lines = other_lines             # ... and their text
        self.values_at = _picker(values_at)        # the sample lines (their last token is the value)
        self.out_of = _picker(out_of)              # which sample lines give the stored samples, in order
        self.nonfinite = nonfinite                 # sample lines whose value was NaN/Inf (not stored)
        self.out, self.keys, self.n = out, keys, n   # the last samples: each one's name, labels and kind


class TextCache:
    """One target's parsed lines: ``walk(body)`` -> [(entry, value)] in the order prometheus-client's
    families give them, or ``Fallback`` / the parser's own exception."""

    def __init__(self, job: str, instance: str, clean: Callable[[str], str]) -> None:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.parser import _parse_sample, _split_quoted, _unquote_unescape
        from prometheus_client.validation import _is_valid_legacy_metric_name

        self.job, self.instance, self.clean = job, instance, clean
        self._metric = Metric
        self._parse_sample = _parse_sample
        self._split_quoted = _split_quoted
        self._unquote = _unquote_unescape
        self._legacy_name = _is_valid_legacy_metric_name
        self._lines: dict[str, _Line] = {}
        self._comments: dict[str, tuple[str, str, str]] = {}
        self._families: dict[tuple[str, str], _Family] = {}
        self.parsed_lines = 0      # lines parsed by prometheus-client's _parse_sample (not from the cache)
        self._skeleton: _Skeleton | None = None
        self.skeleton_walks = 0    # bodies read through the last one's skeleton

    # -- the walk ---------------------------------------------------------------------------------------

    def walk(self, body: str) -> tuple[list[Sample], list[GroupKey], int]:
        """The agent's samples of ``body`` in order (``_created`` and NaN/Inf left out), each one's
        budget group, and how many samples the kept families hold (what ``max_samples`` counts)."""
        lines = body.split("\n")
        got = self._same_skeleton(lines)
        if got is not None:
            self.skeleton_walks += 1
            return got
        self._skeleton = None
        fams, plain, at = self._families_of(lines)
        timestamped = {f.name for f, _, _ in fams if f.type in TIMESTAMPED}
        out: list[Sample] = []
        keys: list[GroupKey] = []
        add, key = out.append, keys.append
        n = 0
        k = -1                       # the sample line's number, in the order of the lines
        out_of: list[int] = []       # which sample lines were stored
        nonfinite: list[int] = []
        for fam, fam_items, values in fams:
            if fam.created_of is not None and fam.created_of in timestamped:
                k += len(fam_items)
                continue
            n += len(fam_items)
            for item, value in zip(fam_items, values, strict=True):
                k += 1
                if item.fam is fam:
                    s = item.sample
                    if s is not None and s.value == value:   # unchanged since the last scrape: the same sample
                        add(s)
                        key(item.gkey)   # type: ignore[arg-type]
                        out_of.append(k)
                        continue
                    e: Entry = item.entry   # type: ignore[assignment]   # set with item.fam
                else:
                    e = self._resolve(item, fam)
                if e[4]:                 # a _created sample
                    continue
                if value - value != 0.0:     # NaN/Inf (no store can carry them)
                    nonfinite.append(k)
                    continue
                s = item.sample = Sample(e[0], value, e[1], e[2])   # type: ignore[arg-type]
                add(s)
                key(e[3])
                out_of.append(k)
        if plain:
            samples = set(at)
            others = [i for i in range(len(lines)) if i not in samples]
            self._skeleton = _Skeleton(list(map(_HEAD, map(_RPARTITION, lines))), others,
                                       tuple(lines[i] for i in others), at, out_of, nonfinite, out, keys, n)
        return out, keys, n

    def _same_skeleton(self, lines: list[str]) -> tuple[list[Sample], list[GroupKey], int] | None:
        """The samples of a body whose skeleton is the last one's (its values read in C), or None."""
        sk = self._skeleton
        if sk is None or len(lines) != len(sk.heads):
            return None
        parts = list(map(_RPARTITION, lines))
        if list(map(_HEAD, parts)) != sk.heads or sk.others(lines) != sk.other_lines:
            return None
        toks = sk.values_at(list(map(_TAIL, parts)))
        try:
            values = list(map(float, toks))
        except ValueError:           # the walk says what is wrong (or the parser does)
            return None
        if "_" in "".join(toks):
            return None
        total = sum(values)
        if total - total != 0.0:     # a NaN/Inf somewhere: only where it was, and no integer past a float
            if [k for k, v in enumerate(values) if v - v != 0.0] != sk.nonfinite or any(
                    toks[k].lstrip("+-").isdigit() for k in sk.nonfinite):
                return None
        elif sk.nonfinite:
            return None
        out = [s if s.value == v else Sample(s.name, v, s.labels, s.kind)    # unchanged: the same sample
               for s, v in zip(sk.out, sk.out_of(values), strict=True)]
        sk.out = out
        return out, sk.keys, sk.n

    def _families_of(self, body_lines: list[str]) -> tuple[list[tuple[_Family, list[_Line], list[float]]],
                                                           bool, list[int]]:
        """The walk of ``text_fd_to_metric_families`` over the lines: its families, in order; whether
        every sample line is ``text value`` alone, nothing around; where the sample lines are."""
        lines = self._lines
        plain = True
        at: list[int] = []
        seen: dict[str, _Line] = {}
        seen_fams: dict[tuple[str, str], _Family] = {}
        fams: list[tuple[_Family, list[_Line], list[float]]] = []
        name, typ = "", "untyped"
        allowed: tuple[str, ...] = ()
        items: list[_Line] = []
        values: list[float] = []
        for i, raw in enumerate(body_lines):
            line = raw.strip()
            if not line:
                continue
            if line[0] == "#":
                name, typ, allowed, items, values = self._on_comment(line, name, typ, allowed, items, values, fams,
                                                                     seen_fams)
                continue
            prefix, _, tok = line.rpartition(" ")
            item = lines.get(prefix)
            if item is None:
                item, value, keep = self._new_line(line, prefix, tok)
                if keep:
                    seen[prefix] = item
                plain &= keep
            else:
                if "_" in tok:
                    raise Fallback("'_' in a value")
                value = float(tok)           # ValueError: the parser says what is wrong
                if value - value != 0.0 and tok.lstrip("+-").isdigit():
                    raise Fallback("an integer beyond a float")
                seen[prefix] = item
            at.append(i)
            plain &= len(raw) == len(line)     # no whitespace around it: its text is what the skeleton reads
            if item.name in allowed:
                items.append(item)
                values.append(value)
            else:                        # an untyped family of its own; what follows belongs to none
                if name != "":
                    fams.append((self._family(name, typ, seen_fams), items, values))
                name, typ, items, values, allowed = "", "untyped", [], [], ()
                fams.append((self._family(item.name, "untyped", seen_fams), [item], [value]))
        if name != "":
            fams.append((self._family(name, typ, seen_fams), items, values))
        self._lines, self._families = seen, seen_fams
        if len(self._comments) > 4 * len(fams) + 1000:
            self._comments.clear()
        return fams, plain, at

    def _on_comment(self, line: str, name: str, typ: str, allowed: tuple[str, ...], items: list, values: list,
                    fams: list, seen_fams: dict) -> tuple[str, str, tuple[str, ...], list, list]:
        """A ``#`` line: HELP and TYPE open a family (closing the open one) as the parser's walk does."""
        what, cand, t = self._comments.get(line) or self._comment(line)
        if what is _HELP:
            if cand != name:
                if name != "":
                    fams.append((self._family(name, typ, seen_fams), items, values))
                name, typ, items, values, allowed = cand, "untyped", [], [], (cand,)
        elif what is _TYPE:
            if cand != name:
                if name != "":
                    fams.append((self._family(name, typ, seen_fams), items, values))
                name, items, values = cand, [], []
            typ = t
            allowed = tuple(name + s for s in ALLOWED.get(t, ("",)))
        return name, typ, allowed, items, values

    # -- what is parsed once ----------------------------------------------------------------------------

    def _new_line(self, line: str, prefix: str, tok: str) -> tuple[_Line, float, bool]:
        """Parse ``line`` with prometheus-client; keep it under ``prefix`` when its last token is its
        value (no timestamp or exemplar after it)."""
        s = self._parse_sample(line)
        self.parsed_lines += 1
        value = float(s.value)
        item = _Line(s.name, s.labels)
        if prefix and s.timestamp is None and "_" not in tok:
            try:
                f = float(tok)
            except ValueError:
                f = None
            if f is not None and (f == value or (f != f and value != value)) and not (
                    f - f != 0.0 and tok.lstrip("+-").isdigit()):
                return item, value, True
        return item, value, False

    def _comment(self, line: str) -> tuple[str, str, str]:
        parts = self._split_quoted(line, None, 3)
        got = _IGNORE
        if len(parts) >= 2:
            cand = ""
            if len(parts) > 2:
                if parts[1] != "TYPE" and parts[1] != "HELP":
                    return self._keep(line, _IGNORE)
                cand, quoted = self._unquote(parts[2])
                if not quoted and not self._legacy_name(cand):
                    raise Fallback("a bad name in a comment")
            if parts[1] == "HELP":
                got = (_HELP, cand, "")
            elif parts[1] == "TYPE":
                if len(parts) < 4:
                    raise Fallback("a TYPE line without a type")
                got = (_TYPE, cand, parts[3])
        return self._keep(line, got)

    def _keep(self, line: str, got: tuple[str, str, str]) -> tuple[str, str, str]:
        self._comments[line] = got
        return got

    def _family(self, name: str, typ: str, seen: dict[tuple[str, str], _Family]) -> _Family:
        key = (name, typ)
        fam = self._families.get(key) or seen.get(key)
        if fam is None:
            fam = _Family(name, typ, self._metric)
        seen[key] = fam
        return fam

    def _resolve(self, item: _Line, fam: _Family) -> Entry:
        name = item.name + "_total" if fam.rename else item.name
        item.entry = e = entry(fam.name, fam.type, name, item.labels, self.job, self.instance, self.clean)
        item.gkey, item.fam, item.sample = e[3], fam, None
        return e
