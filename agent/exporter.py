"""The Prometheus exporter: the last tick's samples, rendered with catalogue HELP/TYPE lines.

Only ``triscope_*`` metrics are exported (scraped application metrics stay with the
application).  The process's own CPU and memory come from prometheus_client's ProcessCollector
under the ``triscope_`` namespace.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from triscope.metrics import CATALOGUE, kind_of
from triscope.samples import Sample


class TickCollector(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: list[Sample] = []

    def update(self, samples: Sequence[Sample]) -> None:
        keep = [s for s in samples if s.name.startswith("triscope_")]
        with self._lock:
            self._samples = keep

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            samples = list(self._samples)
        by_name: dict[str, list[Sample]] = defaultdict(list)
        for s in samples:
            by_name[s.name].append(s)
        for name in sorted(by_name):
            group = by_name[name]
            spec = CATALOGUE.get(name)
            help_text = spec.help if spec else f"{name} (triscope)"
            kind = spec.kind if spec else kind_of(name)
            label_names = sorted({k for s in group for k in s.labels})
            fam: Any
            if kind == "counter" and name.endswith("_total"):
                fam = CounterMetricFamily(name[: -len("_total")], help_text, labels=label_names)
            else:
                fam = GaugeMetricFamily(name, help_text, labels=label_names)
            seen: set[tuple[str, ...]] = set()
            for s in group:
                values = tuple(str(s.labels.get(k, "")) for k in label_names)
                if values in seen:
                    continue
                seen.add(values)
                fam.add_metric(list(values), float(s.value))
            yield fam


def make_registry() -> tuple[CollectorRegistry, TickCollector]:
    registry = CollectorRegistry(auto_describe=False)
    tick = TickCollector()
    registry.register(tick)
    ProcessCollector(namespace="triscope", registry=registry)
    return registry, tick


def serve(registry: CollectorRegistry, host: str, port: int):  # type: ignore[no-untyped-def]
    """Start the /metrics HTTP server in a daemon thread; returns (server, thread)."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=host, registry=registry)
