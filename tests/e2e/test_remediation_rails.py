"""Every safety rail, each shown stopping an action (no write reaches the Kubernetes API)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kube_server import KubeTestServer, open_store, policy_text, webhook_payload

from triscope.core.samples import Sample, Tick
from triscope.remediation.engine import Engine
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.leader import LeaderElector
from triscope.remediation.policy import parse_policy
from triscope.remediation.triggers import TriggerEvent
from triscope.store import audit

REPO = Path(__file__).resolve().parents[2]

RESTART = """  - name: restart
    trigger: {{alert: RetransmitStorm}}
    action: rolling_restart
    target: {{namespace: {{label: namespace}}, deployment: {{label: deployment}}}}
    params: {{follow: false}}
    limits: {{cooldown: {cooldown}, max_actions: {max_actions}, per: 1h}}
"""


@dataclass
class Env:
    srv: KubeTestServer
    store: Any
    kube: KubeAdapter
    url: str
    engines: list[Engine]

    def engine(self, rules: str | None = None, settings: str = "", dry_run: bool = False,
               leader: LeaderElector | None = None, cooldown: str = "0s", max_actions: int = 100) -> Engine:
        rules = rules or RESTART.format(cooldown=cooldown, max_actions=max_actions)
        pol = parse_policy(policy_text(rules, settings), "test.yaml")
        e = Engine(self.store, pol, kube=self.kube, dry_run=dry_run, leader=leader)
        self.engines.append(e)
        return e

    def patches(self) -> int:
        return len(self.srv.calls("PATCH", "/deployments/"))


@pytest.fixture
def env(db_url: str) -> Iterator[Env]:
    """Every rail on SQLite and on the real PostgreSQL server."""
    srv = KubeTestServer(rollout_delay=0.05).start()
    for n in ("node-a", "node-b", "node-c"):
        srv.add_node(n)
    for d in ("web", "api", "db", "cache"):
        srv.add_deployment("inference", d, replicas=2)
    url = db_url
    st = open_store(url)
    e = Env(srv, st, KubeAdapter.connect(url=srv.url), url, [])
    yield e
    for eng in e.engines:
        eng.close(2)
    st.close()
    srv.stop()


def fire(eng: Engine, *alerts: dict[str, Any], status: str = "firing") -> list[audit.AuditRow]:
    before = {r.id for r in audit.audit_log(eng.store, limit=10000)}
    eng.submit_alerts(webhook_payload(list(alerts), status=status))
    assert eng.drain(20)
    rows = [r for r in audit.audit_log(eng.store, limit=10000, newest_first=False) if r.id not in before]
    return rows


def storm(dep: str = "web", ns: str = "inference", starts: str = "2099-01-01T00:00:00Z", **extra: str) -> dict[str, Any]:
    labels = {"alertname": "RetransmitStorm", "namespace": ns, "deployment": dep, "severity": "page", **extra}
    return {"labels": labels, "startsAt": starts}


def test_baseline_acts(env: Env) -> None:
    rows = fire(env.engine(), storm())
    assert [r.outcome for r in rows] == ["acted"]
    assert env.patches() == 1
    assert rows[0].response["patch"]["restartedAt"]


def test_rail_not_firing(env: Env) -> None:
    rows = fire(env.engine(), storm(), status="resolved")
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "not_firing")]
    assert env.patches() == 0


def test_rail_global_and_rule_dry_run(env: Env) -> None:
    rows = fire(env.engine(dry_run=True), storm())
    assert [(r.outcome, r.dry_run) for r in rows] == [("dry_run", True)]
    rule_dry = RESTART.format(cooldown="0s", max_actions=10) + "    dry_run: true\n"
    rows = fire(env.engine(rules=rule_dry), storm("api"))
    assert [(r.outcome, r.dry_run) for r in rows] == [("dry_run", True)]
    assert env.patches() == 0
    assert "would restart deployment inference/api" in rows[0].reason


def test_rail_leader(env: Env) -> None:
    other = LeaderElector(env.kube, "default", "triscope-remediation", "other-replica", 30)
    assert other.step()
    me = LeaderElector(env.kube, "default", "triscope-remediation", "me", 30)
    assert not me.step()
    rows = fire(env.engine(leader=me), storm())
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "leader")]
    assert env.patches() == 0


def test_rail_target_from_labels_only(env: Env) -> None:
    eng = env.engine()
    no_label = {"labels": {"alertname": "RetransmitStorm", "namespace": "inference"}, "startsAt": "2099-01-01T00:00:00Z"}
    bad_name = storm(dep="web; kubectl delete ns inference")
    rows = fire(eng, no_label, bad_name)
    assert sorted((r.outcome, r.rail) for r in rows) == [("suppressed", "target")] * 2
    assert any("not a valid Kubernetes name" in r.reason for r in rows)
    assert env.patches() == 0


def test_rail_duplicate_deliveries_survive_restart(env: Env) -> None:
    rows = fire(env.engine(), storm())
    assert [r.outcome for r in rows] == ["acted"]
    rows = fire(env.engine(), storm())  # a new engine on the same store: Alertmanager re-delivers
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "duplicate")]
    assert env.patches() == 1


def test_rail_namespace_allow_list(env: Env) -> None:
    env.srv.add_deployment("kube-system", "coredns")
    rows = fire(env.engine(), storm("coredns", ns="kube-system"))
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "namespace")]
    assert env.patches() == 0


def test_rail_cooldown_kept_in_store(env: Env) -> None:
    rows = fire(env.engine(cooldown="1h"), storm(starts="2099-01-01T00:00:00Z"))
    assert rows[0].outcome == "acted"
    # the engine restarts; a new alert episode for the same target is still cooling down
    rows = fire(env.engine(cooldown="1h"), storm(starts="2099-01-01T00:05:00Z"))
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "cooldown")]
    assert env.patches() == 1


def test_rail_rate_limit_per_rule(env: Env) -> None:
    rows = fire(env.engine(max_actions=2), storm("web"), storm("api"), storm("db"))
    assert sorted(r.outcome for r in rows) == ["acted", "acted", "suppressed"]
    assert [r.rail for r in rows if r.outcome == "suppressed"] == ["rate_limit"]
    assert env.patches() == 2


def test_rail_rate_limit_survives_restart(env: Env) -> None:
    rows = fire(env.engine(max_actions=2), storm("web"), storm("api"))
    assert [r.outcome for r in rows] == ["acted", "acted"]
    rows = fire(env.engine(max_actions=2), storm("db"))  # a new engine recounts from the audit log
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "rate_limit")]
    assert env.patches() == 2


def test_rail_hourly_cap(env: Env) -> None:
    settings = "  namespaces: [inference]\n  max_actions_per_hour: 2\n"
    rows = fire(env.engine(settings=settings), storm("web"), storm("api"), storm("db"))
    assert [r.rail for r in rows if r.outcome == "suppressed"] == ["hourly_cap"]
    assert env.patches() == 2


def test_rail_in_flight_cap(env: Env) -> None:
    rules = """  - name: slow
    trigger: {alert: RetransmitStorm}
    action: command
    target: {node: {label: node}}
    params: {argv: [sleep, "3"], timeout: 10s}
    limits: {cooldown: 0s}
