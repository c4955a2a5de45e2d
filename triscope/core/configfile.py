"""Configuration files as pydantic v2 models, and their errors as ``FILE:LINE: field: what is wrong``.

Every configuration file (remediation policies, SLO specs, mismatch thresholds) is read the same
way: :mod:`triscope.core.yamlsafe` parses it (bounded, every value keeps its line), a
:class:`ConfigModel` validates the plain values, and :func:`validate` turns pydantic's errors into
one line each: the line comes from the error's ``loc`` (a missing key is reported on its
mapping's line), the field is the path written ``rules[0].limits.cooldown``, and the reason is
plain words (``must be >= 1, not 0``), never pydantic's URL.

A file with several problems raises the **first one in file order** (the lowest line); all of
them are on the exception's ``problems``.

The same wording serves the Alertmanager webhook payload (:func:`describe`, no lines there).

Conventions for the models:

* ``ConfigModel`` forbids unknown keys (a typo in ``cooldown`` must not silently mean "no
  cooldown": ``unknown key 'cooldwn' (allowed: cooldown, max_actions, per)``), reads a section
  written with no value (``settings:``) as an empty mapping but refuses an optional key written
  with no value (``slo_file:``: leave the key out for the default), and is strict: ``true`` is not
  ``1``, ``"5"`` is not ``5`` (the YAML types are already right; a string where a number belongs is
  a mistake).
* A validator that finds a problem raises ``ValueError("what is wrong")`` (its field is the
  path), or :func:`problem` (``"what is wrong"``, *at*) to point at a key below the model, e.g.
  the one key of a mapping that breaks a rule across several keys.
* Union variants chosen by a discriminator are tagged ``<name>`` (:func:`variant`): the tag is
  dropped from the path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Tag, ValidationError, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from triscope.core import yamlsafe
from triscope.core.configerror import ConfigFileError, Problem
from triscope.core.textsafe import one_line

M = TypeVar("M", bound=BaseModel)

PROBLEM = "config_problem"
UNKNOWN_KEY = "config_unknown_key"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigModel(BaseModel):
    """Base of every configuration model: unknown keys refused, an empty value read as an empty
    mapping, strict types, frozen."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    unknown_key_noun: ClassVar[str] = "key"
    """What an unknown key is called in the error (``unknown mismatch threshold 'x'``)."""

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, value: Any) -> Any:
        if value is None:
            return {}
        if isinstance(value, dict):
            allowed = cls.allowed_keys()
            for key, v in value.items():
                if key not in allowed:
                    raise unknown_key(key, allowed, cls.unknown_key_noun)
                if v is None and key in cls._optional_keys():
                    raise problem("has no value: give one, or leave the key out", key)
        return value

    @classmethod
    def allowed_keys(cls) -> list[str]:
        """The keys a file may write (aliases where a field has one)."""
        return [f.alias or name for name, f in cls.model_fields.items()]

    @classmethod
    def _optional_keys(cls) -> set[str]:
        """Keys whose absence means "not given" (default None): written with no value they are
        refused, not read as absent (a mapping section written empty is an empty mapping)."""
        return {f.alias or name for name, f in cls.model_fields.items() if not f.is_required() and f.default is None}


def unknown_key(key: Any, allowed: Sequence[str], noun: str = "key") -> PydanticCustomError:
    """The error for an unknown key of a mapping (reported on the key's line, the mapping as the field)."""
    return PydanticCustomError(UNKNOWN_KEY, "{reason}", {
        "reason": f"unknown {noun} {_key(key)} (allowed: {', '.join(allowed)})", "at": (key,)})


def problem(reason: str, *at: str | int) -> PydanticCustomError:
    """An error for a validator to raise: ``reason``, about the key (or keys below) ``at`` of the
    value being validated (nothing: the value itself)."""
    return PydanticCustomError(PROBLEM, "{reason}", {"reason": reason, "at": tuple(at)})


def variant(name: str) -> Tag:
    """The tag of one variant of a discriminated union (dropped from error paths)."""
    return Tag(f"<{name}>")


# ---------------------------------------------------------------------------------------------- validating
def validate(model: type[M], doc: yamlsafe.Document, *, at: tuple[str | int, ...] = (),
             context: dict[str, Any] | None = None,
             error: type[ConfigFileError] = ConfigFileError) -> M:
    """``model`` validated from the value at ``at`` of ``doc``; raises ``error`` (file, line, reason)
    with the first problem in file order."""
    value: Any = doc.root
    for key in at:
        value = value[key]
    try:
        return model.model_validate(value, context={"doc": doc, **(context or {})})
    except ValidationError as e:
        raise as_error(e, doc, at=at, error=error) from None
    except RecursionError:
        raise error(doc.file, doc.line(at), "nested too deeply") from None


def as_error(e: ValidationError, doc: yamlsafe.Document, *, at: tuple[str | int, ...] = (),
             error: type[ConfigFileError] = ConfigFileError) -> ConfigFileError:
    """The ``ConfigFileError`` (first problem in file order) of a ``ValidationError`` raised while
    validating the value at ``at`` of ``doc``."""
    found = []
    for d in e.errors(include_url=False):
        path, field, what = describe(d, prefix=at)
        found.append(Problem(doc.file, doc.line(path) or _first_line(doc), path, field, what))
    found.sort(key=lambda p: p.line or 0)    # stable: pydantic's order within a line
    first = found[0]
    return error(first.file, first.line, first.reason, field=first.field, problems=found)


