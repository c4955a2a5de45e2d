"""Huawei Ascend NPUs through ``npu-smi``: health, power, temperature, AICore, memory/HBM, hugepages.

``npu-smi info`` prints one table; two layouts exist and both are parsed (see
tests/fixtures/npu-smi/README.md):

* 910 / 910B / A2 / A3: ``NPU Name | Health | Power(W) Temp(C) Hugepages-Usage(page)`` over
  ``Chip | Bus-Id | AICore(%) Memory-Usage(MB) HBM-Usage(MB)``;
* 310 / 310P: ``Chip Device`` under the NPU id (the card row repeated for each chip), no HBM column.

Columns are read by the names in the header rows, values as numbers and ``a / b`` pairs (spacing
varies), so extra or reordered columns do not shift the others.  ``npu-smi info -t usages -i N``
adds AI CPU, control CPU, vector and bandwidth utilizations where the release prints them (keys
are read by name; unknown keys are ignored).

Health is exported as a number (``triscope_npu_health``):

=========  =====
health     value
=========  =====
OK         0
Warning    1
Alarm      2
Critical   3
other/NA   -1
=========  =====

``npu-smi`` can be slow or hang (driver trouble is exactly when it does), so it never runs on the
tick path: a background thread runs it every ``interval`` seconds with a ``timeout`` (the whole
process group is killed when it expires) and ``collect()`` returns the latest parse.  When the
latest good output is older than ``stale_after`` seconds, ``collect()`` raises, so the sampler
marks the collector down with the reason (timeout, exit status, parse error) instead of
repeating old numbers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from triscope.agent.collectors.base import Availability, BaseCollector, CollectorUnavailable
from triscope.core.samples import EventRecord, Sample

log = logging.getLogger(__name__)

MIB = 1024 * 1024
HEALTH = {"OK": 0, "WARNING": 1, "ALARM": 2, "CRITICAL": 3}
DEFAULT_PATHS = ("/usr/local/sbin/npu-smi", "/usr/local/bin/npu-smi", "/usr/sbin/npu-smi")

_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_VALUE = re.compile(r"([^\s/]+)\s*/\s*([^\s/]+)|([^\s/]+)")
_HEALTH_WORDS = re.compile(r"^(OK|Warning|Alarm|Critical|Unknown|NA|N/A|Abnormal|-)$", re.IGNORECASE)
_VERSION = re.compile(r"npu-smi\s+(\S+)")


def health_value(text: str) -> int:
    """``OK`` 0, ``Warning`` 1, ``Alarm`` 2, ``Critical`` 3, anything else -1."""
    return HEALTH.get(text.strip().upper(), -1)


def _num(tok: str | None) -> float | None:
    if tok is None:
        return None
    try:
        return float(tok)
    except ValueError:
        return None  # "-", "NA", "N/A"


def _column_key(name: str) -> str:
    """``Hugepages-Usage(page)`` -> ``hugepages``, ``AICore(%)`` -> ``aicore``, ``Temp(C)`` -> ``temp``."""
    base = name.split("(", 1)[0].lower()
    base = re.sub(r"-usage$", "", base)
    return re.sub(r"[^a-z0-9]+", "_", base).strip("_")


@dataclass
class ChipStatus:
    npu: str
    chip: str
    name: str = ""
    health: str = ""
    bus_id: str = ""
    device: str = ""  # 310 layout: logical device id; A3: phy-id
    values: dict[str, float | None] = field(default_factory=dict)  # power, temp, aicore
    pairs: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)  # memory, hbm, hugepages


@dataclass
class NpuProcess:
    npu: str
    chip: str
    pid: int
    name: str
    memory_mb: float | None


@dataclass
class NpuInfo:
    version: str = ""
    chips: list[ChipStatus] = field(default_factory=list)
    processes: list[NpuProcess] | None = None  # None: the output had no process table
    idle_npus: set[str] = field(default_factory=set)  # "No running processes found in NPU N"


def _cells(line: str) -> list[str]:
    parts = line.strip().split("|")
    if parts and parts[0] == "":
        parts = parts[1:]
    if parts and parts[-1].strip() == "":
        parts = parts[:-1]
    return [p.strip() for p in parts]


def _parse_values(text: str, columns: Sequence[str]) -> tuple[dict[str, float | None], dict[str, tuple[float | None, float | None]]]:
    singles: dict[str, float | None] = {}
    pairs: dict[str, tuple[float | None, float | None]] = {}
    toks = list(_VALUE.finditer(text))
    for i, m in enumerate(toks):
        key = _column_key(columns[i]) if i < len(columns) else f"col{i}"
        if m.group(1) is not None:
            pairs[key] = (_num(m.group(1)), _num(m.group(2)))
        else:
            singles[key] = _num(m.group(3))
    return singles, pairs


def _process_row(info: NpuInfo, cells: list[str], joined: str) -> None:
    """A row of the process table: an idle NPU's line, or one process on a chip."""
    m = re.search(r"No running processes found in NPU\s+(\S+)", joined)
    if m:
        info.idle_npus.add(m.group(1))
        return
    if len(cells) < 4:
        return
    ids = cells[0].split()
    try:
        pid = int(cells[1])
    except ValueError:
        return
    info.processes = info.processes if info.processes is not None else []
    info.processes.append(NpuProcess(ids[0] if ids else "", ids[1] if len(ids) > 1 else "0", pid,
                                     cells[2], _num(cells[3].split()[0]) if cells[3].split() else None))


