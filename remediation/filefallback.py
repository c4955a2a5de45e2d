"""The knobs-file adapter of ``dependency_fallback``: the fallback for hosts without Kubernetes.

On Kubernetes the fallback sets a key of a ConfigMap the service watches
(``triscope.remediation.actions``).  Off Kubernetes the same role is played by **one file per
workload that the service watches** (``DIR/NAME.yaml``; the contract is the inference service's
knobs file, examples/inference/README.md, "The knobs file: the fallback adapter's contract")::

    # triscope fallback: rule=R decision=ID until=2026-12-01T14:00:00Z
    version: 1
    kind: fallback
    workload: NAME
    knobs: {...}

The file is named by the trigger's ``workload`` label only (``cmd:NAME``, ``unit:NAME.service``,
``Kind/NAME``), never by the policy, so a trigger about one workload cannot switch another.  It is
written atomically (a temporary file in the same folder, fsync, rename: the service never reads
half a file), and the fallback row (``triscope.store.audit``) is written **before** the file: what
the file held before (its text, or none) is in the store before anything changes, so a decision
re-run after the engine died, and the revert, always know what to put back.  The row's ``value`` is
the SHA-256 of the bytes written, which the service reports as ``inference_knobs_file_info{sha256}``:
the revert touches the file only while it still holds exactly those bytes.

This module does not import the service (examples/ is not part of the installed package): the
service validates the knobs, and a file it refuses shows on its ``/metrics``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import AfterValidator, Discriminator, PlainValidator
from pydantic_core import PydanticCustomError

from triscope.core.configfile import ConfigModel, problem, show, variant
from triscope.core.cpulist import parse_cpulist
from triscope.core.durations import Duration
from triscope.core.timeparse import format_rfc3339
from triscope.remediation.actions import ActionContext, ActionResult
from triscope.remediation.params import DependencyFallbackParams
from triscope.remediation.targets import TargetModel
from triscope.remediation.workloads import SHARED_WORKLOADS, parse_workload
from triscope.store import audit
from triscope.store.reader import StoreReader

KEY_PREFIX = "file:"       # target keys of knobs-file fallbacks: file:DIR/NAME.yaml
FILE_KEY = "knobs"         # the fallback row's ``key`` column
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MAX_DIR = 180              # DIR/NAME.yaml fits the fallback row's 253-character column
MAX_PREVIOUS = 256 * 1024  # a larger file is not a knobs file: it is not kept (nor replaced)
_KNOB = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


# ---------------------------------------------------------------------------------------------- the policy
def _knobs_dir(value: str) -> str:
    if not value.startswith("/") or "\x00" in value:
        raise ValueError(f"{show(value)} is not an absolute path (the engine's working directory is no place "
                         "for a service's knobs)")
    if ".." in value.split("/"):
        raise ValueError(f"{show(value)}: '..' is not allowed in the folder")
    norm = os.path.normpath(value)
    if len(norm) > MAX_DIR:
        raise ValueError(f"must be at most {MAX_DIR} characters long (the file's path is kept in the audit table)")
    return norm


def _scalar(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, bool | int) or (isinstance(value, str) and len(value) <= 1024)


def _knobs(value: object) -> dict[str, object]:
    """``knobs: {pinned: true, workers: 8, cpu_affinity: null}``: knob names and plain values (the
    service validates what they mean)."""
    if not isinstance(value, dict):
        raise problem(f"must be a mapping of knob: value, not {show(value)}")
    if not value:
        raise problem("must set at least one knob (an empty fallback would change nothing)")
    for k, v in value.items():
        if not _KNOB.match(k):
            raise problem(f"{show(k)} is not a knob name (lower-case letters, digits, '_')", k)
        if not (_scalar(v) or (isinstance(v, list) and len(v) <= 1024 and all(
                _scalar(x) and x is not None for x in v))):
            raise problem(f"must be null, true/false, a number, a string or a list of those, not {show(v)}", k)
    return dict(value)


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("must be longer than 0s")
    return seconds


class KnobsFileDir(ConfigModel):
    """``file: {dir: DIR}``: the folder of the per-workload files (``DIR/NAME.yaml``)."""

    dir: Annotated[str, AfterValidator(_knobs_dir)]


class KnobsFileParams(ConfigModel):
    """``dependency_fallback`` off Kubernetes: write ``knobs`` to the workload's file in ``file.dir``;
    put the file back after ``hold`` clear, or ``ttl`` at the latest."""

    file: KnobsFileDir
    knobs: Annotated[dict[str, object], PlainValidator(_knobs)]
    ttl: Annotated[Duration, AfterValidator(_positive)] = 1800.0
    hold: Duration = 300.0


def _fallback_form(value: object) -> str:
    if isinstance(value, dict) and "file" in value:
        return "<both>" if "configmap" in value else "<file>"
    return "<configmap>"


def _both_forms(value: object) -> object:
    raise problem("give configmap (a Kubernetes ConfigMap's key) or file (a knobs file per workload, off "
                  "Kubernetes), not both", "file")


FallbackParams = Annotated[
    Annotated[DependencyFallbackParams, variant("configmap")] | Annotated[KnobsFileParams, variant("file")]
    | Annotated[object, AfterValidator(_both_forms), variant("both")],
    Discriminator(_fallback_form)]
"""``dependency_fallback``'s params: the ConfigMap form, or the knobs-file form (``file:`` given)."""


