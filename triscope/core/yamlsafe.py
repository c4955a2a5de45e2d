"""The one way triscope reads a YAML file: bounded, and every value keeps its line.

Every configuration file (remediation policies, SLO specs, mismatch thresholds) goes through
here.  A file is refused with one line, ``FILE:LINE: what is wrong`` (``FILE: ...`` where there is
no line), when it is:

* larger than ``MAX_BYTES`` (4 MiB; read no further than that, so a pipe or ``/dev/zero`` cannot
  fill memory), binary (a NUL byte) or not UTF-8;
* not valid YAML (the line of the problem);
* nested deeper than ``MAX_DEPTH`` levels (checked while composing, before Python's recursion
  limit is anywhere near);
* a bomb: more than ``MAX_NODES`` values once aliases are expanded (a "billion laughs" file is a
  few hundred bytes that names one list ten times, nine levels deep), values whose text adds up
  to more than ``MAX_EXPANDED_CHARS`` characters, or an alias used inside its own anchor.  The
  tree is composed (aliases stay references, nothing is copied), then walked once into plain
  Python values with a counter that every visit, through an alias or not, moves;
* using a tag other than the plain YAML types (``!!python/...``, ``!Ref``, ``!!binary``...), or a
  duplicate key, or a key that is not a plain scalar.

What comes back is a ``Document``: ``root`` holds plain ``dict`` / ``list`` / ``str`` / ``int`` /
``float`` / ``bool`` / ``None`` (and ``datetime`` for YAML timestamps), mapping keys are always
strings (the key's text), YAML merge keys (``<<: *base``) are applied.  ``lines`` maps the *path*
of every value (a tuple of keys and list indexes, as pydantic reports an error's ``loc``) to its
line: the line of its key in a mapping, of the item in a list; ``value_lines`` to the line where
the value itself starts.  ``Document.line(path)`` falls back to the nearest enclosing value, so a
missing key is reported on its mapping's line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

MAX_BYTES = 4 * 1024 * 1024
"""Largest configuration file read (4 MiB): policies and SLO files are a few KB."""
MAX_NODES = 100_000
"""Most values (mapping keys included) a file may hold once its aliases are expanded."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists."""
MAX_EXPANDED_CHARS = 16 * MAX_BYTES
"""Most characters the scalar values may add up to once aliases are expanded (64 Mi)."""

YamlPath = tuple[str | int, ...]

_SCALAR_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "str", "timestamp")}
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLFileError(ValueError):
    """A file that cannot be read as configuration: ``FILE:LINE: reason`` (or ``FILE: reason``)."""

    def __init__(self, file: str, line: int | None, reason: str) -> None:
        self.file, self.line, self.reason = file, line, reason
        super().__init__(f"{file}:{line}: {reason}" if line else f"{file}: {reason}")


@dataclass
class Document:
    """One YAML document as plain values, with the line of every path."""

    file: str
    root: Any
    lines: dict[YamlPath, int] = field(default_factory=dict)
    value_lines: dict[YamlPath, int] = field(default_factory=dict)

    def line(self, path: Sequence[str | int] = ()) -> int | None:
        """The line of the value at ``path`` (its key's line in a mapping), else of the nearest
        enclosing value."""
        p = tuple(path)
        while p not in self.lines and p:
            p = p[:-1]
        return self.lines.get(p)

    def value_line(self, path: Sequence[str | int] = ()) -> int | None:
        """The line where the value at ``path`` starts (for a block mapping or list under a key:
        the line after the key), else :meth:`line`."""
        p = tuple(path)
        return self.value_lines.get(p) or self.line(p)

    def where(self, path: Sequence[str | int] = (), value: bool = False) -> str:
        """``FILE:LINE`` of a path (``FILE`` alone when the document has no lines)."""
        line = self.value_line(path) if value else self.line(path)
        return f"{self.file}:{line}" if line else self.file

    def error(self, path: Sequence[str | int], reason: str) -> YAMLFileError:
        return YAMLFileError(self.file, self.line(path), reason)


# ------------------------------------------------------------------------------------------ reading
def read_text(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES) -> str:
    """A configuration file's text: at most ``max_bytes``, UTF-8 (a BOM is dropped), not binary."""
    name = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise YAMLFileError(name, None, "no such file") from None
    except IsADirectoryError:
        raise YAMLFileError(name, None, "is a directory, not a file") from None
    except OSError as e:
        raise YAMLFileError(name, None, f"cannot read: {e.strerror or e}") from None
    return decode(data, name, max_bytes=max_bytes)


