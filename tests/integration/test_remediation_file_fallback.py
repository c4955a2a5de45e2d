"""The knobs-file adapter of ``dependency_fallback`` (hosts without Kubernetes): the engine writes the
workload's knobs file, the real inference service (examples/inference, CPU stand-in) applies it, and
the revert puts the file back.  Real parts throughout: the engine, a store (SQLite; PostgreSQL where
the stored previous content matters), the store's write path for the per-accelerator verdicts, the
service as a process with its file watcher; no Kubernetes API is configured.  A death of the engine
is injected where it would happen, as in test_remediation_recovery.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_server import open_store, policy_text, webhook_payload

from triscope.core.samples import Sample, Tick
from triscope.remediation import filefallback
from triscope.remediation.engine import Engine
from triscope.remediation.params import DependencyFallbackParams
from triscope.remediation.policy import PolicyError, parse_policy
from triscope.store import audit

REPO = Path(__file__).resolve().parents[2]
STATES = ("idle", "demand-limited", "compute-bound", "balanced", "io-saturated", "staging-bound", "network-bound")
NODE = "h200-a"
RULE_NAME = "pinned-buffers-when-staging-bound"
KNOBS = {"pinned": True, "workers": 8, "cpu_affinity": None, "pin_churn": False}
SETTINGS = "  evaluate_interval: 1s\n  breaker: {window: 15m, max_targets: 50, max_percent: 100, min_population: 1000}\n"


def rule(folder: Path, *, trigger: str = "{mismatch: staging-bound, for: 20s}", ttl: str = "30m", hold: str = "5m",
         cooldown: str = "0s", name: str = RULE_NAME) -> str:
    return f"""  - name: {name}
    trigger: {trigger}
    action: dependency_fallback
    target: {{workload: {{from: workload}}}}
    params:
      file: {{dir: {folder}}}
      knobs: {{pinned: true, workers: 8, cpu_affinity: null, pin_churn: false}}
      ttl: {ttl}
      hold: {hold}
    limits: {{cooldown: {cooldown}}}