def target_problem(target: TargetModel, on_file: bool, slo_trigger: bool) -> PydanticCustomError | None:
    """Why a rule's target does not fit its form (None when it does): a knobs file is named by the
    trigger's workload label and nothing else; only a knobs-file fallback takes ``target.workload``."""
    if not on_file:
        if target.workload is None:
            return None
        return problem("a workload target names a knobs file: only a dependency_fallback with params.file takes one "
                       "(on Kubernetes: deployment: {from: workload})", "target", "workload")
    for other in ("namespace", "deployment", "node"):
        if getattr(target, other) is not None:
            return problem("a knobs-file fallback (params.file) is named by the trigger's workload label only: the "
                           "target is {workload: {from: workload}}, nothing else", "target", other)
    if target.workload is None:
        return problem("a knobs-file fallback (params.file) needs target.workload: {from: workload} (the file is "
                       "DIR/NAME.yaml, NAME from the trigger's workload label)", "target")
    if slo_trigger:
        return problem("an slo trigger names no workload (its labels are the node's): a knobs-file fallback needs an "
                       "alert or per-accelerator data", "target", "workload")
    return None


# ---------------------------------------------------------------------------------------------- the target
def workload_name(label: str, value: str) -> tuple[str, str]:
    """(NAME, "") for a workload label that names one workload, else ("", why not)."""
    if not value:
        return "", (f"the trigger's {label!r} label is empty: no workload to act on (there is no default; on "
                    "Kubernetes the agent leaves it empty and a knobs file cannot be named from a pod)")
    if value in SHARED_WORKLOADS:
        return "", (f"label {label}={value!r}: the accelerator is shared by several workloads, so no single one "
                    "can be named")
    kw = parse_workload(value)
    if kw is not None:
        name = kw[1]
    elif value.startswith("cmd:"):
        name = value[4:]
    elif value.startswith("unit:"):
        if not value.endswith(".service"):
            return "", f"label {label}={value!r} is not a service unit (unit:NAME.service)"
        name = value[5:-len(".service")]
    else:
        return "", f"label {label}={value!r} names no workload (cmd:NAME, unit:NAME.service or Kind/NAME)"
    if not NAME.match(name):
        return "", (f"label {label}={value!r}: {name!r} cannot name a knobs file (letters, digits, '_', '.', '-', "
                    "at most 63, starting with a letter or digit)")
    return name, ""