"""
    eng = env.engine(rules=rules, settings="  max_in_flight: 1\n")
    eng.submit_alerts(webhook_payload([storm(node="node-a")]))
    deadline = time.time() + 10
    while eng.status()["in_flight"] < 1 and time.time() < deadline:
        time.sleep(0.02)
    rows = fire(eng, storm(node="node-b"))
    outcomes = sorted((r.outcome, r.rail) for r in audit.audit_log(env.store))
    assert ("suppressed", "in_flight") in outcomes and ("acted", None) in outcomes
    assert rows


def test_a_dry_run_never_opens_the_shared_breaker(env: Env) -> None:
    """The breaker is one for every engine on the store: a dry-run that would trip it says so and
    leaves it closed, so it never stops an acting engine."""
    settings = "  namespaces: [inference]\n  breaker: {window: 10m, max_targets: 2, max_percent: 100}\n"
    rows = fire(env.engine(settings=settings, dry_run=True), storm("web"), storm("api"), storm("db"))
    assert [r.outcome for r in rows].count("dry_run") == 2
    tripped = [r for r in rows if r.outcome == "suppressed"]
    assert tripped and tripped[0].rail == "breaker" and "circuit breaker would open" in tripped[0].reason
    assert not audit.breaker_state(env.store).is_open
    assert env.patches() == 0


def test_rail_breaker_absolute_then_reset_without_replay(env: Env) -> None:
    settings = "  namespaces: [inference]\n  breaker: {window: 10m, max_targets: 2, max_percent: 100}\n"
    eng = env.engine(settings=settings)
    rows = fire(eng, storm("web"), storm("api"), storm("db"))
    assert [r.outcome for r in rows].count("acted") == 2
    tripped = [r for r in rows if r.outcome == "suppressed"]
    assert tripped[0].rail == "breaker" and "circuit breaker opened" in tripped[0].reason
    assert audit.breaker_state(env.store).is_open
    rows = fire(eng, storm("cache"))  # everything stops while open
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "breaker")]
    assert env.patches() == 2
    # operator resets (the CLI); an alert that started before the reset is stale: not replayed
    res = subprocess.run([sys.executable, "-m", "triscope", "remediate", "reset-breaker", "--db", env.url, "--by", "sre"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 0 and "circuit breaker closed by sre" in res.stdout
    assert not audit.breaker_state(env.store).is_open
    rows = fire(eng, storm("cache", starts="2026-01-01T00:00:00Z"))
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "stale")]
    assert env.patches() == 2


def test_rail_breaker_percentage_of_nodes(env: Env) -> None:
    for n in ("n1", "n2", "n3", "n4"):
        env.store.write_ticks(n, [Tick(time.time(), [Sample("triscope_cpu_busy_ratio", 0.1)])])
    rules = """  - name: per-node
    trigger: {alert: RetransmitStorm}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"]}
    limits: {cooldown: 0s}
