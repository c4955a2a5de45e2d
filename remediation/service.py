"""Running the remediation engine: its scheduler, the webhook beside it, and the handle that stops them.

``start`` (``triscope remediate``) and ``start_embedded`` (``triscope run``) build an
:class:`~triscope.remediation.engine.Engine` on a store and a policy, schedule its jobs
(stored-data triggers, fallback reverts, workload resolution, pruning, leader election) and, when
asked, serve the Alertmanager webhook; :class:`EngineHandle` stops all of it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.exc import OperationalError

from triscope.remediation.engine import DEFAULT_POLICY, Engine
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import NotConfigured
from triscope.remediation.leader import LeaderElector
from triscope.remediation.policy import Policy, load_policy
from triscope.remediation.webhook import serve
from triscope.store.api import Store
from triscope.store.db import error_line
from triscope.web.auth import WebConfig
from triscope.web.loopback import is_loopback

log = logging.getLogger("triscope.remediation.engine")


# construction -------------------------------------------------------------------------------------
def build_scheduler(engine: Engine) -> Any:
    """The engine's APScheduler: every job with an id, ``max_instances=1``, ``coalesce=True``.

    Built here and started by the caller (never at import time, never inside a web worker).
    """
    # lazy: APScheduler's import costs start-up time that only a running engine needs
    from apscheduler.schedulers.background import BackgroundScheduler

    s = engine.settings
    sched = BackgroundScheduler(timezone=UTC, job_defaults={"max_instances": 1, "coalesce": True,
                                                            "misfire_grace_time": max(5, int(s.evaluate_interval_s))})
    now = datetime.now(UTC)
    if engine.leader is not None:
        sched.add_job(_db_guarded(engine.leader_step), "interval", seconds=s.leader_election.renew_every_s, id="leader-election",
                      name="acquire or renew the leader Lease", next_run_time=now)
    if engine.data_rules:
        sched.add_job(_db_guarded(engine.evaluate_triggers), "interval", seconds=s.evaluate_interval_s, id="evaluate-triggers",
                      name="evaluate stored-data triggers", next_run_time=now)
    sched.add_job(_db_guarded(engine.revert_fallbacks), "interval", seconds=s.evaluate_interval_s, id="fallback-reverts",
                  name="revert dependency fallbacks", next_run_time=now)
    sched.add_job(_db_guarded(engine.resume_inbox), "interval", seconds=max(5.0, s.evaluate_interval_s), id="resume-inbox",
                  name="decide triggers left undecided in the inbox")
    sched.add_job(_db_guarded(engine.prune), "interval", seconds=3600, id="prune-deliveries", name="forget old deliveries")
    if engine.kube is not None and any(r.action == "isolate_accelerator" for r in engine.policy.rules):
        sched.add_job(_db_guarded(engine.untaint_accelerators), "interval", seconds=max(5.0, s.evaluate_interval_s),
                      id="untaint-accelerators", name="untaint accelerators whose verdict is healthy again")
    if engine.verdict_events is not None or engine.node_conditions is not None:
        sched.add_job(_db_guarded(engine.announce_verdicts), "interval", seconds=s.evaluate_interval_s,
                      id="verdict-events", name="post the verdicts that would page as Kubernetes Events and "
                      "node conditions",
                      next_run_time=now)
    if engine.kube is not None:
        sched.add_job(_db_guarded(engine.refresh_workloads), "interval", seconds=max(30.0, s.evaluate_interval_s),
                      id="resolve-workloads", name="resolve the pods of stored series to their workloads",
                      next_run_time=now)
    return sched


def _db_guarded(job: Any) -> Any:
    """A scheduler job whose database error (the store failing over, unreachable) is one log line and
    a retry at the next run, not a traceback; anything else still propagates to APScheduler's log."""
    @functools.wraps(job)
    def run() -> Any:
        try:
            return job()
        except OperationalError as e:
            log.warning("remediation: %s skipped this run, the store failed: %s", job.__name__, error_line(e))
            return None
    return run