def resolve(params: KnobsFileParams, labels: Mapping[str, str],
            workload_label: str = "workload") -> tuple[dict[str, str], str]:
    """The target of a knobs-file fallback from the trigger's labels: ``workload`` (the label as the
    trigger wrote it), ``name``, ``file``, and ``namespace`` when the trigger names one; or the reason
    there is none."""
    value = str(labels.get(workload_label) or "")
    name, why = workload_name(workload_label, value)
    if why:
        return {}, why
    target = {"workload": value, "name": name, "file": os.path.join(params.file.dir, f"{name}.yaml")}
    if labels.get("namespace"):
        target["namespace"] = str(labels["namespace"])
    for k in ("node", "gpu", "npu", "chip"):     # where ``LOCAL_CPUS`` is looked up
        if labels.get(k):
            target[k] = str(labels[k])
    return target, ""


LOCAL_CPUS = "{accelerator.local_cpus}"
"""A knob value the engine replaces with the list of the trigger's accelerator's local CPUs (the
topology collector's ``local_cpus`` for its PCI device): ``knobs: {cpu_affinity: "{accelerator.local_cpus}"}``
moves a feeder running on the far socket next to its GPU."""


def local_cpus(store: StoreReader, target: Mapping[str, str]) -> tuple[list[int] | None, str]:
    """The local CPUs of the trigger's GPU on its node, from the stored topology; (None, why) when unknown."""
    node, gpu = target.get("node"), target.get("gpu")
    if not node or not gpu:
        return None, "the trigger names no node and GPU, so no accelerator's local CPUs"
    # the newest of each (a GPU swapped, a relabelled index: the older series are history)
    infos = [lv for lv in store.latest(node, metric="triscope_gpu_info") if str(lv.info.labels.get("gpu", "")) == gpu]
    bus = str(max(infos, key=lambda lv: lv.ts).info.labels.get("bus_id", "")) if infos else ""
    if not bus:
        return None, f"GPU {gpu} of node {node} has no stored PCI address (triscope_gpu_info)"
    topo = [lv for lv in store.latest(node, metric="triscope_accelerator_topology_info")
            if str(lv.info.labels.get("device", "")) == bus]
    if not topo:
        return None, f"no topology stored for GPU {gpu} ({bus}) of node {node} (the agent's topology collector)"
    cpus = parse_cpulist(str(max(topo, key=lambda lv: lv.ts).info.labels.get("local_cpus", "")))
    if cpus:
        return cpus, ""
    return None, f"the kernel gives no local CPUs for GPU {gpu} ({bus}) of node {node}"


def target_key(target: Mapping[str, str]) -> tuple[str, str]:
    """(key for cooldowns, the breaker and active fallbacks; description)."""
    return f"{KEY_PREFIX}{target['file']}", f"knobs file {target['file']} (workload {target['workload']})"


def is_file_row(fb: audit.FallbackRow) -> bool:
    return fb.target_key.startswith(KEY_PREFIX)


# ---------------------------------------------------------------------------------------------- the file
_guard = threading.Lock()
_locks: dict[str, threading.Lock] = {}


def _lock(path: Path) -> threading.Lock:
    """One lock per file: a revert never reads the file between a switch's row and its write."""
    with _guard:
        return _locks.setdefault(str(path), threading.Lock())


class Unusable(Exception):
    """The file there is not one the engine could put back later (too large, not UTF-8 text)."""


