"""What the BPF program (``probes.bpf.c``) and the Python side agree on: probes, counter slots, records.

Imported by the agent (never imports bcc) and by the loader child.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

# slots of the `counters` rows (one row per possible CPU in a mmapable array, or a per-CPU array
# on kernels before 5.5; keep in sync with probes.bpf.c)
C_TCP_SKB = 0
C_TCP_SKB_ERR = 1
C_TCP_SYNACK = 2
C_IOMMU_MAP = 3
C_IOMMU_MAP_BYTES = 4
C_IOMMU_UNMAP = 5
C_IOMMU_UNMAP_BYTES = 6
C_IOMMU_FAULT = 7
C_AER_NONFATAL = 8
C_AER_FATAL = 9
C_AER_CORRECTED = 10
C_LOST_IOMMU_FAULT = 11
C_LOST_AER = 12
C_DMA_SG_TRUNCATED = 13
C_TCP_PEERS_INSERT_FAIL = 14
C_DMA_EVENTS = 15
C_TCP_STATE = 16           # + TCP state (1..13): slots 17..29
C_DMA_SG_ESTIMATED_BYTES = 30   # dma_map_sg bytes past the 128 entries an event carries, estimated from full_ents
C_WF_LOST = 31                  # wait-for: an interval not recorded (its thread's or the wait map full)
N_COUNTERS = 32

PEERS_MAX = 1024
DMA_KEYS_MAX = 4096
DEVNAME_LEN = 32

# Linux TCP states (include/net/tcp_states.h)
TCP_STATES = {
    1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
    7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV",
    13: "BOUND_INACTIVE",
}

# enum dma_data_direction
DMA_DIRECTIONS = {0: "bidirectional", 1: "to_device", 2: "from_device", 3: "none"}
DMA_OPS = {0: "map", 1: "unmap", 2: "error"}

AttachKind = Literal["tracepoint", "raw"]


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    """One logical probe: the label of ``triscope_probe_attached{probe}``.

    ``tracepoints`` are candidates (``category:event``); every one this kernel has is attached
    (renamed tracepoints across kernel versions, e.g. ``dma_map_page`` -> ``dma_map_phys``).
    ``fields`` must all be present in the tracepoint's tracefs format: for raw tracepoints this
    guards the argument positions the program reads.

    ``fns``: a probe made of several programs, one per tracepoint (aligned with ``tracepoints``);
    then every tracepoint is required, not a candidate, and ``fields`` lists ``tracepoint:field``.
    ``requires``: another probe this one is useless without (left off with it).
    """

    name: str
    define: str
    fn: str
    kind: AttachKind
    tracepoints: tuple[str, ...]
    fields: tuple[str, ...] = ()
    description: str = ""
    fns: tuple[str, ...] = ()
    requires: str = ""


PROBES: tuple[ProbeSpec, ...] = (
    ProbeSpec("tcp_retransmit", "WANT_TCP_SKB", "on_tcp_retransmit_skb", "tracepoint",
              ("tcp:tcp_retransmit_skb",), ("family", "dport", "daddr", "daddr_v6"),
              "TCP retransmits: total, by state, top peers"),
    ProbeSpec("tcp_retransmit_synack", "WANT_TCP_SYNACK", "on_tcp_retransmit_synack", "tracepoint",
              ("tcp:tcp_retransmit_synack",), ("family", "dport", "daddr", "daddr_v6"),
              "SYN-ACK retransmits"),
    ProbeSpec("dma_map", "WANT_DMA_MAP", "on_dma_map", "raw",
              ("dma:dma_map_phys", "dma:dma_map_page", "dma:dma_map_resource"),
              ("device", "dma_addr", "size", "dir"), "DMA mappings: count and bytes per device/direction"),
    ProbeSpec("dma_unmap", "WANT_DMA_UNMAP", "on_dma_unmap", "raw",
              ("dma:dma_unmap_phys", "dma:dma_unmap_page", "dma:dma_unmap_resource"),
              ("device", "size", "dir"), "DMA unmappings"),
    ProbeSpec("dma_map_sg", "WANT_DMA_MAP_SG", "on_dma_map_sg", "tracepoint",
              ("dma:dma_map_sg",), ("device", "lengths", "truncated", "dir"),
              "scatter-gather DMA mappings (bytes: the entries an event carries, up to 128, and past them "
              "an estimate from full_ents)"),
    ProbeSpec("dma_unmap_sg", "WANT_DMA_UNMAP_SG", "on_dma_unmap_sg", "raw",
              ("dma:dma_unmap_sg",), ("device", "dir"), "scatter-gather DMA unmappings"),
    ProbeSpec("dma_map_err", "WANT_DMA_MAP_SG_ERR", "on_dma_map_sg_err", "tracepoint",
              ("dma:dma_map_sg_err",), ("device", "dir"), "DMA mapping failures"),
    ProbeSpec("iommu_map", "WANT_IOMMU_MAP", "on_iommu_map", "raw",
              ("iommu:map",), ("iova", "size"), "IOMMU map: count and bytes"),
    ProbeSpec("iommu_unmap", "WANT_IOMMU_UNMAP", "on_iommu_unmap", "raw",
              ("iommu:unmap",), ("iova", "unmapped_size"), "IOMMU unmap: count and bytes"),
    ProbeSpec("iommu_page_fault", "WANT_IOMMU_FAULT", "on_iommu_fault", "tracepoint",
              ("iommu:io_page_fault",), ("device", "driver", "iova", "flags"), "IOMMU I/O page faults (events)"),
    ProbeSpec("aer", "WANT_AER", "on_aer_event", "tracepoint",
              ("ras:aer_event",), ("dev_name", "status", "severity"), "PCIe AER errors (events)"),
    ProbeSpec("waitfor", "WANT_WAITFOR", "on_wf_switch", "tracepoint",
              ("sched:sched_switch", "sched:sched_waking"),
              ("sched:sched_switch:prev_state", "sched:sched_switch:next_pid", "sched:sched_waking:pid"),
              "wait-for: the tracked workloads' threads on a CPU, waiting for one, blocked (in which syscall "
              "and descriptor) and who ended each wait", fns=("on_wf_switch", "on_wf_waking")),
    ProbeSpec("waitfor_irq", "WANT_WAITFOR", "on_wf_softirq_entry", "raw",
              # exits attached before entries: an exit without its entry is ignored, an entry without
              # its exit would leave a stale context (the program also heals one after 5 ms)
              ("irq:softirq_exit", "irq:irq_handler_exit", "timer:hrtimer_expire_exit",
               "irq:softirq_entry", "irq:irq_handler_entry", "timer:hrtimer_expire_entry"),
              ("irq:softirq_entry:vec", "irq:irq_handler_entry:irq"),
              "wait-for: wakeups in interrupt context (network receive, timers, device IRQs) told from the "
              "task they interrupted",
              fns=("on_wf_softirq_exit", "on_wf_irq_exit", "on_wf_hrtimer_exit",
                   "on_wf_softirq_entry", "on_wf_irq_entry", "on_wf_hrtimer_entry"), requires="waitfor"),
)

PROBE_BY_NAME = {p.name: p for p in PROBES}

# map name -> what the parent expects; only the maps of attached sections exist
# the wait-for maps the agent reads (WaitFor); wf_clk exists with the scheduler's BTF only (WF_SCHED)
WF_MAPS = ("wf_tgid_bits", "wf_tid_bits", "wf_cur", "wf_wait", "wf_slots", "wf_slot_bits")
WF_MAPS_OPTIONAL = ("wf_clk",)
MAPS = ("counters", "tcp_peers", "dma_stats", "dma_devs", "dma_named", "rare_events", *WF_MAPS, *WF_MAPS_OPTIONAL)

# wait-for (waitfor.bpf.c): map sizes, and the records the agent reads
WF_THREADS_MAX = 16384
WF_WAITS_MAX = 32768
WF_ONCPU, WF_RUNNABLE, WF_BLOCKED, WF_UNKNOWN = 1, 2, 3, 0
WF_KIND_BLOCKED, WF_KIND_RUNQ = 0, 1
WF_CTX_SOFTIRQ, WF_CTX_HARDIRQ, WF_CTX_HRTIMER, WF_CTX_NONE = 1, 2, 3, 4
# struct wf_cur: u64 since, cpu_ns, runq_ns, blocked_ns, switches; u32 tgid, state; s32 nr, fd; u32 by, gen;
# u64 rd0, c_ns, c_count; s32 c_nr, c_fd; u32 c_waker_tgid, c_waker_tid, c_ctx (the last wait, kept in the entry);
# u32 clk (the clock of `since`)
WF_CUR = struct.Struct("<5QIIiiII3QiiIIII")
WF_CLK_MONO, WF_CLK_RQ = 1, 2          # bpf_ktime_get_ns (CLOCK_MONOTONIC), the run queue's clock (sched_clock)
# struct wf_slot: struct wf_cur c; u64 tid (wf_slots: WF_THREADS_MAX of them, a thread in slot tid % that)
WF_SLOT = struct.Struct(WF_CUR.format + "Q")
WF_SLOT_TID = WF_CUR.size               # byte offset of the slot's tid
# struct wf_clk: u64 mono, rq (per CPU)
WF_CLK = struct.Struct("<QQ")
# struct wf_key: u32 tid, kind; s32 nr, fd; u32 waker_tgid, waker_tid, ctx, pad
WF_KEY = struct.Struct("<IIiiIIII")
# struct wf_val: u64 ns, count
WF_VAL = struct.Struct("<QQ")
# softirq vectors (include/linux/interrupt.h)
SOFTIRQ_NAMES = {0: "hi", 1: "timer", 2: "net_tx", 3: "net_rx", 4: "block", 5: "irq_poll", 6: "tasklet",
                 7: "sched", 8: "hrtimer", 9: "rcu"}

# struct rare_event (probes.bpf.c): u64 ts, u64 addr, u32 kind, status, severity, tlp_valid, tlp[4],
# char dev[32], char drv[32]
RARE_EVENT = struct.Struct("<QQIIII4I32s32s")
RARE_IOMMU_FAULT = 1
RARE_AER = 2

# struct peer_key: u16 family, u16 dport, u32 pad, u8 daddr[16]
PEER_KEY = struct.Struct("<HHI16s")
# struct dma_key: u64 dev, u32 dir, u32 op
DMA_KEY = struct.Struct("<QII")
# struct dma_named_key: char dev[32], u32 dir, u32 op
DMA_NAMED_KEY = struct.Struct("<32sII")
# struct dma_val: u64 count, u64 bytes
DMA_VAL = struct.Struct("<QQ")