def fail(doc: yamlsafe.Document, path: Sequence[str | int], what: str,
         error: type[ConfigFileError] = ConfigFileError) -> ConfigFileError:
    """A problem found after validation (another file, the environment): ``FILE:LINE: field: what``."""
    p = tuple(path)
    return error(doc.file, doc.line(p) or _first_line(doc), f"{field_name(p)}: {what}" if p else what,
                 field=field_name(p))


def _first_line(doc: yamlsafe.Document) -> int:
    return doc.line(()) or 1


def describe(d: ErrorDetails, *, prefix: tuple[str | int, ...] = (),
             mapping: str = "a mapping") -> tuple[tuple[str | int, ...], str, str]:
    """``(path, field, what)`` of one pydantic error: the path in the document (for its line), the
    field as written in messages, what is wrong in plain words.  ``mapping``: what a dict is called
    (``an object`` for JSON)."""
    path = prefix + tuple(x for x in d["loc"] if not (isinstance(x, str) and x.startswith("<") and x.endswith(">")))
    ctx = d.get("ctx") or {}
    shown = path
    if d["type"] in (PROBLEM, UNKNOWN_KEY):
        path = path + tuple(ctx.get("at", ()))
        if d["type"] == PROBLEM:
            shown = path          # an unknown key is named in the message, its mapping is the field
        return path, field_name(shown), str(ctx.get("reason", d["msg"]))
    return path, field_name(shown), _what(d, mapping)


def field_name(path: Sequence[str | int]) -> str:
    """``rules[0].limits.cooldown``; keys that are not identifiers quoted
    (``node_selector['triscope.io/remediation']``)."""
    out = ""
    for x in path:
        if isinstance(x, int):
            out += f"[{x}]"
        elif _IDENT.match(x):
            out += f".{x}" if out else x
        else:
            out += f"[{_key(x)}]"
    return one_line(out, 160)


def _key(key: Any) -> str:
    return one_line(repr(key), 80)


def show(value: Any, mapping: str = "a mapping") -> str:
    """A value in an error message: short, one line; a mapping or a long list by its kind."""
    if isinstance(value, dict):
        return mapping
    if isinstance(value, list | tuple):
        return "a list" if len(repr(value)) > 60 else repr(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return one_line(repr(value), 60)


_FIXED = {"missing": "missing (required)", "extra_forbidden": "unknown key", "string_too_short": "must not be empty",
          "recursion_loop": "nested too deeply"}
_MUST_BE = {"bool_type": "true or false", "int_type": "an integer", "int_parsing": "an integer",
            "int_from_float": "an integer", "float_type": "a number", "float_parsing": "a number",
            "string_type": "a string", "string_sub_type": "a string", "list_type": "a list", "tuple_type": "a list",
            "iterable_type": "a list", "finite_number": "a finite number"}
_MAPPING_TYPES = ("dict_type", "model_type", "model_attributes_type", "mapping_type")
_BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than": ("lt", "<"),
           "less_than_equal": ("le", "<=")}


def _what(d: ErrorDetails, mapping: str) -> str:
    t, ctx, value = d["type"], d.get("ctx") or {}, d.get("input")
    shown = show(value, mapping)
    if t in _FIXED:
        return _FIXED[t]
    if t in ("value_error", "assertion_error"):
        err = ctx.get("error")
        return str(err) if err is not None else d["msg"]
    if t in _MUST_BE:
        return f"must be {_MUST_BE[t]}, not {shown}"
    if t in _MAPPING_TYPES:
        return f"must be {mapping}, not {shown}"
    if t == "literal_error":
        return f"must be {ctx.get('expected', '?')}, not {shown}"
    if t in _BOUNDS:
        key, op = _BOUNDS[t]
        return f"must be {op} {ctx.get(key)}, not {shown}"
    if t == "too_short":
        n = ctx.get("min_length", 1)
        return "must not be empty" if n == 1 else f"must have at least {n} items"
    if t == "too_long":
        return f"must have at most {ctx.get('max_length')} items (has {ctx.get('actual_length')})"
    if t == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters long"
    msg = d["msg"]
    return (msg[:1].lower() + msg[1:]) if msg else t


# ---------------------------------------------------------------------------------------------- small types
def scalar_text(value: Any) -> str:
    """A YAML scalar written where text belongs (a label value ``tier: 1``) as text; ValueError for
    a mapping or list."""
    if isinstance(value, dict | list):
        raise ValueError(f"must be a string (or a number), not {show(value)}")
    return "" if value is None else str(value)


def str_map(value: Any, key_pattern: re.Pattern[str] | None = None, what: str = "label name",
            convert: Any = scalar_text) -> dict[str, str]:
    """A mapping of names to text (``labels: {tier: 1}``): keys checked against ``key_pattern``,
    scalar values as text.  Raises :func:`problem` at the offending key."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise problem(f"must be a mapping of {what}s to values, not {show(value)}")
    out = {}
    for k, v in value.items():
        if key_pattern is not None and not key_pattern.fullmatch(k):
            raise problem(f"{_key(k)} is not a valid {what}", k)
        try:
            out[k] = convert(v)
        except ValueError as e:
            raise problem(str(e), k) from None
    return out


__all__ = ["ConfigFileError", "ConfigModel", "Problem", "as_error", "describe", "fail", "field_name", "problem",
           "scalar_text", "show", "str_map", "unknown_key", "validate", "variant"]