def read_current(path: Path) -> bytes | None:
    """The file's bytes, None when there is none; ``Unusable`` for a file that cannot be a knobs file
    the engine wrote or could restore; ``OSError`` when it cannot be read (tried again next time)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PREVIOUS + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_PREVIOUS:
        raise Unusable(f"{path} is larger than {MAX_PREVIOUS // 1024} KiB: not a knobs file")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise Unusable(f"{path} is not UTF-8 text") from None
    if b"\x00" in data:   # not text, and no text column (PostgreSQL's) can keep it
        raise Unusable(f"{path} is not text (NUL bytes)")
    return data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """A temporary file in the same folder, fsync, rename over ``path``, fsync the folder: the service
    sees the old file or the new one, never a part.  The folder is created (0755) when missing; the
    file keeps the mode of the one it replaces (0644 when new)."""
    folder = path.parent
    if not folder.is_dir():
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o755)   # mkdir's mode is cut by the umask
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o644
    tmp = folder / f".{path.name}.triscope-{os.getpid()}-{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(folder)


def _remove(path: Path) -> None:
    os.unlink(path)
    _fsync_dir(path.parent)


def render(rule: str, decision_id: int | None, until: float, name: str, knobs: Mapping[str, object]) -> bytes:
    """The file: the engine's ownership as a comment (the service ignores comments), then the document."""
    head = (f"# triscope fallback: rule={rule} decision={decision_id if decision_id is not None else '-'} "
            f"until={format_rfc3339(until)}\n"
            "# written by the remediation engine; put back (or removed) when the fallback ends, unless changed since\n")
    body = yaml.safe_dump({"version": 1, "kind": "fallback", "workload": name, "knobs": dict(knobs)},
                          sort_keys=False, default_flow_style=False, allow_unicode=False)
    return (head + body).encode("utf-8")


def _knobs_text(knobs: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in knobs.items())


# ---------------------------------------------------------------------------------------------- switch
def switch(ctx: ActionContext[KnobsFileParams]) -> ActionResult:
    """Write the fallback knobs to the workload's file (the row first, then the file)."""
    p = ctx.params
    path = Path(ctx.names["file"])
    ttl = p.ttl
    now = ctx.decided_ts if ctx.decided_ts is not None else time.time()
    expires = now + ttl
    resp: dict[str, object] = {"path": str(path), "knobs": dict(p.knobs), "expires_at": format_rfc3339(expires)}
    with _lock(path):
        existing = audit.active_fallbacks(ctx.store, ctx.target.key)
        if not ctx.dry_run:   # a dry-run fallback changed nothing: it does not stand in a live one's way
            existing = [fb for fb in existing if not fb.dry_run]
        resume = bool(existing) and ctx.resumed and existing[0].rule == ctx.rule_name \
            and abs(existing[0].switched_at - now) < 1e-3
        if existing and not resume:
            fb = existing[0]
            return ActionResult("suppressed", f"fallback {path} already active since {format_rfc3339(fb.switched_at)} "
                                f"(rule {fb.rule})", {**resp, "fallback_id": fb.id}, rail="live_state")
        # the trigger's GPU's local CPUs, after the check above: an active fallback is not re-resolved
        knobs = dict(p.knobs)
        for k, v in knobs.items():
            if v == LOCAL_CPUS:
                cpus, why = local_cpus(ctx.store, ctx.names)
                if cpus is None:
                    return ActionResult("failed", f"knob {k}: {why}", {**resp, "knob": k})
                knobs[k] = cpus
        data = render(ctx.rule_name, ctx.decision_id, expires, ctx.names["name"], knobs)
        digest = sha256(data)
        resp.update(sha256=digest, knobs=knobs)
        if resume:
            return _resume(ctx, existing[0], path, data, resp)
        try:
            cur = read_current(path)
        except Unusable as e:
            return ActionResult("suppressed", f"{e}: it could not be put back later; left as is", resp,
                                rail="live_state")
        except OSError as e:
            return ActionResult("failed", f"cannot read {path}: {e.strerror or e}", resp)
        resp["previous"] = {"exists": cur is not None, **({"sha256": sha256(cur)} if cur is not None else {})}
        fid = audit.add_fallback(ctx.store, audit.FallbackRow(
            rule=ctx.rule_name, target_key=ctx.target.key, namespace=ctx.names.get("namespace", ""),
            configmap=str(path), key=FILE_KEY, value=digest,
            previous_value=cur.decode("utf-8") if cur is not None else None,
            trigger_key=ctx.episode or ctx.trigger_key, dry_run=ctx.dry_run, switched_at=now, expires_at=expires,
            hold_s=p.hold))
        resp["fallback_id"] = fid
        if ctx.dry_run:
            return ActionResult("dry_run", f"would write {path} (knobs {_knobs_text(knobs)}) for {ttl:g}s", resp)
        return _write(ctx, fid, path, data, resp, f"wrote {path} (knobs {_knobs_text(knobs)}) until {format_rfc3339(expires)}")


