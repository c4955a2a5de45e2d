"""The service's Prometheus metrics (its SLIs), on a registry of its own.

Names follow ``examples/workload/h200_phases.py`` and ``deploy/prometheus/slo-rules.yaml``:
served requests count in ``inference_requests_total{status="ok"|"deadline_exceeded"}``, failed ones in
``inference_request_errors_total{reason}``.  README.md beside this file lists every metric.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from .backends import MODELS, BatchResult

if TYPE_CHECKING:
    from .server import InferenceService

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
STAGES = ("decode", "preprocess", "queue", "h2d", "model", "d2h")
ROUTE_OF = {m: s.route for m, s in MODELS.items()}
NUMERIC_KNOBS = ("pinned", "workers", "pin_churn", "batch_size", "max_wait_ms", "net_drop", "upload_mib")


class ServiceMetrics:
    def __init__(self, service: InferenceService) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request = Histogram("inference_request_duration_seconds", "Request latency, end to end in the server.",
                                 ["route", "status"], buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("inference_requests", "Requests answered, by outcome (ok or deadline_exceeded).",
                                ["route", "status"], registry=r)
        self.errors = Counter("inference_request_errors", "Requests that failed, by reason.", ["route", "reason"],
                              registry=r)
        self.stage = Histogram("inference_stage_duration_seconds",
                               "Stage durations: decode, preprocess, queue per request; h2d, model, d2h per batch.",
                               ["stage", "model"], buckets=STAGE_BUCKETS, registry=r)
        self.batch = Histogram("inference_batch_size", "Requests per batch.", ["model"], buckets=BATCH_BUCKETS,
                               registry=r)
        self.bytes = Counter("inference_transfer_bytes", "Bytes copied between host and device.",
                             ["direction", "model"], registry=r)
        self._lock = threading.Lock()
        for m in MODELS:
            for st in STAGES:
                self.stage.labels(st, m)
            self.batch.labels(m)
            for d in ("h2d", "d2h"):
                self.bytes.labels(d, m)
        for route in ("image", "audio", "text"):
            for status in ("ok", "deadline_exceeded"):
                self.requests.labels(route, status)
                self.request.labels(route, status)
        r.register(_StateCollector(service))

    def observe_stage(self, stage: str, model: str, seconds: float) -> None:
        self.stage.labels(stage, model).observe(max(0.0, seconds))

    def observe_batch(self, model: str, size: int, res: BatchResult) -> None:
        self.batch.labels(model).observe(size)
        self.stage.labels("h2d", model).observe(res.h2d_s)
        self.stage.labels("model", model).observe(res.model_s)
        self.stage.labels("d2h", model).observe(res.d2h_s)
        self.bytes.labels("h2d", model).inc(res.h2d_bytes)
        self.bytes.labels("d2h", model).inc(res.d2h_bytes)

    def observe_request(self, route: str, status: str, reason: str, seconds: float) -> None:
        self.request.labels(route, status).observe(seconds)
        if status in ("ok", "deadline_exceeded"):
            self.requests.labels(route, status).inc()
        else:
            self.errors.labels(route, reason or status).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _StateCollector(Collector):
    """What is read at scrape time: knobs in force and where from, queues, workers, the fault tools."""

    def __init__(self, service: InferenceService) -> None:
        self.svc = service

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        svc = self.svc
        st = svc.store.state()
        k = st.knobs
        g = GaugeMetricFamily("inference_knob", "Knob values in force (booleans 0/1; cpu_affinity: "
                              "CPUs confined to, 0 = not confined; net_drop: ratio; max_wait_ms in ms).",
                              labels=["knob"])
        values: dict[str, Any] = k.as_dict()
        for name in NUMERIC_KNOBS:
            g.add_metric([name], float(values[name]))
        g.add_metric(["cpu_affinity"], float(len(k.cpu_affinity) if k.cpu_affinity else 0))
        g.add_metric(["noisy_neighbour"], float(("off", "copy", "compute").index(k.noisy_neighbour)))
        yield g
        info = InfoMetricFamily("inference_knobs", "Every knob in force as a label, and the layer that set the last "
                                "change (startup, file, admin).")
        info.add_metric([], {**k.label_values(), "source": st.source})
        yield info
        yield GaugeMetricFamily("inference_knobs_generation", "Knob changes applied since start.",
                                value=float(st.generation))
        yield GaugeMetricFamily("inference_knobs_applied_timestamp_seconds",
                                "When the knobs in force were applied (Unix time).", value=st.applied_at)
        f = InfoMetricFamily("inference_knobs_file", "The knobs file and the SHA-256 of the content in force "
                             "(empty while absent).")
        f.add_metric([], {"path": st.file_path or "", "sha256": st.file_sha256 or "", "kind": st.file_kind or ""})
        yield f
        ok = GaugeMetricFamily("inference_knobs_file_ok", "0 while the last knobs file read was refused.",
                               value=0.0 if st.file_error else 1.0)
        yield ok
        yield CounterMetricFamily("inference_knobs_file_errors", "Knobs files refused (bad YAML, values, keys).",
                                  value=float(svc.store.file_errors))
        q = GaugeMetricFamily("inference_queue_depth", "Requests waiting: for a preprocessing worker, or for a batch.",
                              labels=["queue"])
        q.add_metric(["preprocess"], float(svc.pool.depth()))
        for m, b in svc.batchers.items():
            q.add_metric([f"batch_{m}"], float(b.depth()))
        yield q
        yield GaugeMetricFamily("inference_inflight_requests", "Requests inside the server now.",
                                value=float(svc.inflight))
        w = GaugeMetricFamily("inference_preprocess_workers", "Preprocessing worker threads, all and busy.",
                              labels=["state"])
        w.add_metric(["all"], float(svc.pool.size()))
        w.add_metric(["busy"], float(svc.pool.busy()))
        yield w
        nf = svc.netfault
        ni = InfoMetricFamily("inference_net_fault", "The tool behind net_drop; available=false says why not.")
        if nf is None:
            ni.add_metric([], {"method": "off", "available": "false", "reason": "switched off (--net-tool off)"})
        else:
            ni.add_metric([], {"method": nf.method, "available": str(nf.available).lower(),
                               "reason": nf.reason()})
        yield ni
        yield GaugeMetricFamily("inference_net_drop_applied_ratio", "Share of the port's packets dropped now.",
                                value=float(nf.applied) if nf is not None else 0.0)
        nb = svc.neighbour
        yield GaugeMetricFamily("inference_noisy_neighbour_running", "1 while the neighbour process runs.",
                                value=1.0 if nb is not None and nb.running else 0.0)
        yield CounterMetricFamily("inference_host_registered_bytes", "Host memory page-locked with cudaHostRegister "
                                  "(pin_churn: a fresh buffer per batch), bytes.",
                                  value=float(getattr(svc.backend, "registered_bytes", 0)))
        yield CounterMetricFamily("inference_host_registrations", "cudaHostRegister calls (pin_churn).",
                                  value=float(getattr(svc.backend, "registrations", 0)))
        bi = InfoMetricFamily("inference_backend", "The backend, its device and models.")
        bi.add_metric([], {**svc.backend.info(), "workload": svc.workload or ""})
        yield bi
