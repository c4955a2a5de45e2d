"""Fault knobs the service reads at run time: their validation, the knobs file and its watcher.

Three layers make the effective knobs, later ones winning key by key:

1. **start-up values**: the defaults below, changed by ``--set KEY=VALUE`` on the command line;
2. **the knobs file** (``--knobs-file``): the desired state written by a person or by the remediation
   engine's fallback adapter.  Keys it leaves out take their start-up values;
3. **admin overrides** (``POST /admin/knobs``): partial updates for experiments.

A change of the file (a new content hash, its removal included) replaces the file layer and drops
every admin override, so a fallback the engine writes always wins over a fault injected earlier.
The file is polled every ``poll_s`` (0.5 s by default: ``stat`` each time, read and hashed when the
stat signature changes), so a change is applied within 1 s.  A bad file is refused as a whole with
one line that says where and what, and the knobs in force stay as they were.

File format (YAML, or JSON which is YAML too)::

    version: 1                 # required
    kind: fallback             # optional: "fallback" or "experiment" (default)
    workload: inference-b      # optional; if the service was started with --workload it must match
    knobs:                     # optional; absent = every knob at its start-up value
      pinned: true
      workers: 4

In a ``kind: fallback`` file the fault-injection knobs (``FAULT_KNOBS``) may appear only at their off
values: a fallback restores a healthy configuration, it never injects a fault.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("inference.knobs")

NEIGHBOUR_MODES = ("off", "copy", "compute")
MAX_BATCH = 512
MAX_WORKERS = 256
MAX_WAIT_MS = 10_000.0
MAX_UPLOAD_MIB = 4096

# knobs a fallback file may set freely; the others only to their off values
FALLBACK_KNOBS = ("pinned", "workers", "cpu_affinity", "pin_churn", "batch_size", "max_wait_ms")
FAULT_KNOBS = {"net_drop": 0.0, "noisy_neighbour": "off", "upload_mib": 0}


class KnobError(ValueError):
    """A knob value, a knobs file or an admin request was refused; ``str()`` is one line."""


@dataclass(frozen=True, slots=True)
class Knobs:
    """The service's run-time configuration.  ``cpu_affinity`` None = every CPU the process may use."""

    pinned: bool = True
    workers: int = 4
    cpu_affinity: tuple[int, ...] | None = None
    pin_churn: bool = False
    batch_size: int = 16
    max_wait_ms: float = 5.0
    net_drop: float = 0.0
    noisy_neighbour: str = "off"
    upload_mib: int = 0

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cpu_affinity"] = list(self.cpu_affinity) if self.cpu_affinity is not None else None
        return d

    def label_values(self) -> dict[str, str]:
        """Every knob as a Prometheus label value (booleans ``true``/``false``, CPUs comma-separated)."""
        out: dict[str, str] = {}
        for k, v in self.as_dict().items():
            if isinstance(v, bool):
                out[k] = "true" if v else "false"
            elif v is None:
                out[k] = ""
            elif isinstance(v, list):
                out[k] = ",".join(str(c) for c in v)
            elif isinstance(v, float):
                out[k] = f"{v:g}"
            else:
                out[k] = str(v)
        return out


KNOB_NAMES = tuple(f.name for f in dataclasses.fields(Knobs))


def _allowed_cpus() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return frozenset(range(os.cpu_count() or 1))


def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "yes", "no", "on", "off"):
        return v.lower() in ("true", "yes", "on")
    raise KnobError(f"{name}: must be true or false, got {v!r}")