def kube_from_settings(policy: Policy) -> KubeAdapter | None:
    """The adapter the policy's ``settings.kubernetes`` asks for (None for mode ``none``)."""
    ks = policy.settings.kubernetes
    if ks.mode == "none":
        return None
    token = None
    if ks.token_file:
        try:
            with open(ks.token_file) as f:
                token = f.read().strip()
        except OSError as e:
            raise NotConfigured(f"cannot read the Kubernetes token file {ks.token_file}: {e}") from None
    return KubeAdapter.connect(url=ks.url if ks.mode == "url" else None, token=token,
                               kubeconfig=ks.kubeconfig if ks.mode == "kubeconfig" else None, context=ks.context,
                               in_cluster=ks.mode == "in-cluster", verify_ssl=ks.verify_ssl, ca_file=ks.ca_file)


class EngineHandle:
    """A running engine: scheduler + optional webhook.  ``stop()`` shuts everything down."""

    def __init__(self, engine: Engine, scheduler: Any, server: Any | None, owns_store: bool) -> None:
        self.engine, self.scheduler, self.server = engine, scheduler, server
        self._owns_store = owns_store

    @property
    def url(self) -> str | None:
        if self.server is None:
            return None
        host, port = self.server.server_address[:2]
        return f"{getattr(self.server, 'scheme', 'http')}://{host}:{port}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        with contextlib.suppress(Exception):  # not running
            self.scheduler.shutdown(wait=True)
        self.engine.close()
        if self.engine.kube is not None:
            self.engine.kube.close()
        if self._owns_store:
            self.engine.store.close()


def start(store: Store, policy: Policy, *, listen: tuple[str, int] | None = None, dry_run: bool = False,
          token: str | None = None, kube: KubeAdapter | None = None, owns_store: bool = False,
          max_body: int = 1 << 20, web: WebConfig | None = None) -> EngineHandle:
    """Build and start an engine: leader election, scheduler jobs and (with ``listen``) the webhook
    (over TLS with ``web``: ``--web.config.file``)."""
    if kube is None:
        kube = kube_from_settings(policy)
    le = policy.settings.leader_election
    leader = None
    if le.enabled:
        if kube is None:
            raise NotConfigured("leader election needs a Kubernetes API")
        leader = LeaderElector(kube, le.namespace, le.lease, policy.settings.engine_id, le.lease_duration_s)
    engine = Engine(store, policy, kube=kube, dry_run=dry_run, leader=leader)
    if leader is not None:
        engine.leader_step()  # resumes when it becomes the leader
    else:
        engine.resume()  # actions a crash left in progress, triggers accepted but not decided
    sched = build_scheduler(engine)
    sched.start()
    server = (serve(engine, listen[0], listen[1], token=token, max_body=max_body, web=web)
              if listen else None)
    return EngineHandle(engine, sched, server, owns_store)


def start_embedded(store_url: str, policy_path: str | Path | None = None,
                   listen: str | tuple[str, int] | None = None, dry_run: bool = True,
                   token: str | None = None) -> EngineHandle:
    """The engine inside ``triscope run``: dry-run, the example policy by default.

    ``listen`` (``HOST:PORT`` or ``(host, port)``) also serves the webhook; it needs ``token`` (or
    ``TRISCOPE_WEBHOOK_TOKEN``), except on a loopback address where it runs without auth.
    Returns a handle with ``.stop()``.
    """
    policy = load_policy(policy_path or DEFAULT_POLICY)
    st = Store.open(store_url)
    st.require_schema()
    addr = None
    if listen:
        if isinstance(listen, str):
            host, _, port = listen.rpartition(":")
            addr = (host or "127.0.0.1", int(port))
        else:
            addr = (listen[0], int(listen[1]))
        token = token or os.environ.get("TRISCOPE_WEBHOOK_TOKEN") or None
        if token is None and not is_loopback(addr[0]):
            st.close()
            raise ValueError("the webhook needs a bearer token when it listens beyond loopback")
        if token is None:
            log.warning("remediation webhook on %s:%d runs without a bearer token (loopback, dry-run demo); "
                        "set TRISCOPE_WEBHOOK_TOKEN to require one", addr[0], addr[1])
    try:
        return start(st, policy, listen=addr, dry_run=dry_run, token=token, owns_store=True)
    except Exception:
        st.close()
        raise