"""
    settings = "  breaker: {window: 10m, max_targets: 100, max_percent: 50, min_population: 4}\n"
    rows = fire(env.engine(rules=rules, settings=settings), storm(node="n1"), storm(node="n2"), storm(node="n3"))
    assert [r.outcome for r in rows].count("acted") == 2
    sup = [r for r in rows if r.outcome == "suppressed"]
    assert sup[0].rail == "breaker" and "3 of 4 nodes (75%)" in sup[0].reason


def test_rail_recheck_alert_resolved_before_acting(env: Env) -> None:
    eng = env.engine()
    rule = eng.policy.rule("restart")
    labels = storm()["labels"]
    firing = TriggerEvent(rule, "alert", "k1", "alert", labels, None, time.time(), time.time() - 1,
                          episode="alert:restart:fp1")
    # the firing delivery is still queued when Alertmanager's resolved for the same alert arrives
    eng.submit_alerts(webhook_payload([{"labels": labels, "fingerprint": "fp1"}], status="resolved"))
    assert eng.drain()
    d = eng.handle(firing)
    assert (d.outcome, d.rail) == ("suppressed", "recheck")
    assert env.patches() == 0


def test_rail_recheck_stored_condition_gone(env: Env) -> None:
    rules = """  - name: hot
    trigger: {metric: triscope_cpu_busy_ratio, op: ">", threshold: 0.9}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"]}
    limits: {cooldown: 0s}