def _write(ctx: ActionContext[KnobsFileParams], fid: int, path: Path, data: bytes, resp: dict[str, object],
           reason: str) -> ActionResult:
    try:
        write_atomically(path, data)
    except OSError as e:
        audit.end_fallback(ctx.store, fid, "failed", time.time(), f"not written: {e.strerror or e}")
        return ActionResult("failed", f"cannot write {path}: {e.strerror or e}", resp)
    ctx.on_issued(time.time())
    return ActionResult("acted", reason, resp, issued_ts=time.time())


def _resume(ctx: ActionContext[KnobsFileParams], fb: audit.FallbackRow, path: Path, data: bytes,
            resp: dict[str, object]) -> ActionResult:
    """This decision's row is there (the engine stopped after recording it): its file is written, or
    still to write, or someone changed it meanwhile."""
    resp.update(fallback_id=fb.id, resumed=True,
                previous={"exists": fb.previous_value is not None})
    if fb.dry_run:
        return ActionResult("dry_run", f"would write {path} (before the engine restarted)", resp)
    try:
        cur = read_current(path)
    except Unusable as e:
        cur, changed = None, str(e)
    else:
        changed = ""
    if cur is not None and sha256(cur) == fb.value:
        ctx.on_issued(time.time())
        return ActionResult("acted", f"{path} was written by this decision before the engine restarted", resp,
                            issued_ts=time.time())
    if not changed and (cur.decode("utf-8") if cur is not None else None) != fb.previous_value:
        changed = f"{path} changed while the engine was stopped"
    if changed:
        audit.end_fallback(ctx.store, fb.id, "reverted", time.time(), f"not written: {changed}")
        return ActionResult("suppressed", f"{changed}: left as is", resp, rail="live_state")
    if sha256(data) != fb.value:
        audit.set_fallback_value(ctx.store, fb.id, sha256(data))
    return _write(ctx, fb.id, path, data, resp, f"wrote {path} (the engine stopped before writing it)")


# ---------------------------------------------------------------------------------------------- revert
def revert(fb: audit.FallbackRow, reason: str) -> ActionResult:
    """Put the file back: its previous content (atomically), or no file when there was none, while it
    still holds the bytes the fallback wrote; a file changed since is left as it is."""
    path = Path(fb.configmap)
    what = "restore the previous" if fb.previous_value is not None else "remove"
    resp: dict[str, object] = {"path": str(path), "sha256": fb.value, "fallback_id": fb.id, "why": reason,
                            "restored": "previous" if fb.previous_value is not None else "removed"}
    if fb.dry_run:
        return ActionResult("dry_run", f"would {what} {path} ({reason})", resp)
    with _lock(path):
        try:
            cur = read_current(path)
        except Unusable as e:
            resp["restored"] = None
            return ActionResult("acted", f"{e}: changed by someone else: left as is", resp)
        # an OSError (unreadable) goes up: a failed revert, tried again at the next run
        if cur is None:
            resp["restored"] = None
            return ActionResult("acted", f"{path} is gone: nothing to revert", resp)
        if sha256(cur) != fb.value:
            resp.update(restored=None, found_sha256=sha256(cur))
            return ActionResult("acted", f"{path} changed by someone else: left as is", resp)
        if fb.previous_value is None:
            _remove(path)
            return ActionResult("acted", f"removed {path} ({reason})", resp, issued_ts=time.time())
        previous = fb.previous_value.encode("utf-8")
        write_atomically(path, previous)
        resp["restored_sha256"] = sha256(previous)
        return ActionResult("acted", f"restored the previous {path} ({reason})", resp, issued_ts=time.time())


__all__ = ["KEY_PREFIX", "FallbackParams", "KnobsFileDir", "KnobsFileParams", "is_file_row", "target_problem",
           "read_current", "render", "resolve", "revert", "switch", "target_key", "workload_name", "write_atomically"]