"""


def engine(store: Any, rules: str, *, settings: str = SETTINGS, dry_run: bool = False) -> Engine:
    return Engine(store, parse_policy(policy_text(rules, settings), "policy.yaml"), kube=None, dry_run=dry_run)


@pytest.fixture
def any_store(db_url: str) -> Iterator[Any]:
    st = open_store(db_url)
    yield st
    st.close()


def write_verdicts(store: Any, gpus: list[tuple[str, str, str]], now: float, seconds: int = 60) -> None:
    """``gpus``: (gpu, state, workload) held for ``seconds`` up to ``now``, as the agent's tracker writes
    them off Kubernetes (docs/workloads.md sections 1 and 2): every state 0/1 per accelerator with the
    dominant workload's labels (``namespace``, ``pod``, ``container`` empty, ``workload`` cmd:/unit:)."""
    ticks = []
    for i in range(seconds // 2 + 1):
        samples = []
        for gpu, state, workload in gpus:
            wl = {"gpu": gpu, "namespace": "", "pod": "", "container": "", "workload": workload}
            samples += [Sample("triscope_mismatch_state", 1.0 if s == state else 0.0, {"state": s, **wl}) for s in STATES]
        ticks.append(Tick(now - seconds + 2 * i, samples))
    store.write_ticks(NODE, ticks, rollup=False)


def alert(workload: str | None, fingerprint: str, status: str = "firing") -> dict[str, Any]:
    labels = {"alertname": "TriscopeStagingBound", "node": NODE, "gpu": "0"}
    if workload is not None:
        labels["workload"] = workload
    return {"labels": labels, "fingerprint": fingerprint, "status": status, "startsAt": "2099-01-01T00:00:00Z"}


def decisions(store: Any) -> list[audit.AuditRow]:
    return [r for r in audit.audit_log(store, limit=1000, newest_first=False) if r.outcome != "in_progress"]


# the service ---------------------------------------------------------------------------------------------
class Service:
    """``python -m examples.inference.server`` as a process (CPU stand-in), watching its knobs file."""

    def __init__(self, knobs_file: Path, workload: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "examples.inference.server", "--backend", "cpu", "--port", "0", "--net-tool", "off",
             "--workload", workload, "--knobs-file", str(knobs_file), "--set", "workers=2"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ready = json.loads(self.proc.stdout.readline())
        assert ready["event"] == "ready", ready
        self.url = ready["url"]

    def knobs(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/admin/knobs", timeout=10) as r:
            return dict(json.loads(r.read()))

    def set_knobs(self, values: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(self.url + "/admin/knobs", data=json.dumps(values).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return dict(json.loads(r.read()))

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return str(r.read().decode())

    def wait_for(self, check: Callable[[dict[str, Any]], bool], within: float) -> tuple[dict[str, Any], float]:
        """The first GET /admin/knobs answer that passes ``check`` within ``within`` seconds, and when."""
        t0 = time.monotonic()
        while True:
            rep = self.knobs()
            if check(rep):
                return rep, time.monotonic() - t0
            if time.monotonic() - t0 > within:
                raise AssertionError(f"not within {within}s: {rep}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


@pytest.fixture
def knobs_dir(tmp_path: Path) -> Path:
    return tmp_path / "knobs"   # not there yet: the engine creates it


def test_staging_bound_workload_gets_its_knobs_file_and_the_service_applies_it(store: Any, knobs_dir: Path) -> None:
    """GPU 0 carries cmd:inference-b in staging-bound, GPU 1 cmd:inference-a demand-limited: one stored-data
    evaluation writes inference-b's file only; the service applies it within 2 s (source file, pinned back
    on, the admin fault gone) and reports the SHA-256 the engine recorded; the TTL revert removes the file
    and the service returns to its start-up knobs."""
    svc = Service(knobs_dir / "inference-b.yaml", "inference-b")
    try:
        faulted = svc.set_knobs({"pinned": False})
        assert faulted["knobs"]["pinned"] is False and faulted["source"] == "admin"
        assert faulted["overrides"] == {"pinned": False}
        now = time.time()
        write_verdicts(store, [("0", "staging-bound", "cmd:inference-b"), ("1", "demand-limited", "cmd:inference-a")],
                       now)
        eng = engine(store, rule(knobs_dir, ttl="5s"))
        assert eng.evaluate_triggers(now) == 1   # GPU 0's episode; GPU 1 never triggers
        assert eng.drain(30)
        assert eng.evaluate_triggers(now + 1) == 0   # the same episode acts once

        path = knobs_dir / "inference-b.yaml"
        assert sorted(os.listdir(knobs_dir)) == ["inference-b.yaml"]   # nothing for inference-a, no temp file left
        assert stat.S_IMODE(knobs_dir.stat().st_mode) == 0o755
        data = path.read_bytes()
        digest = filefallback.sha256(data)
        [row] = decisions(store)
        first = data.decode().splitlines()[0]
        assert first.startswith(f"# triscope fallback: rule={RULE_NAME} decision={row.id} until="), first
        assert yaml.safe_load(data) == {"version": 1, "kind": "fallback", "workload": "inference-b", "knobs": KNOBS}

        rep, took = svc.wait_for(lambda r: r["file_sha256"] == digest, within=2.0)
        assert rep["source"] == "file" and rep["file_error"] is None, rep
        assert rep["knobs"]["pinned"] is True and rep["knobs"]["workers"] == 8   # (its pool resizes on its own time)
        assert rep["overrides"] == {}   # the admin fault is gone: the file wins
        assert f'sha256="{digest}"' in svc.metrics()

        # the audit: the decision names the file and the workload it came from
        assert (row.rule, row.trigger_kind, row.action, row.outcome) == (RULE_NAME, "mismatch", "dependency_fallback",
                                                                         "acted"), row.reason
        assert row.target_key == f"file:{path}"
        assert row.target == f"knobs file {path} (workload cmd:inference-b)"
        assert row.namespace in (None, "")
        assert row.params["target"] == {"workload": "cmd:inference-b", "name": "inference-b", "file": str(path),
                                        "node": NODE, "gpu": "0"}     # where {accelerator.local_cpus} is read
        assert row.params["workload"]["workload"] == "cmd:inference-b" and row.params["workload"]["gpu"] == "0"
        resp = row.response
        assert resp["path"] == str(path) and resp["sha256"] == digest and resp["knobs"] == KNOBS
        assert resp["previous"] == {"exists": False} and resp["expires_at"].endswith("Z")
        [fb] = audit.active_fallbacks(store)
        assert (fb.target_key, fb.namespace, fb.configmap, fb.key, fb.value, fb.previous_value) == (
            f"file:{path}", "", str(path), "knobs", digest, None)

        # the TTL runs out: there was no file, so there is none again, and the service is back at its start-up knobs
        assert eng.revert_fallbacks(time.time() + 6) == 1
        assert not path.exists() and os.listdir(knobs_dir) == []
        rep, _ = svc.wait_for(lambda r: r["file_sha256"] == "", within=2.0)
        assert rep["knobs"]["workers"] == 2 and rep["knobs"]["pinned"] is True and rep["overrides"] == {}
        rev = decisions(store)[-1]
        assert (rev.trigger_kind, rev.outcome, rev.target_key) == ("revert", "acted", f"file:{path}")
        assert rev.reason.startswith(f"removed {path} (time-to-live ran out")
        assert audit.active_fallbacks(store) == []
        eng.close()
        print(f"service applied the fallback {took * 1000:.0f} ms after the engine's decision finished")
    finally:
        svc.stop()


def test_revert_after_hold_restores_the_previous_file(any_store: Any, knobs_dir: Path) -> None:
    """An operator's experiment file was there: it is kept in the store before the fallback is written,
    and once the alert has resolved for ``hold`` it comes back byte for byte, with its mode."""
    knobs_dir.mkdir()
    path = knobs_dir / "inference-b.yaml"
    before = b"# the team's experiment\nversion: 1\nkind: experiment\nknobs: {batch_size: 32, max_wait_ms: 2}\n\xe2\x9c\x93: 1\n"
    path.write_bytes(before)
    path.chmod(0o640)
    eng = engine(any_store, rule(knobs_dir, trigger="{alert: TriscopeStagingBound}", hold="2s"))
    assert eng.submit_alerts(webhook_payload([alert("cmd:inference-b", "fp-b")])) == (1, 1)
    assert eng.drain(30)
    [row] = decisions(any_store)
    assert row.outcome == "acted", row.reason
    assert row.response["previous"] == {"exists": True, "sha256": filefallback.sha256(before)}
    assert yaml.safe_load(path.read_bytes())["knobs"] == KNOBS
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    [fb] = audit.active_fallbacks(any_store)
    assert fb.previous_value == before.decode()

    assert eng.revert_fallbacks() == 0   # still firing
    eng.submit_alerts(webhook_payload([alert("cmd:inference-b", "fp-b", status="resolved")], status="resolved"))
    assert eng.drain(30)
    assert eng.revert_fallbacks() == 0   # resolved, but not for the hold period yet
    assert eng.revert_fallbacks(time.time() + 2.5) == 1
    eng.close()
    assert path.read_bytes() == before and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(os.listdir(knobs_dir)) == ["inference-b.yaml"]
    rev = decisions(any_store)[-1]
    assert rev.outcome == "acted" and rev.reason.startswith(f"restored the previous {path} (trigger clear for"), rev.reason


def test_a_file_changed_or_removed_by_someone_else_is_left_as_is(store: Any, knobs_dir: Path) -> None:
    eng = engine(store, rule(knobs_dir, trigger="{alert: TriscopeStagingBound}", ttl="1s"))
    eng.submit_alerts(webhook_payload([alert("cmd:inference-b", "fp-b"), alert("cmd:inference-c", "fp-c")]))
    assert eng.drain(30)
    assert [r.outcome for r in decisions(store)] == ["acted", "acted"]
    changed = b"version: 1\nkind: experiment\nknobs: {pinned: false}\n"
    (knobs_dir / "inference-b.yaml").write_bytes(changed)   # an operator's edit
    (knobs_dir / "inference-c.yaml").unlink()                # or its removal
    assert eng.revert_fallbacks(time.time() + 2) == 2
    eng.close()
    assert (knobs_dir / "inference-b.yaml").read_bytes() == changed and not (knobs_dir / "inference-c.yaml").exists()
    reverts = {r.target_key.rsplit("/", 1)[1]: r for r in decisions(store) if r.trigger_kind == "revert"}
    assert reverts["inference-b.yaml"].outcome == "acted"
    assert reverts["inference-b.yaml"].reason.endswith("changed by someone else: left as is")
    assert reverts["inference-b.yaml"].response["found_sha256"] == filefallback.sha256(changed)
    assert reverts["inference-c.yaml"].outcome == "acted"
    assert reverts["inference-c.yaml"].reason.endswith("is gone: nothing to revert")
    assert audit.active_fallbacks(store) == []


@pytest.mark.parametrize("content, why", [
    (b"version: 1\nknobs: {pinned: \xff}\n", "is not UTF-8 text"),
    (b"version: 1\x00\n", "is not text (NUL bytes)"),
    (b"# " + b"x" * (256 * 1024) + b"\n", "is larger than 256 KiB: not a knobs file"),
], ids=["not-utf8", "nul", "too-large"])
def test_a_file_that_could_not_be_put_back_is_left_alone(store: Any, knobs_dir: Path, content: bytes, why: str) -> None:
    knobs_dir.mkdir()
    path = knobs_dir / "inference-b.yaml"
    path.write_bytes(content)
    eng = engine(store, rule(knobs_dir, trigger="{alert: TriscopeStagingBound}"))
    eng.submit_alerts(webhook_payload([alert("cmd:inference-b", "fp")]))
    assert eng.drain(30)
    eng.close()
    [row] = decisions(store)
    assert (row.outcome, row.rail) == ("suppressed", "live_state")
    assert row.reason == f"{path} {why}: it could not be put back later; left as is"
    assert path.read_bytes() == content and audit.active_fallbacks(store) == []


def test_dry_run_reads_and_audits_but_writes_nothing(store: Any, knobs_dir: Path) -> None:
    now = time.time()
    write_verdicts(store, [("0", "staging-bound", "cmd:inference-b")], now)
    eng = engine(store, rule(knobs_dir, ttl="30s"), dry_run=True)
    assert eng.evaluate_triggers(now) == 1
    assert eng.drain(30)
    [row] = decisions(store)
    path = knobs_dir / "inference-b.yaml"
    assert row.outcome == "dry_run" and row.dry_run
    assert row.reason == (f"would write {path} (knobs pinned=true, workers=8, cpu_affinity=null, pin_churn=false) "
                          "for 30s")
    assert not knobs_dir.exists()   # not even the folder
    [fb] = audit.active_fallbacks(store)
    assert fb.dry_run and fb.previous_value is None
    assert eng.revert_fallbacks(now + 31) == 1
    eng.close()
    rev = decisions(store)[-1]
    assert rev.outcome == "dry_run" and rev.reason.startswith(f"would remove {path}") and not knobs_dir.exists()


def test_a_dry_run_fallback_does_not_stand_in_a_live_one_s_way(store: Any, knobs_dir: Path) -> None:
    """Scenarios watched in dry-run, then the engine switched to acting: the dry-run row, which
    changed nothing, does not suppress the live decision (nor do dry-run's claims and cooldowns)."""
    now = time.time()
    write_verdicts(store, [("0", "staging-bound", "cmd:inference-b")], now)
    dry = engine(store, rule(knobs_dir, ttl="30m"), dry_run=True)
    assert dry.evaluate_triggers(now) == 1 and dry.drain(30)
    dry.close()
    [fb] = audit.active_fallbacks(store)
    assert fb.dry_run
    # the fault cleared, then back: a new episode
    write_verdicts(store, [("0", "demand-limited", "cmd:inference-b")], now + 40, seconds=38)
    later = now + 100
    write_verdicts(store, [("0", "staging-bound", "cmd:inference-b")], later, seconds=58)
    live = engine(store, rule(knobs_dir, ttl="30m"))
    assert live.evaluate_triggers(later + 2) >= 1 and live.drain(30)
    live.close()
    last = decisions(store)[-1]
    assert (last.outcome, last.dry_run) == ("acted", False), (last.outcome, last.rail, last.reason)
    assert (knobs_dir / "inference-b.yaml").exists()


def test_an_episode_begun_in_dry_run_is_acted_on_when_the_engine_is_switched_to_acting(store: Any,
                                                                                      knobs_dir: Path) -> None:
    """The case seen on hardware: ``--dry-run`` while faults are injected, stopped and started again acting
    while the staging-bound episode that began in dry-run goes on.  The acting engine writes the file
    (dry-run's claim of the episode and its cooldown stamp were its own), once."""
    now = time.time()
    write_verdicts(store, [("0", "staging-bound", "cmd:inference-b")], now)
    dry = engine(store, rule(knobs_dir, cooldown="10m"), dry_run=True)
    assert dry.evaluate_triggers(now) == 1 and dry.drain(30)
    dry.close()
    [first] = decisions(store)
    assert (first.outcome, first.dry_run) == ("dry_run", True) and not knobs_dir.exists()
    live = engine(store, rule(knobs_dir, cooldown="10m"))   # the episode still going on
    assert live.evaluate_triggers(time.time()) == 1 and live.drain(30)
    live.close()
    last = decisions(store)[-1]
    assert last.trigger_key == first.trigger_key
    assert (last.outcome, last.rail, last.dry_run) == ("acted", None, False), (last.outcome, last.rail, last.reason)
    assert (knobs_dir / "inference-b.yaml").exists()
    again = engine(store, rule(knobs_dir, cooldown="10m"))   # restarted again: the episode was handled
    assert again.evaluate_triggers(time.time()) == 1 and again.drain(30)
    again.close()
    assert [(r.outcome, r.rail) for r in decisions(store)[2:]] == [("suppressed", "duplicate")]


@pytest.mark.parametrize("workload, reason", [
    ("shared", "target workload: label workload='shared': the accelerator is shared by several workloads"),
    ("other", "target workload: label workload='other': the accelerator is shared by several workloads"),
    ("", "target workload: the trigger's 'workload' label is empty: no workload to act on (there is no default"),
    (None, "target workload: the trigger's 'workload' label is empty"),
    ("cmd:../etc", "target workload: label workload='cmd:../etc': '../etc' cannot name a knobs file"),
    ("cmd:", "target workload: label workload='cmd:': '' cannot name a knobs file"),
    ("unit:sshd.socket", "target workload: label workload='unit:sshd.socket' is not a service unit"),
    ("inference-b", "target workload: label workload='inference-b' names no workload (cmd:NAME, unit:NAME.service"),
    ("cmd:" + "x" * 64, f"target workload: label workload='cmd:{'x' * 64}': '{'x' * 64}' cannot name a knobs file"),
], ids=["shared", "other", "empty", "missing", "dotdot", "cmd-empty", "socket-unit", "bare-name", "too-long"])
def test_a_label_that_names_no_single_workload_is_suppressed(store: Any, knobs_dir: Path, workload: str | None,
                                                            reason: str) -> None:
    eng = engine(store, rule(knobs_dir, trigger="{alert: TriscopeStagingBound}"))
    eng.submit_alerts(webhook_payload([alert(workload, "fp")]))
    assert eng.drain(30)
    eng.close()
    [row] = decisions(store)
    assert (row.outcome, row.rail) == ("suppressed", "target") and reason in row.reason, row.reason
    assert not knobs_dir.exists() and audit.active_fallbacks(store) == []


def test_each_workload_label_form_names_its_own_file(store: Any, knobs_dir: Path) -> None:
    """cmd:NAME, unit:NAME.service and Kind/NAME (alerts), and a stored verdict whose GPU is shared
    (suppressed) beside one whose workload is a unit."""
    eng = engine(store, rule(knobs_dir, trigger="{alert: TriscopeStagingBound}")
                 + rule(knobs_dir, name="staging-stored"))
    eng.submit_alerts(webhook_payload([alert("cmd:inference-b", "1"), alert("unit:inference-u.service", "2"),
                                     alert("Deployment/web", "3")]))
    now = time.time()
    write_verdicts(store, [("0", "staging-bound", "shared"), ("1", "staging-bound", "unit:batch.service")], now)
    assert eng.evaluate_triggers(now) == 2
    assert eng.drain(30)
    eng.close()
    assert sorted(os.listdir(knobs_dir)) == ["batch.yaml", "inference-b.yaml", "inference-u.yaml", "web.yaml"]
    assert {n: yaml.safe_load((knobs_dir / n).read_bytes())["workload"] for n in os.listdir(knobs_dir)} == {
        "batch.yaml": "batch", "inference-b.yaml": "inference-b", "inference-u.yaml": "inference-u", "web.yaml": "web"}
    got = sorted((r.rule, r.outcome, r.rail or "", r.target_key.rsplit("/", 1)[-1]) for r in decisions(store))
    assert got == [(RULE_NAME, "acted", "", "inference-b.yaml"), (RULE_NAME, "acted", "", "inference-u.yaml"),
                   (RULE_NAME, "acted", "", "web.yaml"), ("staging-stored", "acted", "", "batch.yaml"),
                   ("staging-stored", "suppressed", "target", "")], got


def test_cooldown_and_breaker_still_apply(store: Any, knobs_dir: Path) -> None:
    # cooldown: a second trigger for the same file within the cooldown is suppressed (before the live check)
    eng = engine(store, rule(knobs_dir, trigger="{alert: TriscopeStagingBound}", cooldown="10m"))
    eng.submit_alerts(webhook_payload([alert("cmd:inference-b", "first")]))
    assert eng.drain(30)
    eng.submit_alerts(webhook_payload([alert("cmd:inference-b", "second")]))
    assert eng.drain(30)
    eng.close()
    rows = decisions(store)
    assert [(r.outcome, r.rail) for r in rows] == [("acted", None), ("suppressed", "cooldown")], rows
    assert rows[1].target_key == f"file:{knobs_dir / 'inference-b.yaml'}"
    assert "was acted on" in rows[1].reason and "cooldown 600s" in rows[1].reason

    # the breaker: with max_targets 1, a second workload's file within the window opens it
    other = knobs_dir.parent / "other-knobs"
    eng = engine(store, rule(other, trigger="{alert: TriscopeStagingBound}", name="second-rule"),
                 settings="  breaker: {window: 15m, max_targets: 1, max_percent: 100, min_population: 1000}\n")
    eng.submit_alerts(webhook_payload([alert("cmd:inference-c", "third")]))
    assert eng.drain(30)
    eng.close()
    last = decisions(store)[-1]
    assert (last.outcome, last.rail) == ("suppressed", "breaker") and "circuit breaker opened" in last.reason
    assert not other.exists()


class Crash(BaseException):
    """The engine process dies here."""


@pytest.mark.parametrize("after", [False, True], ids=["before-the-write", "after-the-write"])
def test_a_decision_re_run_after_a_death_writes_once_and_knows_what_to_restore(
        any_store: Any, knobs_dir: Path, monkeypatch: pytest.MonkeyPatch, after: bool) -> None:
    """The fallback row (with the previous content) is stored before the file is written: an engine that
    died before the write writes it when the decision is re-run; one that died after it recognises its own
    file (the decision id in its first line, the SHA-256 in the row) and does not write again."""
    knobs_dir.mkdir()
    path = knobs_dir / "inference-b.yaml"
    before = b"version: 1\nknobs: {batch_size: 8}\n"
    path.write_bytes(before)
    real = filefallback.write_atomically

    def dying(p: Path, data: bytes) -> None:
        if after:
            real(p, data)
        raise Crash()

    monkeypatch.setattr(filefallback, "write_atomically", dying)
    rules = rule(knobs_dir, trigger="{alert: TriscopeStagingBound}", ttl="1s")
    first = engine(any_store, rules)
    first.submit_alerts(webhook_payload([alert("cmd:inference-b", "fp")]))
    assert first.drain(30)
    first.close()
    [row] = audit.audit_log(any_store)
    assert row.outcome == "in_progress"
    [fb] = audit.active_fallbacks(any_store)
    assert fb.previous_value == before.decode()
    assert (path.read_bytes() != before) is after
    written = path.stat().st_ino
    monkeypatch.undo()

    second = engine(any_store, rules)
    assert second.resume() == (1, 0)
    assert second.drain(30)
    [row] = audit.audit_log(any_store)
    assert row.outcome == "acted", row.reason
    assert row.reason.startswith(f"{path} was written by this decision before the engine restarted" if after
                                 else f"wrote {path} (the engine stopped before writing it)"), row.reason
    assert row.reason.endswith("(re-run after the engine restarted)")
    data = path.read_bytes()
    assert data.decode().startswith(f"# triscope fallback: rule={RULE_NAME} decision={row.id} ")
    assert filefallback.sha256(data) == audit.active_fallbacks(any_store)[0].value
    assert (path.stat().st_ino == written) is after   # after: not written a second time
    assert second.revert_fallbacks(time.time() + 2) == 1
    second.close()
    assert path.read_bytes() == before


# the policy ------------------------------------------------------------------------------------------------
FILE_RULE = """  - name: fb
    trigger: {mismatch: staging-bound, for: 20s}
    action: dependency_fallback
    target: {workload: {from: workload}}
    params:
      file: {dir: /var/lib/triscope/knobs}
      knobs: {pinned: true}
"""


def test_the_file_form_loads_without_kubernetes_settings() -> None:
    pol = parse_policy(policy_text(FILE_RULE, "  evaluate_interval: 5s\n"), "p.yaml")
    r = pol.rule("fb")
    assert r.knobs_file and r.action == "dependency_fallback" and pol.settings.namespaces == ()
    assert r.params.model_dump() == {"file": {"dir": "/var/lib/triscope/knobs"}, "knobs": {"pinned": True},
                                     "ttl": 1800.0, "hold": 300.0}
    assert r.target["workload"].from_workload and r.target["workload"].workload_label == "workload"
    # the ConfigMap form is unchanged beside it
    cm = parse_policy(policy_text("""  - name: cm
    trigger: {alert: A}
    action: dependency_fallback
    target: {namespace: inference}
    params: {configmap: deps, key: mode}
""", "  namespaces: [inference]\n"), "p.yaml").rule("cm")
    assert not cm.knobs_file and isinstance(cm.params, DependencyFallbackParams) and cm.params.configmap == "deps"


@pytest.mark.parametrize("old, new, line, reason", [
    ("      knobs: {pinned: true}\n", "      knobs: {pinned: true}\n      configmap: deps\n      key: mode\n", 10,
     "rules[0].params.file: give configmap (a Kubernetes ConfigMap's key) or file (a knobs file per workload, off "
     "Kubernetes), not both"),
    ("knobs: {pinned: true}", "knobs: {}", 11,
     "rules[0].params.knobs: must set at least one knob (an empty fallback would change nothing)"),
    ("      knobs: {pinned: true}\n", "", 9, "rules[0].params.knobs: missing (required)"),
    ("knobs: {pinned: true}", "knobs: {pinned: {on: 1}}", 11,
     "rules[0].params.knobs.pinned: must be null, true/false, a number, a string or a list of those"),
    ("{workload: {from: workload}}", "{workload: inference-b}", 8,
     "rules[0].target.workload: must be {from: workload}, not 'inference-b': a knobs file is named by the trigger's "
     "workload label, never by a name written here"),
    ("{workload: {from: workload}}", "{workload: {label: app}}", 8, "rules[0].target.workload: must be {from: workload}"),
    ("{workload: {from: workload}}", "{namespace: {label: namespace}, workload: {from: workload}}", 8,
     "rules[0].target.namespace: a knobs-file fallback (params.file) is named by the trigger's workload label only"),
    ("    target: {workload: {from: workload}}\n", "", 5,
     "rules[0].target: a knobs-file fallback (params.file) needs target.workload: {from: workload}"),
    ("dir: /var/lib/triscope/knobs", "dir: knobs", 10, "rules[0].params.file.dir: 'knobs' is not an absolute path"),
    ("dir: /var/lib/triscope/knobs", "dir: /var/lib/../../etc", 10, "rules[0].params.file.dir: '/var/lib/../../etc': "
     "'..' is not allowed"),
], ids=["file-and-configmap", "knobs-empty", "knobs-missing", "knob-mapping", "workload-literal", "workload-label",
        "namespace-too", "no-target", "relative-dir", "dotdot-dir"])
def test_malformed_file_rules_are_refused_at_load(old: str, new: str, line: int, reason: str) -> None:
    assert old in FILE_RULE
    with pytest.raises(PolicyError) as ei:
        parse_policy(policy_text(FILE_RULE.replace(old, new), "  evaluate_interval: 5s\n"), "p.yaml")
    e = ei.value
    assert str(e) == f"p.yaml:{e.line}: {e.reason}" and "\n" not in str(e)
    assert e.line == line and e.reason.startswith(reason), str(e)


def test_a_workload_target_is_only_for_the_file_form() -> None:
    with pytest.raises(PolicyError) as ei:
        parse_policy(policy_text("""  - name: cm
    trigger: {alert: A}
    action: dependency_fallback
    target: {namespace: inference, workload: {from: workload}}
    params: {configmap: deps, key: mode}
""", "  namespaces: [inference]\n"), "p.yaml")
    assert str(ei.value).startswith("p.yaml:8: rules[0].target.workload: a workload target names a knobs file: only "
                                    "a dependency_fallback with params.file takes one"), str(ei.value)


def test_cpu_affinity_follows_the_accelerators_local_cpus(store: Any, knobs_dir: Path) -> None:
    """``cpu_affinity: "{accelerator.local_cpus}"``: the trigger's GPU's local CPUs from the stored
    topology (the topology collector's info series); a GPU with none stored fails, saying why."""
    now = time.time()
    store.write_ticks(NODE, [Tick(now, [
        Sample("triscope_gpu_info", 1.0, {"gpu": "0", "name": "NVIDIA H100", "uuid": "GPU-a", "bus_id": "0000:c2:00.0"}),
        Sample("triscope_gpu_info", 1.0, {"gpu": "1", "name": "NVIDIA H100", "uuid": "GPU-b", "bus_id": "0000:c9:00.0"}),
        Sample("triscope_accelerator_topology_info", 1.0, {
            "device": "0000:c2:00.0", "numa_node": "1", "local_cpus": "56-59,168", "host_bridge": "pci0000:be",
            "path": "0000:be:01.0>0000:bf:00.0>0000:c0:01.0"})])], rollup=False)
    text = rule(knobs_dir, trigger="{alert: TriscopeStagingBound}").replace(
        "cpu_affinity: null", 'cpu_affinity: "{accelerator.local_cpus}"')
    eng = engine(store, text)
    gpu1 = alert("cmd:inference-c", "2")
    gpu1["labels"]["gpu"] = "1"
    eng.submit_alerts(webhook_payload([alert("cmd:inference-b", "1"), gpu1]))
    assert eng.drain(30)
    eng.close()
    doc = yaml.safe_load((knobs_dir / "inference-b.yaml").read_bytes())
    assert doc["knobs"]["cpu_affinity"] == [56, 57, 58, 59, 168]
    assert not (knobs_dir / "inference-c.yaml").exists()
    rows = {r.target_key.rsplit("/", 1)[-1]: r for r in decisions(store)}
    assert rows["inference-b.yaml"].outcome == "acted"
    failed = rows["inference-c.yaml"]
    assert failed.outcome == "failed" and "no topology stored for GPU 1 (0000:c9:00.0)" in failed.reason, failed.reason