"""
    eng = env.engine(rules=rules)
    now = time.time()
    env.store.write_ticks("n1", [Tick(now - 2, [Sample("triscope_cpu_busy_ratio", 0.95)])])
    assert eng.evaluate_triggers(now - 1) == 1  # fires on the hot point ...
    eng.drain()
    env.store.write_ticks("n1", [Tick(now - 0.5, [Sample("triscope_cpu_busy_ratio", 0.2)])])
    ev = TriggerEvent(eng.policy.rule("hot"), "metric", "again", "hot", {"node": "n1"}, "n1", now, now)
    d = eng.handle(ev)  # ... but by the time this one would act, it has cooled down
    assert (d.outcome, d.rail) == ("suppressed", "recheck")


def test_rail_live_state_paused_and_degraded(env: Env) -> None:
    env.srv.add_deployment("inference", "paused", paused=True)
    env.srv.add_deployment("inference", "degraded", replicas=3, available=1)
    rows = fire(env.engine(), storm("paused"), storm("degraded"))
    assert sorted((r.outcome, r.rail) for r in rows) == [("suppressed", "live_state")] * 2
    assert any("is paused" in r.reason for r in rows) and any("1/3 available" in r.reason for r in rows)
    assert env.patches() == 0


def test_concurrent_duplicates_act_once(env: Env) -> None:
    eng = env.engine()
    threads = [threading.Thread(target=eng.submit_alerts, args=(webhook_payload([storm()]),)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert eng.drain(20)
    rows = audit.audit_log(env.store)
    assert sorted(r.outcome for r in rows) == ["acted"] + ["suppressed"] * 7
    assert env.patches() == 1


def test_breaker_reset_starts_a_fresh_window(env: Env) -> None:
    """After reset-breaker, decisions from before the reset no longer count towards the breaker: in the
    engine that keeps running (the reset came from another process, the CLI) and after a restart."""
    for d in ("queue", "batch", "extra"):
        env.srv.add_deployment("inference", d, replicas=2)
    settings = "  namespaces: [inference]\n  breaker: {window: 10m, max_targets: 2, max_percent: 100}\n"
    eng = env.engine(settings=settings)
    rows = fire(eng, storm("web"), storm("api"), storm("db"))
    assert [r.outcome for r in rows].count("acted") == 2 and audit.breaker_state(env.store).is_open
    res = subprocess.run([sys.executable, "-m", "triscope", "remediate", "reset-breaker", "--db", env.url, "--by", "sre"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 0 and "no longer count" in res.stdout, res.stdout + res.stderr
    # the running engine still holds web and api in its window: a new target acts all the same
    rows = fire(eng, storm("cache"))
    assert [(r.outcome, r.rail) for r in rows] == [("acted", None)], rows[0].reason
    # a restarted engine rebuilds its window from the audit log, pre-reset decisions included: still fresh
    eng2 = env.engine(settings=settings)
    rows = fire(eng2, storm("queue"))
    assert [(r.outcome, r.rail) for r in rows] == [("acted", None)], rows[0].reason
    # the breaker still counts what came after the reset: a third target in the window trips it
    rows = fire(eng2, storm("batch"))
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "breaker")]
    assert "3 targets" in rows[0].reason and audit.breaker_state(env.store).is_open
    assert env.patches() == 4


# dry-run, then acting: dry-run's claims and cooldowns are its own ----------------------------------------
HOT = """  - name: hot
    trigger: {metric: triscope_cpu_busy_ratio, op: ">", threshold: 0.9}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"]}
    limits: {cooldown: 1h, max_actions: 1, per: 1h}