def _int(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise KnobError(f"{name}: must be an integer from {lo} to {hi}, got {v!r}")
    try:
        n = int(v)
    except ValueError:
        raise KnobError(f"{name}: must be an integer from {lo} to {hi}, got {v!r}") from None
    if not lo <= n <= hi:
        raise KnobError(f"{name}: must be an integer from {lo} to {hi}, got {n}")
    return n


def _float(name: str, v: Any, lo: float, hi: float, hi_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise KnobError(f"{name}: must be a number from {lo:g} to {hi:g}, got {v!r}")
    try:
        x = float(v)
    except ValueError:
        raise KnobError(f"{name}: must be a number from {lo:g} to {hi:g}, got {v!r}") from None
    if x != x or x < lo or x > hi or (hi_open and x >= hi):
        rng = f"{lo:g} to below {hi:g}" if hi_open else f"{lo:g} to {hi:g}"
        raise KnobError(f"{name}: must be a number from {rng}, got {v!r}")
    return x


def _cpus(name: str, v: Any, allowed: frozenset[int]) -> tuple[int, ...] | None:
    if v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "null", "all")):
        return None
    items: list[Any]
    if isinstance(v, bool):
        raise KnobError(f"{name}: must be null, a CPU number or a list of CPU numbers, got {v!r}")
    if isinstance(v, int):
        items = [v]
    elif isinstance(v, str):
        items = [s for s in v.replace(" ", "").split(",") if s]
    elif isinstance(v, (list, tuple)):
        items = list(v)
    else:
        raise KnobError(f"{name}: must be null, a CPU number or a list of CPU numbers, got {v!r}")
    cpus: list[int] = []
    for it in items:
        if isinstance(it, bool):
            raise KnobError(f"{name}: must be null, a CPU number or a list of CPU numbers, got {v!r}")
        try:
            c = int(it)
        except (TypeError, ValueError):
            raise KnobError(f"{name}: must be null, a CPU number or a list of CPU numbers, got {v!r}") from None
        if c not in allowed:
            raise KnobError(f"{name}: CPU {c} is not one this process may run on ({_cpu_list(allowed)})")
        if c not in cpus:
            cpus.append(c)
    if not cpus:
        raise KnobError(f"{name}: an empty CPU list; use null for every CPU")
    return tuple(sorted(cpus))


def _cpu_list(cpus: frozenset[int]) -> str:
    s = sorted(cpus)
    return ",".join(str(c) for c in s[:16]) + ("…" if len(s) > 16 else "")


def validate_one(name: str, value: Any, allowed_cpus: frozenset[int] | None = None) -> Any:
    """The normalised value of one knob, or KnobError with one line."""
    if name == "pinned" or name == "pin_churn":
        return _bool(name, value)
    if name == "workers":
        return _int(name, value, 1, MAX_WORKERS)
    if name == "cpu_affinity":
        return _cpus(name, value, allowed_cpus if allowed_cpus is not None else _allowed_cpus())
    if name == "batch_size":
        return _int(name, value, 1, MAX_BATCH)
    if name == "max_wait_ms":
        return _float(name, value, 0.0, MAX_WAIT_MS)
    if name == "net_drop":
        return _float(name, value, 0.0, 1.0, hi_open=True)
    if name == "noisy_neighbour":
        if not isinstance(value, str) or value not in NEIGHBOUR_MODES:
            raise KnobError(f"{name}: must be one of {', '.join(NEIGHBOUR_MODES)}, got {value!r}")
        return value
    if name == "upload_mib":
        return _int(name, value, 0, MAX_UPLOAD_MIB)
    raise KnobError(f"unknown knob {name!r} (knobs: {', '.join(KNOB_NAMES)})")


def validate(values: Mapping[str, Any], allowed_cpus: frozenset[int] | None = None) -> dict[str, Any]:
    """Validate a partial mapping of knobs; returns the normalised values."""
    if not isinstance(values, Mapping):
        raise KnobError(f"knobs must be a mapping of knob: value, got {type(values).__name__}")
    return {str(k): validate_one(str(k), v, allowed_cpus) for k, v in values.items()}


def merge(base: Knobs, values: Mapping[str, Any]) -> Knobs:
    """``base`` with already validated ``values`` replaced."""
    return dataclasses.replace(base, **values)


