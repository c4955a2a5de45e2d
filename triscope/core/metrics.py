"""The metric catalogue: every metric triscope exports, its type and help text.

One source of truth for the exporter (HELP/TYPE lines), the store (counter vs gauge) and the
docs.  Prometheus conventions: ``triscope_`` prefix, base units, ``_total`` on counters, ``_ratio``
for 0..1.  Extend in the same style; metrics scraped from applications (``--scrape``) keep their
own names and are not listed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from triscope.core.samples import MetricKind


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()


_SPECS = [
    # network
    MetricSpec("triscope_tcp_retransmits_total", "counter", "TCP segments retransmitted (eBPF tcp:tcp_retransmit_skb, else /proc/net/snmp RetransSegs).", ()),
    MetricSpec("triscope_tcp_retransmits_by_state_total", "counter", "TCP retransmits by the socket's TCP state (eBPF).", ("state",)),
    MetricSpec("triscope_tcp_synack_retransmits_total", "counter", "SYN-ACK retransmits (eBPF tcp:tcp_retransmit_synack).", ()),
    MetricSpec("triscope_tcp_retransmits_by_peer_total", "counter", "TCP retransmits by remote address:port (eBPF; off by default, cardinality).", ("peer",)),
    MetricSpec("triscope_tcp_sockets", "gauge", "TCP sockets by state (from /proc/net/sockstat and /proc/net/snmp).", ("state",)),
    MetricSpec("triscope_tcp_segments_out_total", "counter", "TCP segments sent (/proc/net/snmp OutSegs).", ()),
    # DMA / IOMMU / PCIe
    MetricSpec("triscope_dma_map_total", "counter", "DMA mappings created (eBPF dma:dma_map_*).", ("device", "direction")),
    MetricSpec("triscope_dma_map_bytes_total", "counter", "Bytes DMA-mapped (eBPF dma:dma_map_*).", ("device", "direction")),
    MetricSpec("triscope_dma_map_sg_truncated_total", "counter", "dma_map_sg events of more mapped entries than the event carries (128): their bytes past those are estimated.", ()),
    MetricSpec("triscope_dma_map_sg_estimated_bytes_total", "counter", "Bytes counted in triscope_dma_map_bytes_total by estimate: the mean entry length of a truncated dma_map_sg event times its entries past 128 (full_ents).", ()),
    MetricSpec("triscope_dma_unmap_total", "counter", "DMA mappings released (eBPF dma:dma_unmap_*).", ("device", "direction")),
    MetricSpec("triscope_dma_unmap_bytes_total", "counter", "Bytes DMA-unmapped (eBPF dma:dma_unmap_phys/_page; sg unmaps carry no size).", ("device", "direction")),
    MetricSpec("triscope_dma_map_errors_total", "counter", "DMA mapping failures (eBPF dma:*_err).", ("device",)),
    MetricSpec("triscope_iommu_map_bytes_total", "counter", "Bytes mapped through the IOMMU (eBPF iommu:map).", ("device",)),
    MetricSpec("triscope_iommu_unmap_bytes_total", "counter", "Bytes unmapped from the IOMMU (eBPF iommu:unmap).", ("device",)),
    MetricSpec("triscope_iommu_page_faults_total", "counter", "IOMMU I/O page faults (eBPF iommu:io_page_fault).", ("device",)),
    MetricSpec("triscope_pcie_aer_errors_total", "counter", "PCIe AER errors by severity (eBPF ras:aer_event, else sysfs aer_dev_*).", ("device", "severity")),
    MetricSpec("triscope_pcie_aer_error_types_total", "counter", "PCIe AER errors by error type, shown once non-zero (sysfs aer_dev_*).", ("device", "severity", "error")),
    MetricSpec("triscope_pcie_aer_rootport_errors_total", "counter", "ERR_* messages a root port received from its hierarchy (sysfs aer_rootport_total_err_*).", ("device", "severity")),
    MetricSpec("triscope_pcie_link_speed_gts", "gauge", "PCIe link speed in GT/s (kind=current|max).", ("device", "kind")),
    MetricSpec("triscope_pcie_link_width", "gauge", "PCIe link width in lanes (kind=current|max).", ("device", "kind")),
    MetricSpec("triscope_pcie_link_degraded", "gauge", "1 when the link runs below its maximum speed or width.", ("device",)),
    MetricSpec("triscope_accelerator_topology_info", "gauge", "1 per accelerator: its NUMA node (unknown for -1), local CPUs, root complex and the PCIe bridges from the root port down (sysfs).", ("device", "numa_node", "local_cpus", "host_bridge", "path")),
    MetricSpec("triscope_accelerator_nic_info", "gauge", "1 per NIC nearest an accelerator, with the link between them in nvidia-smi topo terms (PIX, PXB, PHB, NODE, SYS, unknown).", ("device", "nic", "interface", "link")),
    MetricSpec("triscope_pcie_link_capacity_bytes_per_second", "gauge", "Usable one-way bandwidth of the negotiated link (generation x width, after encoding).", ("device",)),
    # host pressure
    MetricSpec("triscope_pressure_ratio", "gauge", "Pressure stall information avg10 as a ratio (resource=cpu|memory|io, kind=some|full).", ("resource", "kind")),
    MetricSpec("triscope_pressure_stalled_seconds_total", "counter", "Pressure stall information total stall time.", ("resource", "kind")),
    MetricSpec("triscope_cpu_busy_ratio", "gauge", "Share of CPU time not idle/iowait since the last tick, all CPUs.", ()),
    MetricSpec("triscope_cpu_seconds_total", "counter", "CPU time by mode, all CPUs (/proc/stat).", ("mode",)),
    MetricSpec("triscope_memory_available_bytes", "gauge", "MemAvailable from /proc/meminfo.", ()),
    MetricSpec("triscope_memory_total_bytes", "gauge", "MemTotal from /proc/meminfo.", ()),
    # GPU (NVML)
    MetricSpec("triscope_gpu_utilization_ratio", "gauge", "NVML utilization.gpu (coarse: copy-engine time counts as busy).", ("gpu",)),
    MetricSpec("triscope_gpu_memory_utilization_ratio", "gauge", "NVML utilization.memory (coarse).", ("gpu",)),
    MetricSpec("triscope_gpu_memory_used_bytes", "gauge", "GPU memory used.", ("gpu",)),
    MetricSpec("triscope_gpu_memory_total_bytes", "gauge", "GPU memory total.", ("gpu",)),
    MetricSpec("triscope_gpu_sm_active_ratio", "gauge", "SM activity from NVML GPM between two ticks (Hopper+).", ("gpu",)),
    MetricSpec("triscope_gpu_tensor_active_ratio", "gauge", "Tensor-core activity from NVML GPM (Hopper+).", ("gpu",)),
    MetricSpec("triscope_gpu_dram_bw_ratio", "gauge", "DRAM bandwidth utilization from NVML GPM (Hopper+).", ("gpu",)),
    MetricSpec("triscope_gpu_pcie_rx_bytes_total", "counter", "Bytes received by the GPU over PCIe (GPM rates integrated per tick).", ("gpu",)),
    MetricSpec("triscope_gpu_pcie_tx_bytes_total", "counter", "Bytes sent by the GPU over PCIe (GPM rates integrated per tick).", ("gpu",)),
    MetricSpec("triscope_gpu_pcie_replays_total", "counter", "PCIe replay counter (NVML).", ("gpu",)),
    MetricSpec("triscope_gpu_xid_errors_total", "counter", "XID errors by code (NVML events).", ("gpu", "xid")),
    MetricSpec("triscope_gpu_power_watts", "gauge", "GPU power draw.", ("gpu",)),
    MetricSpec("triscope_gpu_temperature_celsius", "gauge", "GPU temperature.", ("gpu",)),
    MetricSpec("triscope_gpu_sm_clock_hertz", "gauge", "SM clock.", ("gpu",)),
    MetricSpec("triscope_gpu_throttle_reasons", "gauge", "NVML clocks-event (throttle) reason bitmask.", ("gpu",)),
    MetricSpec("triscope_gpu_up", "gauge", "1 while the GPU answers NVML, 0 after it fell off the bus.", ("gpu",)),
    MetricSpec("triscope_gpu_sm_occupancy_ratio", "gauge", "Active warps vs the SMs' maximum, from NVML GPM (Hopper+).", ("gpu",)),
    MetricSpec("triscope_gpu_nvlink_links_up", "gauge", "NVLink links in the active state (GPUs with NVLink).", ("gpu",)),
    MetricSpec("triscope_gpu_nvlink_rx_bytes_total", "counter", "Bytes received over NVLink (GPM rates integrated per tick).", ("gpu",)),
    MetricSpec("triscope_gpu_nvlink_tx_bytes_total", "counter", "Bytes sent over NVLink (GPM rates integrated per tick).", ("gpu",)),
    MetricSpec("triscope_gpu_info", "gauge", "Always 1; the GPU's name, UUID, PCI bus id and whether GPM is used.", ("gpu", "name", "uuid", "bus_id", "gpm")),
    # NPU (npu-smi)
    MetricSpec("triscope_npu_aicore_utilization_ratio", "gauge", "Ascend AICore utilization (npu-smi).", ("npu", "chip")),
    MetricSpec("triscope_npu_hbm_used_bytes", "gauge", "Ascend HBM used (npu-smi).", ("npu", "chip")),
    MetricSpec("triscope_npu_hbm_total_bytes", "gauge", "Ascend HBM total (npu-smi).", ("npu", "chip")),
    MetricSpec("triscope_npu_memory_used_bytes", "gauge", "Ascend device memory used (npu-smi).", ("npu", "chip")),
    MetricSpec("triscope_npu_memory_total_bytes", "gauge", "Ascend device memory total (npu-smi).", ("npu", "chip")),
    MetricSpec("triscope_npu_health", "gauge", "Ascend health: 0 OK, 1 Warning, 2 Alarm, 3 Critical, -1 unknown.", ("npu", "chip")),
    MetricSpec("triscope_npu_power_watts", "gauge", "Ascend power draw (npu-smi).", ("npu", "chip")),
    MetricSpec("triscope_npu_temperature_celsius", "gauge", "Ascend temperature (npu-smi).", ("npu", "chip")),
    MetricSpec("triscope_npu_hugepages_used", "gauge", "Ascend hugepages in use (npu-smi).", ("npu", "chip")),
    MetricSpec("triscope_npu_hugepages_capacity", "gauge", "Ascend hugepages configured (npu-smi; named _capacity because _total is for counters).", ("npu", "chip")),
    MetricSpec("triscope_npu_info", "gauge", "Always 1; the NPU chip's name, PCI bus id and logical device id (npu-smi).", ("npu", "chip", "name", "bus_id", "device")),
    MetricSpec("triscope_npu_processes", "gauge", "Processes using the NPU chip (npu-smi process table).", ("npu", "chip")),
    MetricSpec("triscope_npu_process_memory_bytes", "gauge", "Device memory held by processes on the NPU chip (npu-smi).", ("npu", "chip")),
    MetricSpec("triscope_npu_utilization_ratio", "gauge", "Ascend NPU utilization (npu-smi -t usages, newer releases).", ("npu", "chip")),
    MetricSpec("triscope_npu_aicpu_utilization_ratio", "gauge", "Ascend AI CPU utilization (npu-smi -t usages).", ("npu", "chip")),
    MetricSpec("triscope_npu_ctrlcpu_utilization_ratio", "gauge", "Ascend control CPU utilization (npu-smi -t usages).", ("npu", "chip")),
    MetricSpec("triscope_npu_aivector_utilization_ratio", "gauge", "Ascend AI vector core utilization (npu-smi -t usages, newer releases).", ("npu", "chip")),
    MetricSpec("triscope_npu_hbm_bandwidth_utilization_ratio", "gauge", "Ascend HBM bandwidth utilization (npu-smi -t usages).", ("npu", "chip")),
    MetricSpec("triscope_npu_ddr_bandwidth_utilization_ratio", "gauge", "Ascend DDR bandwidth utilization (npu-smi -t usages).", ("npu", "chip")),
    # workloads on each accelerator (agent/workloads/collector.py; accelerator labels gpu, or npu and chip)
    MetricSpec("triscope_accelerator_workload_info", "gauge", "Always 1 while the workload has a process on the accelerator (NVML / npu-smi processes, their cgroup, the kubelet's pod-resources); uuid is the GPU's.", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload", "uuid")),
    MetricSpec("triscope_workload_processes", "gauge", "Processes of the workload on the accelerator.", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_sm_ratio", "gauge", "The workload's share of the GPU's SM time (NVML per-process utilization; absent where the driver gives none).", ("gpu", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_cpu_seconds_total", "counter", "CPU time of the workload's processes on the accelerator, since the agent started following them.", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_feeder_busy_ratio", "gauge", "The busiest thread's share of one core over the tick (0..1; a pegged feeder reads ~1); a process below half a core counts with its own share, an upper bound.", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_cpu_wait_ratio", "gauge", "Run-queue wait over (run + wait) of the workload's threads read this tick (schedstat; 0..1): time runnable but not running.", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_cpu_pressure_ratio", "gauge", "The workload's cgroup cpu.pressure some avg10 / 100 (cgroup v2; absent elsewhere).", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_cpu_periods_total", "counter", "CFS enforcement periods of the workload's cgroup since the agent began reading it (cpu.stat nr_periods; only for a cgroup with a CPU limit).", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_cpu_throttled_periods_total", "counter", "Of those periods, the ones in which the cgroup was throttled at its CPU limit (cpu.stat nr_throttled).", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_cpu_throttled_seconds_total", "counter", "Time the cgroup's tasks were held back by its CPU limit (cpu.stat throttled_usec / throttled_time).", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_cpu_limit_cores", "gauge", "The workload cgroup's CPU limit in cores (cpu.max quota / period; absent when unlimited).", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_cpu_local_ratio", "gauge", "Share of the workload's CPU time (its threads, sampled every 10 s) on its accelerator's local CPUs (local_cpulist).", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_cpus_allowed_local_ratio", "gauge", "Share of the CPUs the workload's processes may run on (their affinity, within their cpuset) that are its accelerator's local CPUs; 0: pinned to another NUMA node.", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_memory_local_ratio", "gauge", "Share of the workload's anonymous and driver-mapped pages (numa_maps, every 60 s) on its accelerator's NUMA node.", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_tcp_retransmits_total", "counter", "Segments the workload's own TCP sockets retransmitted (sock_diag tcp_info joined to its processes' sockets; a pod's own network namespace: its Tcp RetransSegs).", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_tcp_out_of_order_received_total", "counter", "Packets the workload's own TCP sockets received out of order, after a gap: a loss on the way in, retransmitted by the peer (tcp_info rcv_ooopack; a pod's own network namespace: TcpExt TCPOFOQueue).", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_tcp_data_segments_received_total", "counter", "Data segments the workload's own TCP sockets received (tcp_info data_segs_in; a pod's own network namespace: Tcp InSegs).", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_workload_tcp_segments_sent_total", "counter", "Segments the workload's own TCP sockets sent (tcp_info segs_out; a pod's own network namespace: its Tcp OutSegs).", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_pod_resources_refused_total", "counter", "Kubelet pod-resources answers the agent refused, by reason (too_large: over 4 MiB; too_many_devices: over 20,000 container devices, counted while decoding; too_many_fields; decode_timeout; malformed); the previous mapping stands meanwhile.", ("reason",)),
    # analysis
    MetricSpec("triscope_mismatch_score", "gauge", "Share of the accelerator's time lost to I/O over the sliding window (0..1; 0 when demand-limited or idle). Per accelerator (gpu, or npu and chip) with its dominant workload (namespace, pod, container, workload; empty when none); without those labels: the node's roll-up, its worst accelerator.", ("gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_mismatch_state", "gauge", "1 for the current coordination state (idle, demand-limited, compute-bound, balanced, io-saturated, staging-bound, network-bound), 0 for the others. Per accelerator (gpu, or npu and chip) with its dominant workload (namespace, pod, container, workload; empty when none); with the state label only: the node's roll-up, its worst accelerator (I/O states first, by score).", ("state", "gpu", "npu", "chip", "namespace", "pod", "container", "workload")),
    MetricSpec("triscope_mismatch_pin_churn", "gauge", "1 while the DMA map rate says host memory is being pinned and unpinned (pin churn).", ()),
    # remediation engine (served on the engine's webhook listener, GET /metrics)
    MetricSpec("triscope_remediation_actions_total", "counter", "Remediation decisions by action and outcome (acted, dry_run, suppressed, failed).", ("action", "outcome")),
    MetricSpec("triscope_remediation_breaker_open", "gauge", "1 while the remediation circuit breaker is open.", ()),
    MetricSpec("triscope_remediation_actions_in_flight", "gauge", "Remediation actions running now.", ()),
    MetricSpec("triscope_remediation_leader", "gauge", "1 while this engine holds the leader lease (or runs alone).", ()),
    # self
    MetricSpec("triscope_collector_up", "gauge", "1 when the collector's read for this tick succeeded (a background source: answered within its budget).", ("collector",)),
    MetricSpec("triscope_collector_staleness_seconds", "gauge", "Age of the data a background source (a scraped target) gave the last tick: 0 when fresh, growing while it is slow or down.", ("collector",)),
    MetricSpec("triscope_probe_attached", "gauge", "1 when the eBPF probe is attached.", ("probe",)),
    MetricSpec("triscope_probe_lost_events_total", "counter", "Events the kernel could not hand to the agent (ring/perf buffer full).", ("probe",)),
    MetricSpec("triscope_tick_duration_seconds", "gauge", "Wall time of the last sampler tick (all collectors + store write).", ()),
    MetricSpec("triscope_collector_duration_seconds", "gauge", "Wall time of the collector's last collect().", ("collector",)),
    MetricSpec("triscope_ticks_total", "counter", "Sampler ticks run.", ()),
    MetricSpec("triscope_spool_pending_samples", "gauge", "Samples waiting in the on-disk spool for the store to return.", ()),
    MetricSpec("triscope_spool_replayed_samples_total", "counter", "Spooled samples written back to the store (an earlier run's backlog for this database, or this run's after an outage).", ()),
    MetricSpec("triscope_store_last_write_age_seconds", "gauge", "Seconds since the writer last wrote to the store (ticks or spooled ones); it grows while the store does not answer.", ()),
    MetricSpec("triscope_spooled_samples_total", "counter", "Samples written to the on-disk spool because the store was unreachable.", ()),
    MetricSpec("triscope_dropped_samples_total", "counter", "Samples dropped because the spool was full.", ()),
    MetricSpec("triscope_store_write_errors_total", "counter", "Failed store writes (the tick went to the spool).", ()),
    MetricSpec("triscope_store_queue_spilled_ticks_total", "counter", "Ticks sent to the on-disk spool because the writer's in-memory queue held its cap of samples (the store writes slower than ticks arrive).", ()),
    # OTLP receiver (--otlp-listen, agent/otlp.py, docs/otlp.md)
    MetricSpec("triscope_otlp_requests_total", "counter", "OTLP/HTTP requests answered, by signal (traces, metrics; empty when refused before the path was read) and HTTP status code.", ("signal", "code")),
    MetricSpec("triscope_otlp_received_total", "counter", "Spans or data points in OTLP requests that decoded.", ("signal",)),
    MetricSpec("triscope_otlp_accepted_total", "counter", "Stage spans or data points added to the stage-duration series.", ("signal",)),
    MetricSpec("triscope_otlp_ignored_total", "counter", "Spans or data points not used: no stage (no_stage), a metric type that is not taken (unsupported_type); and point attributes not made labels because Prometheus reserves their name (reserved_label: __name__, any name starting with __).", ("signal", "reason")),
    MetricSpec("triscope_otlp_dropped_total", "counter", "Stage spans or data points dropped (and reported in the partial success): buffer_full (more than --otlp-max-items between two ticks), series_limit (only with a series cap set), stream_limit (more cumulative streams than the cap, none idle since the last tick), stream_conflict (a cumulative report below its stream's last one: two senders with one identity and start time), no_start_time (a cumulative point without a start time), bounds_mismatch (other bucket boundaries or another type than the series'), sender_budget / total_budget (a new series beyond the sample budget, triscope_budget_refused_series_total), not_finite, too_many_buckets, too_long (a span over an hour), reserved_name (a metric named triscope_* or __*), invalid.", ("signal", "reason")),
    MetricSpec("triscope_otlp_series", "gauge", "Stage-duration series the OTLP receiver feeds now.", ()),
    MetricSpec("triscope_otlp_series_samples", "gauge", "Samples a tick those series store: bounds + 3 per histogram series, 1 per counter.", ()),
    # the sample budget (agent/budget.py, docs/otlp.md "Budget"): OTLP senders and --scrape targets
    MetricSpec("triscope_budget_limit_samples", "gauge", "The sample budget, samples a tick: every sender together (scope total) and one sender by default (scope sender).", ("scope",)),
    MetricSpec("triscope_budget_used_samples", "gauge", "Samples a tick held by the series the budget admitted, by source (otlp, scrape).", ("source",)),
    MetricSpec("triscope_budget_senders", "gauge", "Senders holding part of the budget now, by source (an OTLP sender is its service.name and peer address, a scrape target its URL).", ("source",)),
    MetricSpec("triscope_budget_refused_series_total", "counter", "New series refused by the sample budget, by source and reason (sender_budget: the sender's share is full; total_budget: every sender together is at the total). Counted each time such a series is sent or scraped; series already admitted keep flowing.", ("source", "reason")),
]

CATALOGUE: dict[str, MetricSpec] = {s.name: s for s in _SPECS}


def spec(name: str) -> MetricSpec | None:
    return CATALOGUE.get(name)


def kind_of(name: str) -> MetricKind:
    s = CATALOGUE.get(name)
    if s is not None:
        return s.kind
    return "counter" if name.endswith("_total") else "gauge"