"""


def evaluate(eng: Engine, now: float) -> list[audit.AuditRow]:
    """One evaluation of the stored-data rules; the decisions it wrote (final rows)."""
    before = {r.id for r in audit.audit_log(eng.store, limit=10000)}
    eng.evaluate_triggers(now)
    assert eng.drain(20)
    return [r for r in audit.audit_log(eng.store, limit=10000, newest_first=False) if r.id not in before]


def test_stored_episode_decided_in_dry_run_is_acted_on_by_an_acting_engine(env: Env) -> None:
    """``triscope remediate --dry-run`` sees an episode begin, is stopped and started again acting while
    the episode goes on: the acting engine acts (the dry-run claim, cooldown and rate-limit count changed
    nothing), once; a dry-run engine after it sees the acting decision."""
    now = time.time()
    env.store.write_ticks("n1", [Tick(now - 3, [Sample("triscope_cpu_busy_ratio", 0.95)])])
    dry = env.engine(rules=HOT, dry_run=True)
    [first] = evaluate(dry, now - 2)
    assert (first.outcome, first.dry_run) == ("dry_run", True)
    # dry-run itself stays realistic: the same episode again is a duplicate ...
    again = evaluate(env.engine(rules=HOT, dry_run=True), now - 2)
    assert [(r.outcome, r.rail, r.dry_run) for r in again] == [("suppressed", "duplicate", True)]
    assert again[0].trigger_key == first.trigger_key
    dry.close()
    # ... and the engine is switched to acting, mid-episode: same store, rule and episode start
    live = env.engine(rules=HOT)
    [acted] = evaluate(live, now - 1)
    assert acted.trigger_key == first.trigger_key
    assert (acted.outcome, acted.rail, acted.dry_run) == ("acted", None, False), acted.reason
    assert acted.target_key == first.target_key == "command/n1/hot"
    # the audit rows keep their fields: the plain dedupe and target keys, no dry-run suffix
    assert {r.trigger_key for r in audit.audit_log(env.store)} == {first.trigger_key}
    assert {r.target_key for r in audit.audit_log(env.store)} == {"command/n1/hot"}
    # a second acting evaluation of the episode (another acting engine: a restart) is a duplicate
    dup = evaluate(env.engine(rules=HOT), now - 1)
    assert [(r.outcome, r.rail, r.dry_run) for r in dup] == [("suppressed", "duplicate", False)]
    # a dry-run after the acting decision: the episode is a duplicate, as before this fix
    dup = evaluate(env.engine(rules=HOT, dry_run=True), now - 1)
    assert [(r.outcome, r.rail, r.dry_run) for r in dup] == [("suppressed", "duplicate", True)]


def test_dry_run_cooldown_is_seen_by_dry_run_only(env: Env) -> None:
    """A new episode on the same target: dry-run's own cooldown stops dry-run, not an acting engine;
    the acting engine's cooldown stops both."""
    now = time.time()
    env.store.write_ticks("n1", [Tick(now - 30, [Sample("triscope_cpu_busy_ratio", 0.95)])])
    hot = HOT.replace("max_actions: 1", "max_actions: 10")
    [row] = evaluate(env.engine(rules=hot, dry_run=True), now - 29)
    assert row.outcome == "dry_run"
    # the condition cleared and came back: a new episode for the same node
    env.store.write_ticks("n1", [Tick(now - 20, [Sample("triscope_cpu_busy_ratio", 0.1)]),
                                 Tick(now - 10, [Sample("triscope_cpu_busy_ratio", 0.95)])])
    rows = evaluate(env.engine(rules=hot, dry_run=True), now - 9)
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "cooldown")]
    assert rows[0].trigger_key != row.trigger_key
    rows = evaluate(env.engine(rules=hot), now - 9)
    assert [(r.outcome, r.rail) for r in rows] == [("acted", None)], rows[0].reason
    acted_ts = rows[0].ts
    # a third episode: the acting cooldown stops the dry-run engine and the acting engine alike
    env.store.write_ticks("n1", [Tick(now - 5, [Sample("triscope_cpu_busy_ratio", 0.1)]),
                                 Tick(now - 2, [Sample("triscope_cpu_busy_ratio", 0.95)])])
    for dry_run in (True, False):
        rows = evaluate(env.engine(rules=hot, dry_run=dry_run), now - 1)
        assert [(r.outcome, r.rail, r.dry_run) for r in rows] == [("suppressed", "cooldown", dry_run)]
    assert audit.last_action(env.store, "command/n1/hot") == acted_ts   # the acting stamp, not dry-run's