def _device_row(info: NpuInfo, cells: list[str], npu_cols: list[str], chip_cols: list[str],
                cur: dict[str, object] | None) -> dict[str, object] | None:
    """A row of the device table: an NPU's row (returned: the chip rows after it belong to it) or
    one of its chips' rows (added to ``info``).  Returns the NPU row now current."""
    toks = cells[0].split()
    if not toks:
        return cur
    if _HEALTH_WORDS.match(cells[1]):
        vals, prs = _parse_values(cells[2], npu_cols)
        return {"npu": toks[0], "name": " ".join(toks[1:]), "health": cells[1], "vals": vals, "pairs": prs}
    if _BUS_ID.match(cells[1]) and cur is not None:
        chip = ChipStatus(npu=str(cur["npu"]), chip=toks[0], name=str(cur["name"]), health=str(cur["health"]),
                          bus_id=cells[1].lower())
        if len(toks) > 1:
            chip.device = toks[1]
        vals, prs = _parse_values(cells[2], chip_cols)
        chip.values = {**dict(cur["vals"]), **vals}  # type: ignore[call-overload]
        chip.pairs = {**dict(cur["pairs"]), **prs}  # type: ignore[call-overload]
        info.chips.append(chip)
    return cur


def parse_info(text: str) -> NpuInfo:
    """Parse ``npu-smi info`` (either layout).  Raises ValueError when no device table is found."""
    info = NpuInfo()
    m = _VERSION.search(text)
    if m:
        info.version = m.group(1)
    npu_cols: list[str] = []
    chip_cols: list[str] = []
    section = ""
    cur: dict[str, object] | None = None  # the NPU row the next chip rows belong to
    saw_header = False
    for raw in text.splitlines():
        line = raw.strip()
        cells = _cells(line) if line.startswith("|") else []
        if not cells:
            continue
        joined = " ".join(cells)
        # header rows
        if len(cells) >= 3 and re.search(r"\bHealth\b", cells[1]) and cells[0].split()[:1] == ["NPU"]:
            npu_cols = cells[2].split()
            section, saw_header = "devices", True
        elif len(cells) >= 3 and cells[1].replace(" ", "").lower() == "bus-id":
            chip_cols = cells[2].split()
            section, saw_header = "devices", True
        elif "Process id" in joined or "Process name" in joined:
            section = "processes"
            if info.processes is None:
                info.processes = []
        elif section == "processes":
            _process_row(info, cells, joined)
        elif section == "devices" and len(cells) >= 3:
            cur = _device_row(info, cells, npu_cols, chip_cols, cur)
    if not saw_header:
        raise ValueError("no npu-smi device table (header 'NPU Name | Health | ...' not found)")
    return info


