"""Workload attribution: which pod, container or unit runs on each accelerator, and what the host
does for it (its process set, cgroup CPU limit, placement, own TCP, wait chains).

``collector.WorkloadsCollector`` is the collector the agent's registry builds; the other modules
are its helpers.  They may use the collectors (``triscope.agent.collectors``: the collector
protocol, NVML, npu-smi, topology, the wait-for reader); the collectors never import this package
(an import contract in ``pyproject.toml``).
"""