def test_dry_run_decisions_do_not_count_towards_an_acting_breaker(env: Env) -> None:
    """The breaker window (and the rate limits, hourly cap) of an acting decision count acting decisions
    only; a dry-run decision counts both, as a live engine would have."""
    settings = "  namespaces: [inference]\n  breaker: {window: 10m, max_targets: 1, max_percent: 100}\n"
    rows = fire(env.engine(settings=settings, dry_run=True), storm("web"))
    assert [r.outcome for r in rows] == ["dry_run"]
    live = env.engine(settings=settings)   # rebuilds its window from the audit log
    rows = fire(live, storm("api"))
    assert [(r.outcome, r.rail) for r in rows] == [("acted", None)], rows[0].reason
    assert not audit.breaker_state(env.store).is_open
    # in one engine: a dry-run rule's decision does not count towards the acting rules' breaker ...
    rules = (RESTART.format(cooldown="0s", max_actions=100)
             + RESTART.format(cooldown="0s", max_actions=100).replace("name: restart", "name: restart-dry")
             .replace("RetransmitStorm", "OtherStorm") + "    dry_run: true\n")
    audit.reset_breaker(env.store, by="test")
    eng = env.engine(rules=rules, settings=settings)
    other = {"labels": {**storm("db")["labels"], "alertname": "OtherStorm"}, "startsAt": "2099-01-01T00:00:00Z"}
    assert [r.outcome for r in fire(eng, other)] == ["dry_run"]
    rows = fire(eng, storm("cache"))
    assert [(r.outcome, r.rail) for r in rows] == [("acted", None)], rows[0].reason
    # ... while a dry-run decision counts the acting ones: a second target in the window would trip it
    other = {"labels": {**storm("web")["labels"], "alertname": "OtherStorm"}, "startsAt": "2099-01-01T00:00:00Z"}
    rows = fire(eng, other)
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "breaker")]
    assert env.patches() == 2


def test_alert_decided_in_dry_run_is_acted_on_when_redelivered_to_an_acting_engine(env: Env) -> None:
    """Alertmanager re-delivers a firing alert: first to a dry-run engine, then (same store) to the engine
    started again acting.  The acting one acts once; a dry-run one afterwards sees the acting decision."""
    rows = fire(env.engine(dry_run=True, cooldown="1h"), storm())
    assert [(r.outcome, r.dry_run) for r in rows] == [("dry_run", True)]
    rows = fire(env.engine(dry_run=True, cooldown="1h"), storm())   # dry-run re-delivery: its own duplicate
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "duplicate")]
    assert env.patches() == 0
    live = env.engine(cooldown="1h")
    rows = fire(live, storm())
    assert [(r.outcome, r.rail, r.dry_run) for r in rows] == [("acted", None, False)], rows[0].reason
    assert env.patches() == 1
    rows = fire(live, storm())   # re-delivered again: now a duplicate for the acting engine
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "duplicate")]
    rows = fire(env.engine(cooldown="1h"), storm())   # and after a restart
    assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "duplicate")]
    # dry-run after the acting decision: duplicate for the episode, cooldown for a new episode
    rows = fire(env.engine(dry_run=True, cooldown="1h"), storm())
    assert [(r.outcome, r.rail, r.dry_run) for r in rows] == [("suppressed", "duplicate", True)]
    rows = fire(env.engine(dry_run=True, cooldown="1h"), storm(starts="2099-01-01T00:05:00Z"))
    assert [(r.outcome, r.rail, r.dry_run) for r in rows] == [("suppressed", "cooldown", True)]
    # the same for an alert only the acting engine saw: dry-run sees the acting claim and cooldown stamp
    assert [r.outcome for r in fire(live, storm("api"))] == ["acted"]
    rows = fire(env.engine(dry_run=True, cooldown="1h"), storm("api"))
    assert [(r.outcome, r.rail, r.dry_run) for r in rows] == [("suppressed", "duplicate", True)]
    rows = fire(env.engine(dry_run=True, cooldown="1h"), storm("api", starts="2099-01-01T00:05:00Z"))
    assert [(r.outcome, r.rail, r.dry_run) for r in rows] == [("suppressed", "cooldown", True)]
    assert env.patches() == 2