def decode(data: bytes, file: str, *, max_bytes: int = MAX_BYTES) -> str:
    """Bytes of a configuration file as text, refusing what is too large, binary or not UTF-8."""
    if len(data) > max_bytes:
        raise YAMLFileError(file, None, f"larger than the {_size(max_bytes)} limit for configuration files")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise YAMLFileError(file, data.count(b"\n", 0, nul) + 1,
                            f"a binary file (NUL byte at offset {nul}), not YAML text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise YAMLFileError(file, data.count(b"\n", 0, e.start) + 1,
                            f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def _size(n: int) -> str:
    return f"{n / 1048576:g} MiB" if n >= 1048576 else f"{n} bytes"


# ------------------------------------------------------------------------------------------ composing
class _Budget:
    def __init__(self, file: str, max_nodes: int, max_depth: int, max_chars: int) -> None:
        self.file, self.max_nodes, self.max_depth, self.max_chars = file, max_nodes, max_depth, max_chars
        self.composed = 0

    def bomb(self, line: int, what: str) -> YAMLFileError:
        return YAMLFileError(self.file, line, f"too many aliases/nodes (YAML bomb?): {what}")

    def too_deep(self, line: int) -> YAMLFileError:
        return YAMLFileError(self.file, line, f"nested deeper than {self.max_depth} levels")


class _BoundedComposer(Composer):
    """PyYAML's composer with a depth bound and a node count (aliases stay references here)."""

    _budget: _Budget
    _depth: int = 0

    if TYPE_CHECKING:   # from the parser it is mixed with
        def peek_event(self) -> Any: ...

    def compose_node(self, parent: Any, index: Any) -> Any:
        b = self._budget
        self._depth += 1
        try:
            if self._depth > b.max_depth:
                raise b.too_deep(self.peek_event().start_mark.line + 1)
            b.composed += 1
            if b.composed > b.max_nodes:
                raise b.bomb(self.peek_event().start_mark.line + 1, f"more than {b.max_nodes:,} nodes")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _PyLoader(Reader, Scanner, Parser, _BoundedComposer, Resolver):
    """Pure-Python events (PyYAML without libyaml)."""

    def __init__(self, text: str, budget: _Budget) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        _BoundedComposer.__init__(self)
        Resolver.__init__(self)
        self._budget = budget


try:   # libyaml's events, when PyYAML was built with it
    from yaml import cyaml as _cyaml

    _CParser: Any = getattr(_cyaml, "CParser", None)
except ImportError:  # pragma: no cover
    _CParser = None
_LOADER: Any = _PyLoader
if _CParser is not None:
    class _CLoader(_BoundedComposer, _CParser, Resolver):
        """libyaml's scanner and parser (C) under our composer (Python, bounded)."""

        def __init__(self, text: str, budget: _Budget) -> None:
            _CParser.__init__(self, text)
            _BoundedComposer.__init__(self)
            Resolver.__init__(self)
            self._budget = budget

    _LOADER = _CLoader


def _compose(text: str, budget: _Budget) -> list[yaml.Node]:
    loader = _LOADER(text, budget)
    try:
        nodes: list[yaml.Node] = []
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                nodes.append(node)
        return nodes
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "syntax error"
        raise YAMLFileError(budget.file, mark.line + 1 if mark else None, f"not valid YAML: {problem}") from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1 if isinstance(e.position, int) else None
        ch = e.character
        what = f"U+{ord(ch):04X}" if isinstance(ch, str) and len(ch) == 1 else \
            f"U+{ch:04X}" if isinstance(ch, int) else repr(ch)
        raise YAMLFileError(budget.file, line, f"not valid YAML: character {what} is not allowed") from None
    except yaml.YAMLError as e:
        raise YAMLFileError(budget.file, None, f"not valid YAML: {e}") from None
    finally:
        loader.dispose()


# ------------------------------------------------------------------------------------------ walking
class _Walker:
    """Composed nodes to plain values, counting every visit (aliases expand here)."""

    _constructor = SafeConstructor()

    def __init__(self, budget: _Budget, doc: Document) -> None:
        self.b, self.doc = budget, doc
        self.visits = 0
        self.chars = 0
        self.stack: set[int] = set()

    def walk(self, node: yaml.Node, path: YamlPath, depth: int) -> Any:
        line = node.start_mark.line + 1
        b = self.b
        self.visits += 1
        if self.visits > b.max_nodes:
            raise b.bomb(line, f"more than {b.max_nodes:,} values after expanding aliases")
        if depth > b.max_depth:
            raise b.too_deep(line)
        self.doc.lines[path] = line
        self.doc.value_lines[path] = line
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, line)
        nid = id(node)
        if nid in self.stack:
            raise YAMLFileError(b.file, line, "recursive alias: an anchor is used inside itself")
        self.stack.add(nid)
        try:
            if isinstance(node, yaml.SequenceNode):
                if node.tag != _SEQ_TAG:
                    raise YAMLFileError(b.file, line, f"unsupported tag {node.tag!r}")
                return [self.walk(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
            if isinstance(node, yaml.MappingNode):
                if node.tag != _MAP_TAG:
                    raise YAMLFileError(b.file, line, f"unsupported tag {node.tag!r}")
                return self.mapping(node, path, depth)
            raise YAMLFileError(b.file, line, f"unsupported YAML node {type(node).__name__}")
        finally:
            self.stack.discard(nid)

    def scalar(self, node: yaml.ScalarNode, line: int) -> Any:
        self.chars += len(node.value)
        if self.chars > self.b.max_chars:
            raise self.b.bomb(line, f"the values add up to more than {self.b.max_chars:,} characters "
                                    "after expanding aliases")
        if node.tag not in _SCALAR_TAGS:
            raise YAMLFileError(self.b.file, line, f"unsupported tag {node.tag!r}")
        construct = SafeConstructor.yaml_constructors[node.tag]
        try:
            return construct(self._constructor, node)
        except (ValueError, OverflowError, yaml.YAMLError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            if "integer string conversion" in first:
                first = f"an integer of more than {sys.get_int_max_str_digits()} digits"
            raise YAMLFileError(self.b.file, line, f"cannot read value {node.value[:40]!r}: {first[:160]}") from None

    def key(self, knode: yaml.Node) -> str:
        line = knode.start_mark.line + 1
        self.visits += 1
        if self.visits > self.b.max_nodes:
            raise self.b.bomb(line, f"more than {self.b.max_nodes:,} values after expanding aliases")
        if not isinstance(knode, yaml.ScalarNode):
            raise YAMLFileError(self.b.file, line, "mapping keys must be plain scalars (not a list or a mapping)")
        self.chars += len(knode.value)
        return str(knode.value)

    def mapping(self, node: yaml.MappingNode, path: YamlPath, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        for knode, vnode in node.value:
            if knode.tag == _MERGE_TAG:
                self.merge(vnode, path, depth, merged)
                continue
            key = self.key(knode)
            if key in out:
                raise YAMLFileError(self.b.file, knode.start_mark.line + 1, f"duplicate key {key!r}")
            out[key] = self.walk(vnode, path + (key,), depth + 1)
            self.doc.lines[path + (key,)] = knode.start_mark.line + 1
        if merged:
            out = {**{k: v for k, v in merged.items() if k not in out}, **out}
        return out

    def merge(self, vnode: yaml.Node, path: YamlPath, depth: int, merged: dict[str, Any]) -> None:
        """``<<: *base`` or ``<<: [*a, *b]`` (earlier mappings win, explicit keys win over all)."""
        sources = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
        line, value_line = self.doc.lines.get(path), self.doc.value_lines.get(path)
        for src in sources:
            if not isinstance(src, yaml.MappingNode):
                raise YAMLFileError(self.b.file, src.start_mark.line + 1,
                                    "a merge key (<<) takes a mapping or a list of mappings")
            for k, v in self.walk(src, path, depth + 1).items():
                merged.setdefault(k, v)
        if line is not None and value_line is not None:   # the merged mappings' lines are not this one's
            self.doc.lines[path], self.doc.value_lines[path] = line, value_line


# ------------------------------------------------------------------------------------------ entry points
def parse_all(text: str, file: str = "<yaml>", *, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH,
              max_chars: int = MAX_EXPANDED_CHARS, max_bytes: int = MAX_BYTES) -> list[Document]:
    """Every document of a YAML stream (``---`` separated), bounded as the module says."""
    if len(text) > max_bytes:
        raise YAMLFileError(file, None, f"larger than the {_size(max_bytes)} limit for configuration files")
    budget = _Budget(file, max_nodes, max_depth, max_chars)
    docs = []
    walker: _Walker | None = None
    for node in _compose(text, budget):
        doc = Document(file, None)
        if walker is None:
            walker = _Walker(budget, doc)
        walker.doc = doc   # one budget for the whole file
        doc.root = walker.walk(node, (), 0)
        docs.append(doc)
    return docs


def parse(text: str, file: str = "<yaml>", **limits: int) -> Document:
    """The one document of a YAML text (an empty text: ``root`` None)."""
    docs = parse_all(text, file, **limits)
    if len(docs) > 1:
        raise YAMLFileError(file, docs[1].line(()), "expected one YAML document, found another here")
    return docs[0] if docs else Document(file, None)


def load(path: str | os.PathLike[str], **limits: int) -> Document:
    """Read and parse a one-document YAML file."""
    return parse(read_text(path, max_bytes=limits.get("max_bytes", MAX_BYTES)), str(path), **limits)


def load_all(path: str | os.PathLike[str], **limits: int) -> list[Document]:
    """Read and parse every document of a YAML file."""
    return parse_all(read_text(path, max_bytes=limits.get("max_bytes", MAX_BYTES)), str(path), **limits)


__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_EXPANDED_CHARS", "MAX_NODES", "Document", "YAMLFileError", "decode",
           "load", "load_all", "parse", "parse_all", "read_text"]