def parse_kv(text: str) -> list[tuple[str, str]]:
    """``key : value`` lines (``npu-smi info -t ...``) in order; the key ends at the first colon."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^\s*([^:]+?)\s*:\s*(.*?)\s*$", line)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


# ``-t usages`` keys (lower-cased, spaces collapsed) -> metric
USAGE_METRICS = {
    "aicpu usage rate(%)": "triscope_npu_aicpu_utilization_ratio",
    "ctrlcpu usage rate(%)": "triscope_npu_ctrlcpu_utilization_ratio",
    "aivector usage rate(%)": "triscope_npu_aivector_utilization_ratio",
    "npu utilization(%)": "triscope_npu_utilization_ratio",
    "hbm bandwidth usage rate(%)": "triscope_npu_hbm_bandwidth_utilization_ratio",
    "ddr bandwidth usage rate(%)": "triscope_npu_ddr_bandwidth_utilization_ratio",
}


def parse_usages(text: str) -> dict[str, dict[str, float]]:
    """``npu-smi info -t usages -i N`` -> ``{chip: {metric: ratio}}``.

    Keys print before the ``Chip ID`` line they belong to; output without ``Chip ID`` is chip 0.
    """
    out: dict[str, dict[str, float]] = {}
    acc: dict[str, float] = {}
    for key, val in parse_kv(text):
        k = " ".join(key.lower().split())
        if k == "chip id":
            out.setdefault(val, {}).update(acc)
            acc = {}
            continue
        metric = USAGE_METRICS.get(k)
        v = _num(val)
        if metric and v is not None:
            acc[metric] = v / 100.0
    if acc:
        out.setdefault("0", {}).update(acc)
    return out


def info_samples(info: NpuInfo) -> list[Sample]:
    out: list[Sample] = []
    for c in info.chips:
        lab = {"npu": c.npu, "chip": c.chip}
        out.append(Sample("triscope_npu_health", float(health_value(c.health)), lab))
        out.append(Sample("triscope_npu_info", 1.0, {**lab, "name": c.name, "bus_id": c.bus_id, "device": c.device}))
        power, temp, aicore = c.values.get("power"), c.values.get("temp"), c.values.get("aicore")
        if power is not None:
            out.append(Sample("triscope_npu_power_watts", power, lab))
        if temp is not None:
            out.append(Sample("triscope_npu_temperature_celsius", temp, lab))
        if aicore is not None:
            out.append(Sample("triscope_npu_aicore_utilization_ratio", aicore / 100.0, lab))
        for col, used_m, total_m, scale in (
            ("memory", "triscope_npu_memory_used_bytes", "triscope_npu_memory_total_bytes", MIB),
            ("hbm", "triscope_npu_hbm_used_bytes", "triscope_npu_hbm_total_bytes", MIB),
            ("hugepages", "triscope_npu_hugepages_used", "triscope_npu_hugepages_capacity", 1),
        ):
            pair = c.pairs.get(col)
            if pair is None:
                continue
            used, total = pair
            if used is not None:
                out.append(Sample(used_m, used * scale, lab))
            if total is not None:
                out.append(Sample(total_m, total * scale, lab))
    if info.processes is not None:
        counts: dict[tuple[str, str], int] = {}
        mem: dict[tuple[str, str], float] = {}
        for p in info.processes:
            counts[(p.npu, p.chip)] = counts.get((p.npu, p.chip), 0) + 1
            mem[(p.npu, p.chip)] = mem.get((p.npu, p.chip), 0.0) + (p.memory_mb or 0.0) * MIB
        for c in info.chips:
            key = (c.npu, c.chip)
            listed = key in counts or c.npu in info.idle_npus
            if not listed:
                continue  # the table was cut before this NPU: unknown, not zero
            lab = {"npu": c.npu, "chip": c.chip}
            out.append(Sample("triscope_npu_processes", float(counts.get(key, 0)), lab))
            out.append(Sample("triscope_npu_process_memory_bytes", mem.get(key, 0.0), lab))
    return out


class SmiError(Exception):
    pass


MAX_SMI_OUTPUT = 4 << 20     # bytes: npu-smi's tables for a 16-chip host are a few KiB


def run_smi(argv: Sequence[str], timeout: float, max_output: int = MAX_SMI_OUTPUT) -> str:
    """Run npu-smi; its whole process group is killed when ``timeout`` expires or its output passes
    ``max_output`` bytes (read as it comes, never more than that held).  Raises SmiError."""
    import selectors

    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env={**os.environ, "LC_ALL": "C"})
    except OSError as e:
        raise SmiError(f"cannot run {argv[0]}: {e.strerror or e}") from None
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    deadline = time.monotonic() + timeout
    problem = ""
    with selectors.DefaultSelector() as sel:
        for f in (proc.stdout, proc.stderr):
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                problem = f"{' '.join(argv[1:])}: npu-smi did not answer within {timeout:g} s (killed)"
                break
            for key, _ev in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fd]
                buf += chunk
                if len(buf) > max_output:
                    problem = (f"{' '.join(argv[1:])}: npu-smi wrote more than {max_output >> 20} MiB "
                               "(killed; its tables are a few KiB)")
                    break
            if problem:
                break
    if problem:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2.0)
        for f in (proc.stdout, proc.stderr):
            f.close()
        raise SmiError(problem)
    for f in (proc.stdout, proc.stderr):
        f.close()
    try:
        proc.wait(timeout=max(0.5, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=2.0)
        raise SmiError(f"{' '.join(argv[1:])}: npu-smi did not exit within {timeout:g} s (killed)") from None
    out, err = bytes(bufs[out_fd]), bytes(bufs[err_fd])
    if proc.returncode != 0:
        msg = (err or out).decode(errors="replace").strip().splitlines()
        raise SmiError(f"npu-smi {' '.join(argv[1:])} exited {proc.returncode}: {msg[-1] if msg else 'no output'}")
    return out.decode(errors="replace")


@dataclass
class _Latest:
    samples: list[Sample] = field(default_factory=list)
    ok_at: float | None = None  # monotonic time of the last good read
    error: str = ""
    info: NpuInfo | None = None


class NpuSmiCollector(BaseCollector):
    """npu-smi collector.

    ``npu_smi``: path of the executable (default: ``npu-smi`` on PATH, then /usr/local/sbin, /usr/local/bin).
    ``interval``: seconds between background runs; ``timeout``: per npu-smi run;
    ``usages``: also run ``npu-smi info -t usages -i N`` every ``usages_every`` cycles;
    ``stale_after``: seconds after which the last good output is no longer reported
    (default ``max(3 * interval, timeout + interval)``).
    """

    name = "npu"

    def __init__(self, *, npu_smi: str | None = None, interval: float = 1.0, timeout: float = 5.0,
                 usages: bool = True, usages_every: int = 5, stale_after: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.npu_smi = npu_smi
        self.interval = interval
        self.timeout = timeout
        self.usages = usages
        self.usages_every = max(1, usages_every)
        self.stale_after = stale_after if stale_after is not None else max(3 * interval, timeout + interval)
        self.clock = clock
        self._exe: str | None = None
        self._latest = _Latest()
        self._usages: dict[str, dict[str, dict[str, float]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_at: float | None = None
        self._events: list[EventRecord] = []
        self._last_health: dict[tuple[str, str], str] = {}
        self.runs = 0

    def _resolve(self) -> str:
        if self._exe:
            return self._exe
        if self.npu_smi:
            p = self.npu_smi if os.sep in self.npu_smi else shutil.which(self.npu_smi)
            if not p or not os.path.isfile(p):
                raise CollectorUnavailable(f"npu-smi not found at {self.npu_smi}", "pass the path of npu-smi with --npu-smi")
            if not os.access(p, os.X_OK):
                raise CollectorUnavailable(f"{p} is not executable", f"chmod +x {p}")
            self._exe = p
            return p
        p = shutil.which("npu-smi") or next((c for c in DEFAULT_PATHS if os.access(c, os.X_OK)), None)
        if not p:
            raise CollectorUnavailable("npu-smi not found on PATH (no Ascend NPU driver on this host)",
                                       "install the Ascend NPU driver (it ships npu-smi) or pass --npu-smi PATH")
        self._exe = p
        return p

    def check(self) -> Availability:
        try:
            exe = self._resolve()
            info = parse_info(run_smi([exe, "info"], self.timeout))
        except CollectorUnavailable as e:
            return Availability(False, e.reason, e.hint)
        except SmiError as e:
            return Availability(False, str(e), "check the Ascend driver (npu-smi info must work for this user)")
        except ValueError as e:
            return Availability(False, f"cannot read npu-smi output: {e}")
        npus = sorted({c.npu for c in info.chips})
        return Availability(True, f"{exe}: {len(npus)} NPU(s), {len(info.chips)} chip(s), npu-smi {info.version}")

    # ------------------------------------------------------------------ background
    def _start(self) -> None:
        if self._thread is None:
            self._resolve()
            self._started_at = self.clock()
            self._thread = threading.Thread(target=self._loop, name="npu-smi", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        cycle = 0
        while not self._stop.is_set():
            t0 = self.clock()
            self.poll_once(cycle)
            cycle += 1
            self._stop.wait(max(0.0, self.interval - (self.clock() - t0)))

    def poll_once(self, cycle: int = 0) -> None:
        """One background cycle: ``npu-smi info`` (and ``-t usages`` every ``usages_every`` cycles)."""
        exe = self._resolve()
        try:
            text = run_smi([exe, "info"], self.timeout)
            info = parse_info(text)
        except (SmiError, ValueError) as e:
            with self._lock:
                self._latest.error = str(e) if isinstance(e, SmiError) else f"cannot read npu-smi output: {e}"
            self.runs += 1
            return
        if self.usages and cycle % self.usages_every == 0:
            for npu in sorted({c.npu for c in info.chips}):
                try:
                    self._usages[npu] = parse_usages(run_smi([exe, "info", "-t", "usages", "-i", npu], self.timeout))
                except SmiError as e:
                    log.debug("npu-smi usages for NPU %s: %s", npu, e)
                    self._usages.pop(npu, None)
        samples = info_samples(info)
        for npu, per_chip in self._usages.items():
            for chip, metrics in per_chip.items():
                if not any(c.npu == npu and c.chip == chip for c in info.chips):
                    continue
                for metric, v in metrics.items():
                    samples.append(Sample(metric, v, {"npu": npu, "chip": chip}))
        events = []
        for c in info.chips:
            key = (c.npu, c.chip)
            prev = self._last_health.get(key)
            if prev is not None and prev != c.health:
                sev = {0: "info", 1: "warning", 2: "error", 3: "critical"}.get(health_value(c.health), "warning")
                events.append(EventRecord("npu_health", f"NPU {c.npu} chip {c.chip} health {prev} -> {c.health}", sev,  # type: ignore[arg-type]
                                          {"npu": c.npu, "chip": c.chip, "from": prev, "to": c.health, "bus_id": c.bus_id}))
            self._last_health[key] = c.health
        with self._lock:
            self._latest = _Latest(samples, self.clock(), "", info)
            self._events.extend(events)
        self.runs += 1

    # ------------------------------------------------------------------ protocol
    def collect(self, now: float) -> Iterable[Sample | EventRecord]:
        self._start()
        with self._lock:
            latest = self._latest
        t = self.clock()
        if latest.ok_at is None:
            started = self._started_at if self._started_at is not None else t
            if latest.error or t - started > self.stale_after:
                raise RuntimeError(latest.error or f"no npu-smi output yet after {t - started:.0f} s")
            return []  # first run still going: nothing yet, not an error
        age = t - latest.ok_at
        if age > self.stale_after:
            why = latest.error or "npu-smi has not finished a run"
            raise RuntimeError(f"npu-smi output is {age:.0f} s old: {why}")
        with self._lock:
            events, self._events = self._events, []
        return [*events, *latest.samples]

    # ------------------------------------------------------------------ workload attribution
    def process_table(self) -> tuple[list[NpuProcess], list[ChipStatus]] | None:
        """The process table and chips of the latest good run, while it is fresh (``stale_after``);
        None before the first run, when stale, or when the output had no process table."""
        with self._lock:
            latest = self._latest
        if latest.info is None or latest.ok_at is None or self.clock() - latest.ok_at > self.stale_after:
            return None
        if latest.info.processes is None:
            return None
        return list(latest.info.processes), list(latest.info.chips)

    def process_table_problem(self) -> str:
        with self._lock:
            return self._latest.error

    def process_source_check(self) -> Availability:
        """Can npu-smi run here (found and executable)?  Runs nothing."""
        try:
            return Availability(True, self._resolve())
        except CollectorUnavailable as e:
            return Availability(False, e.reason, e.hint)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 3.0)
            self._thread = None