def parse_assignment(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` from the command line; VALUE is read as JSON when it parses, else a string."""
    if "=" not in text:
        raise KnobError(f"--set {text!r}: expected KEY=VALUE, e.g. batch_size=16")
    k, raw = text.split("=", 1)
    try:
        v: Any = json.loads(raw)
    except ValueError:
        v = raw
    return k.strip(), v


def _load_text(text: str, path: Path) -> Any:
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except ValueError as e:
            raise KnobError(f"{path}: not valid JSON: {e}") from None
    try:
        import yaml
    except ImportError:  # JSON is YAML; without PyYAML only JSON files can be read
        try:
            return json.loads(text)
        except ValueError as e:
            raise KnobError(f"{path}: PyYAML is not installed and the file is not JSON: {e}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise KnobError(f"{where}: not valid YAML: {problem}") from None


@dataclass(frozen=True, slots=True)
class KnobsFile:
    kind: str
    workload: str | None
    knobs: dict[str, Any]


def parse_file(text: str, path: Path, workload: str | None = None,
               allowed_cpus: frozenset[int] | None = None) -> KnobsFile:
    """Parse and validate a knobs file's text; KnobError (one line, starting with the path) if bad."""
    doc = _load_text(text, path)
    if doc is None:
        raise KnobError(f"{path}: empty file (a knobs file needs at least 'version: 1')")
    if not isinstance(doc, dict):
        raise KnobError(f"{path}: the top level must be a mapping with 'version' and 'knobs'")
    unknown = sorted(set(doc) - {"version", "kind", "workload", "knobs"})
    if unknown:
        raise KnobError(f"{path}: unknown top-level key {unknown[0]!r} (keys: version, kind, workload, knobs)")
    if doc.get("version") != 1:
        raise KnobError(f"{path}: version: must be 1, got {doc.get('version')!r}")
    kind = doc.get("kind", "experiment")
    if kind not in ("fallback", "experiment"):
        raise KnobError(f"{path}: kind: must be fallback or experiment, got {kind!r}")
    wl = doc.get("workload")
    if wl is not None and not isinstance(wl, str):
        raise KnobError(f"{path}: workload: must be a string, got {wl!r}")
    if workload is not None and wl is not None and wl != workload:
        raise KnobError(f"{path}: workload: this file is for {wl!r}, this service is {workload!r}")
    raw = doc.get("knobs") or {}
    if not isinstance(raw, dict):
        raise KnobError(f"{path}: knobs: must be a mapping of knob: value")
    try:
        values = validate(raw, allowed_cpus)
    except KnobError as e:
        raise KnobError(f"{path}: knobs.{e}") from None
    if kind == "fallback":
        for k, off in FAULT_KNOBS.items():
            if k in values and values[k] != off:
                raise KnobError(f"{path}: knobs.{k}: a fallback may only set it to {off!r} (it is a fault "
                                f"injection knob), got {raw[k]!r}")
    return KnobsFile(kind=kind, workload=wl, knobs=values)


@dataclass(slots=True)
class KnobState:
    """What ``KnobStore.state()`` returns: the effective knobs and where they came from."""

    knobs: Knobs
    generation: int
    applied_at: float
    source: str                      # startup | file | admin
    file_path: str | None
    file_sha256: str | None          # of the file content in force ("" while the file is absent)
    file_kind: str | None
    overrides: dict[str, Any] = field(default_factory=dict)
    file_error: str | None = None    # the last refused file, until a good one arrives


Listener = Callable[[Knobs, Knobs], None]


class KnobStore:
    """The effective knobs, the three layers that make them, and the file watcher.

    Listeners (``subscribe``) are called as ``fn(old, new)`` on every change, outside the lock, in the
    thread that made the change (the watcher thread for file changes, the HTTP handler for admin
    requests).  They must not raise; what they could not apply they report elsewhere (metrics).
    """

    def __init__(self, startup: Knobs | None = None, file: Path | None = None, workload: str | None = None,
                 poll_s: float = 0.5, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.RLock()
        self._apply_lock = threading.Lock()   # changes are applied one at a time, in order
        self._startup = startup or Knobs()
        self._file = Path(file) if file is not None else None
        self._workload = workload
        self._poll_s = poll_s
        self._clock = clock
        self._allowed = _allowed_cpus()
        self._file_values: dict[str, Any] = {}
        self._file_sha: str | None = None
        self._file_kind: str | None = None
        self._file_sig: tuple[int, int, int] | None = None
        self._file_error: str | None = None
        self._overrides: dict[str, Any] = {}
        self._listeners: list[Listener] = []
        self._errors = 0
        self._knobs = self._startup
        self._gen = 0
        self._applied_at = clock()
        self._source = "startup"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._file is not None:
            self.poll()  # a bad file at start-up is reported, the start-up values stay in force

    # -- reading -----------------------------------------------------------------------------
    @property
    def knobs(self) -> Knobs:
        return self._knobs

    @property
    def allowed_cpus(self) -> frozenset[int]:
        return self._allowed

    @property
    def file_errors(self) -> int:
        return self._errors

    def state(self) -> KnobState:
        with self._lock:
            return KnobState(knobs=self._knobs, generation=self._gen, applied_at=self._applied_at,
                             source=self._source, file_path=str(self._file) if self._file else None,
                             file_sha256=self._file_sha, file_kind=self._file_kind,
                             overrides=dict(self._overrides), file_error=self._file_error)

    def subscribe(self, fn: Listener) -> None:
        self._listeners.append(fn)

    # -- changing ----------------------------------------------------------------------------
    def _recompute(self, source: str) -> None:
        with self._apply_lock:
            with self._lock:
                old = self._knobs
                new = merge(merge(self._startup, self._file_values), self._overrides)
                self._knobs = new
                self._gen += 1
                self._applied_at = self._clock()
                self._source = source
            if new != old:
                log.info(json.dumps({"event": "knobs", "source": source, "generation": self._gen,
                                     "knobs": new.as_dict()}))
            for fn in list(self._listeners):
                try:
                    fn(old, new)
                except Exception:  # a listener reports its own failures; the others still run
                    log.exception("knob listener failed")

    def set_overrides(self, values: Mapping[str, Any], replace: bool = False) -> Knobs:
        """Admin: validate ``values`` (all or nothing) and merge them into the overrides."""
        clean = validate(values, self._allowed)
        with self._lock:
            if replace:
                self._overrides = {}
            self._overrides.update(clean)
        self._recompute("admin")
        return self._knobs

    # -- the file ----------------------------------------------------------------------------
    def poll(self) -> bool:
        """Check the knobs file once; True when a changed, valid file (or its removal) was applied."""
        if self._file is None:
            return False
        try:
            st = self._file.stat()
            sig: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            sig = None
        except OSError as e:
            return self._refuse(f"{self._file}: cannot stat: {e.strerror}")
        if sig == self._file_sig and (sig is not None or self._file_sha is not None or self._gen > 0):
            return False
        self._file_sig = sig
        if sig is None:
            if self._file_sha in (None, ""):
                self._file_sha = ""
                return False
            with self._lock:   # the file was removed: no file layer, admin overrides dropped
                self._file_values, self._file_sha, self._file_kind = {}, "", None
                self._overrides = {}
                self._file_error = None
            self._recompute("file")
            return True
        try:
            data = self._file.read_bytes()
        except OSError as e:
            return self._refuse(f"{self._file}: cannot read: {e.strerror}")
        sha = hashlib.sha256(data).hexdigest()
        if sha == self._file_sha:
            return False
        try:
            parsed = parse_file(data.decode("utf-8", errors="replace"), self._file, self._workload, self._allowed)
        except KnobError as e:
            return self._refuse(str(e))
        with self._lock:
            self._file_values, self._file_sha, self._file_kind = parsed.knobs, sha, parsed.kind
            self._overrides = {}
            self._file_error = None
        self._recompute("file")
        return True

    def _refuse(self, msg: str) -> bool:
        with self._lock:
            self._errors += 1
            self._file_error = msg
        log.warning("knobs file refused, knobs in force unchanged: %s", msg)
        return False

    def start(self) -> None:
        if self._file is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="knobs-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.poll()
            except Exception:  # keep watching whatever happens to one poll
                log.exception("knobs file poll failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


def write_file_atomically(path: Path, knobs: Mapping[str, Any], kind: str = "experiment",
                          workload: str | None = None) -> None:
    """Write a knobs file the way every writer must: a temporary file in the same folder, then rename."""
    path = Path(path)
    doc: dict[str, Any] = {"version": 1, "kind": kind}
    if workload is not None:
        doc["workload"] = workload
    doc["knobs"] = dict(knobs)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    try:
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
