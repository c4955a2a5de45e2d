// triscope kernel probes (BCC).  Compiled once by a short-lived loader child; the agent reads the
// maps with plain bpf() syscalls.  Sections are switched on with -DWANT_<PROBE> for the tracepoints
// this kernel has, so a missing tracepoint never breaks the others.
//
// Attach types, chosen for cost:
//  - hot counting paths (DMA map/unmap, IOMMU map/unmap) use raw tracepoints (no record is built)
//    and per-CPU maps (no atomics, no shared cache lines);
//  - rare paths whose fields we need (TCP retransmits with state and peer, dma_map_sg with its
//    length array, faults, AER) use classic tracepoints, whose layout comes from tracefs at compile
//    time, so no kernel struct offsets are assumed;
//  - rare events with details (IOMMU faults, AER) go through a BPF ring buffer; a failed reserve is
//    counted in C_LOST_* and exported, never silent.
#include <uapi/linux/ptrace.h>
#include <linux/dma-direction.h>

#define AF_INET_ 2
#define AF_INET6_ 10
#define SKB_CB_OFF 40 /* offsetof(struct sk_buff, cb), 64-bit; tests/integration/test_ebpf_probes.py checks it */

// slots of the `counters` per-CPU array (keep in sync with agent/ebpf/layout.py)
#define C_TCP_SKB 0
#define C_TCP_SKB_ERR 1
#define C_TCP_SYNACK 2
#define C_IOMMU_MAP 3
#define C_IOMMU_MAP_BYTES 4
#define C_IOMMU_UNMAP 5
#define C_IOMMU_UNMAP_BYTES 6
#define C_IOMMU_FAULT 7
#define C_AER_NONFATAL 8
#define C_AER_FATAL 9
#define C_AER_CORRECTED 10
#define C_LOST_IOMMU_FAULT 11
#define C_LOST_AER 12
#define C_DMA_SG_TRUNCATED 13
#define C_TCP_PEERS_INSERT_FAIL 14
#define C_DMA_EVENTS 15 /* any DMA map/unmap/error seen: the agent reads the DMA hashes only when it moved */
#define C_TCP_STATE 16 /* 16 + tcp state: TCP states are 1..13, so slots 17..29 */
#define C_DMA_SG_ESTIMATED_BYTES 30 /* bytes past the entries a dma_map_sg event carries, estimated */
#define C_WF_LOST 31 /* wait-for: an interval not recorded (its thread or wait map full) */
#define N_COUNTERS 32

#ifdef COUNTERS_ROWS
// One row of counters per possible CPU in a plain array the agent maps into its memory
// (BPF_F_MMAPABLE): reading them costs no syscall.  Each CPU adds to its own row only, as in a
// per-CPU array; a row is 256 bytes, so two CPUs never share a cache line.
struct counter_row {
    u64 v[N_COUNTERS];
};
BPF_F_TABLE("array", u32, struct counter_row, counters, COUNTERS_ROWS, BPF_F_MMAPABLE);

static __always_inline void count(u32 slot, u64 n) {
    u32 cpu = bpf_get_smp_processor_id();
    struct counter_row *r = counters.lookup(&cpu);
    if (r)
        r->v[slot & (N_COUNTERS - 1)] += n;
}
#else
// kernels before 5.5 (no BPF_F_MMAPABLE): a per-CPU array read with one syscall per tick
BPF_PERCPU_ARRAY(counters, u64, N_COUNTERS);

static __always_inline void count(u32 slot, u64 n) {
    u64 *v = counters.lookup(&slot);
    if (v)
        *v += n;
}
#endif

#define DEVNAME_LEN 32

struct dma_val {
    u64 count;
    u64 bytes;
};
struct devname {
    char name[DEVNAME_LEN];
};

#if defined(WANT_IOMMU_FAULT) || defined(WANT_AER) || defined(WANT_SELFTEST)
// one record layout for every rare event (keep in sync with agent/ebpf/layout.py)
struct rare_event {
    u64 ts_ns;
    u64 addr;       // iova for faults
    u32 kind;       // 1 = iommu fault, 2 = aer
    u32 status;     // fault flags / AER status bits
    u32 severity;   // AER severity
    u32 tlp_valid;
    u32 tlp[4];
    char dev[DEVNAME_LEN];
    char drv[DEVNAME_LEN];
};
BPF_RINGBUF_OUTPUT(rare_events, 8);
#endif

/* ---------------------------------------------------------------- TCP retransmits */
#if defined(WANT_TCP_SKB) || defined(WANT_TCP_SYNACK)
struct peer_key {
    u16 family;
    u16 dport;
    u32 pad;
    u8 daddr[16];
};
BPF_TABLE("lru_hash", struct peer_key, u64, tcp_peers, PEERS_MAX);

static __always_inline void count_peer(u16 family, u16 dport, const u8 *v4, const u8 *v6) {
    struct peer_key k = {};
    k.family = family;
    k.dport = dport;
    if (family == AF_INET6_)
        __builtin_memcpy(k.daddr, v6, 16);
    else
        __builtin_memcpy(k.daddr, v4, 4);
    u64 *v = tcp_peers.lookup(&k);
    if (v) {
        __sync_fetch_and_add(v, 1);
        return;
    }
    u64 one = 1;
    if (tcp_peers.insert(&k, &one) != 0) {
        v = tcp_peers.lookup(&k);  // raced with another CPU
        if (v)
            __sync_fetch_and_add(v, 1);
        else
            count(C_TCP_PEERS_INSERT_FAIL, 1);
    }
}
#endif

#ifdef WANT_TCP_SKB
int on_tcp_retransmit_skb(struct tracepoint__tcp__tcp_retransmit_skb *args) {
#ifdef TCP_SKB_HAS_ERR
    if (args->err) {  // the retransmit was attempted but not sent: RetransSegs does not move
        count(C_TCP_SKB_ERR, 1);
        return 0;
    }
#endif
    // RetransSegs counts segments: a retransmitted GSO skb carries several (tcp_skb_pcount, the
    // tcp_gso_segs of the skb's control block).  Offsets, not <net/tcp.h>: that header alone
    // would add over a second to the compile at start.  sk_buff.cb is at 40 on 64-bit kernels
    // since 4.x (next/prev/dev, sk, tstamp before it) and tcp_gso_segs follows seq and end_seq in
    // struct tcp_skb_cb; an implausible value counts as one segment.
    u16 segs = 0;
    if (bpf_probe_read_kernel(&segs, sizeof(segs), (const u8 *)args->skbaddr + SKB_CB_OFF + 8) != 0 || segs == 0 ||
        segs > 1024)
        segs = 1;
    count(C_TCP_SKB, segs);
#ifdef TCP_SKB_HAS_STATE
    count(C_TCP_STATE + (args->state & 15), segs);
#endif
    count_peer(args->family, args->dport, args->daddr, args->daddr_v6);
    return 0;
}
#endif

#ifdef WANT_TCP_SYNACK
int on_tcp_retransmit_synack(struct tracepoint__tcp__tcp_retransmit_synack *args) {
    count(C_TCP_SYNACK, 1);
    count(C_TCP_STATE + 12 /* TCP_NEW_SYN_RECV */, 1);
    count_peer(args->family, args->dport, args->daddr, args->daddr_v6);
    return 0;
}
#endif

/* ---------------------------------------------------------------- DMA */
#if defined(WANT_DMA_MAP) || defined(WANT_DMA_UNMAP) || defined(WANT_DMA_UNMAP_SG) || defined(WANT_SELFTEST)
// raw tracepoints: keyed by the struct device pointer; the name is read once per key and CPU
struct dma_key {
    u64 dev;
    u32 dir;
    u32 op;  // 0 map, 1 unmap, 2 error
};
BPF_PERCPU_HASH(dma_stats, struct dma_key, struct dma_val, DMA_KEYS_MAX);
BPF_HASH(dma_devs, u64, struct devname, DMA_KEYS_MAX);

// C_DMA_EVENTS moves after the hash holds the event: a reader that sees it move finds the update
static __always_inline void dma_account(u64 dev, u32 dir, u32 op, u64 bytes) {
    struct dma_key k = {.dev = dev, .dir = dir, .op = op};
    struct dma_val *v = dma_stats.lookup(&k);
    if (v) {
        v->count += 1;
        v->bytes += bytes;
        count(C_DMA_EVENTS, 1);
        return;
    }
    struct dma_val init = {.count = 1, .bytes = bytes};
    dma_stats.update(&k, &init);
    // struct device starts with its kobject, whose first member is `const char *name`
    struct devname n = {};
    const char *p = 0;
    if (dev) {
        bpf_probe_read_kernel(&p, sizeof(p), (void *)dev);
        if (p)
            bpf_probe_read_kernel_str(n.name, sizeof(n.name), p);
    }
    dma_devs.update(&dev, &n);
    count(C_DMA_EVENTS, 1);
}
#endif

#ifdef WANT_DMA_MAP
// dma_map_phys / dma_map_page / dma_map_resource:
//   (struct device *dev, phys_addr_t phys, dma_addr_t dma_addr, size_t size, enum dir, attrs)
int on_dma_map(struct bpf_raw_tracepoint_args *ctx) {
    u64 dma_addr = ctx->args[2];
    if (dma_addr == ~0ULL)  // DMA_MAPPING_ERROR
        dma_account(ctx->args[0], (u32)ctx->args[4], 2, 0);
    else
        dma_account(ctx->args[0], (u32)ctx->args[4], 0, ctx->args[3]);
    return 0;
}
#endif

#ifdef WANT_DMA_UNMAP
// dma_unmap_phys / dma_unmap_page / dma_unmap_resource:
//   (struct device *dev, dma_addr_t addr, size_t size, enum dir, attrs)
int on_dma_unmap(struct bpf_raw_tracepoint_args *ctx) {
    dma_account(ctx->args[0], (u32)ctx->args[3], 1, ctx->args[2]);
    return 0;
}
#endif

#ifdef WANT_DMA_UNMAP_SG
// dma_unmap_sg: (struct device *dev, struct scatterlist *sgl, int nents, enum dir, attrs)
int on_dma_unmap_sg(struct bpf_raw_tracepoint_args *ctx) {
    dma_account(ctx->args[0], (u32)ctx->args[3], 1, 0);
    return 0;
}
#endif

#if defined(WANT_DMA_MAP_SG) || defined(WANT_DMA_MAP_SG_ERR)
// classic tracepoints, keyed by the device name the record carries
struct dma_named_key {
    char dev[DEVNAME_LEN];
    u32 dir;
    u32 op;
};
BPF_PERCPU_HASH(dma_named, struct dma_named_key, struct dma_val, DMA_KEYS_MAX);
#define SG_MAX 128
struct sg_buf {
    u32 len[SG_MAX];
};
BPF_PERCPU_ARRAY(sg_scratch, struct sg_buf, 1);

static __always_inline void dma_named_account(struct dma_named_key *k, u64 bytes) {
    struct dma_val *v = dma_named.lookup(k);
    if (v) {
        v->count += 1;
        v->bytes += bytes;
    } else {
        struct dma_val init = {.count = 1, .bytes = bytes};
        dma_named.update(k, &init);
    }
    count(C_DMA_EVENTS, 1);
}
#endif

#ifdef WANT_DMA_MAP_SG
int on_dma_map_sg(struct tracepoint__dma__dma_map_sg *args) {
    struct dma_named_key k = {};
    TP_DATA_LOC_READ_STR(k.dev, device, sizeof(k.dev));
    k.dir = args->dir;
    k.op = 0;
    u64 bytes = 0;
    int zero = 0;
    struct sg_buf *sb = sg_scratch.lookup(&zero);
    u32 *buf = sb ? sb->len : 0;
    if (buf) {
        u32 loc = args->data_loc_lengths;
        u32 off = loc & 0xFFFF;
        u32 len = loc >> 16;
        if (len > SG_MAX * 4)
            len = SG_MAX * 4;
        if (len > 0 && bpf_probe_read_kernel(buf, len, (char *)args + off) == 0) {
            u32 n = len / 4;
            // fixed trip count (the verifier must see every index < SG_MAX)
#pragma unroll
            for (int i = 0; i < SG_MAX; i++)
                bytes += (i < n) ? buf[i] : 0;
#ifdef DMA_SG_HAS_FULL_ENTS
            // the event carries the lengths of the first SG_MAX mapped entries only; a map of more
            // (a large pinned buffer: thousands) is estimated from the mean of those it carries
            int full = args->full_ents;
            if (args->truncated && n > 0 && full > (int)n) {
                u64 est = bytes * (u64)full / n;
                count(C_DMA_SG_ESTIMATED_BYTES, est - bytes);
                bytes = est;
            }
#endif
        }
    }
    if (args->truncated)
        count(C_DMA_SG_TRUNCATED, 1);
    dma_named_account(&k, bytes);
    return 0;
}
#endif

#ifdef WANT_DMA_MAP_SG_ERR
int on_dma_map_sg_err(struct tracepoint__dma__dma_map_sg_err *args) {
    struct dma_named_key k = {};
    TP_DATA_LOC_READ_STR(k.dev, device, sizeof(k.dev));
    k.dir = args->dir;
    k.op = 2;
    dma_named_account(&k, 0);
    return 0;
}
#endif

/* ---------------------------------------------------------------- IOMMU */
#ifdef WANT_IOMMU_MAP
// iommu:map (unsigned long iova, phys_addr_t paddr, size_t size)
int on_iommu_map(struct bpf_raw_tracepoint_args *ctx) {
    count(C_IOMMU_MAP, 1);
    count(C_IOMMU_MAP_BYTES, ctx->args[2]);
    return 0;
}
#endif

#ifdef WANT_IOMMU_UNMAP
// iommu:unmap (unsigned long iova, size_t size, size_t unmapped_size)
int on_iommu_unmap(struct bpf_raw_tracepoint_args *ctx) {
    count(C_IOMMU_UNMAP, 1);
    count(C_IOMMU_UNMAP_BYTES, ctx->args[2]);
    return 0;
}
#endif

#ifdef WANT_IOMMU_FAULT
int on_iommu_fault(struct tracepoint__iommu__io_page_fault *args) {
    count(C_IOMMU_FAULT, 1);
    struct rare_event *e = rare_events.ringbuf_reserve(sizeof(struct rare_event));
    if (!e) {
        count(C_LOST_IOMMU_FAULT, 1);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->ts_ns = bpf_ktime_get_ns();
    e->kind = 1;
    e->addr = args->iova;
    e->status = args->flags;
    TP_DATA_LOC_READ_STR(e->dev, device, sizeof(e->dev));
    TP_DATA_LOC_READ_STR(e->drv, driver, sizeof(e->drv));
    rare_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    return 0;
}
#endif

/* ---------------------------------------------------------------- PCIe AER */
#ifdef WANT_AER
#ifdef AER_SYNTHETIC_ARGS
// the ras:aer_event record layout (kernel 5.x-6.x), for verifying this program on kernels without
// the tracepoint (tests); where the tracepoint exists BCC builds the struct from tracefs instead
struct aer_synthetic_args {
    u64 common;
    int data_loc_dev_name;
    u32 status;
    u8 severity;
    u8 tlp_header_valid;
    u8 pad[2];
    u32 tlp_header[4];
};
#define AER_ARGS_TYPE struct aer_synthetic_args
#endif
#ifndef AER_ARGS_TYPE
#define AER_ARGS_TYPE struct tracepoint__ras__aer_event
#endif
int on_aer_event(AER_ARGS_TYPE *args) {
    u32 sev = args->severity;
    if (sev > 2)
        sev = 0;
    count(C_AER_NONFATAL + sev, 1);
    struct rare_event *e = rare_events.ringbuf_reserve(sizeof(struct rare_event));
    if (!e) {
        count(C_LOST_AER, 1);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->ts_ns = bpf_ktime_get_ns();
    e->kind = 2;
    e->status = args->status;
    e->severity = args->severity;
#ifdef AER_HAS_TLP
    e->tlp_valid = args->tlp_header_valid;
    e->tlp[0] = args->tlp_header[0];
    e->tlp[1] = args->tlp_header[1];
    e->tlp[2] = args->tlp_header[2];
    e->tlp[3] = args->tlp_header[3];
#endif
    TP_DATA_LOC_READ_STR(e->dev, dev_name, sizeof(e->dev));
    rare_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    return 0;
}
#endif

/* ---------------------------------------------------------------- self-test hook (tests only) */
#ifdef WANT_SELFTEST
// Attached to raw_syscalls:sys_enter by the tests: each getppid() of SELFTEST_PID goes through the
// same DMA accounting and ring-buffer paths as real events (this VM has no DMA/IOMMU traffic).
int on_selftest(struct bpf_raw_tracepoint_args *ctx) {
    if (ctx->args[1] != SELFTEST_NR)
        return 0;
    if ((bpf_get_current_pid_tgid() >> 32) != SELFTEST_PID)
        return 0;
    char name[DEVNAME_LEN] = "selftest0";
    const char *fake_dev = name;  // like struct device: first word points at the name
    dma_account((u64)&fake_dev, 1, 0, 4096);
    count(C_IOMMU_FAULT, 1);
    struct rare_event *e = rare_events.ringbuf_reserve(sizeof(struct rare_event));
    if (!e) {
        count(C_LOST_IOMMU_FAULT, 1);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->ts_ns = bpf_ktime_get_ns();
    e->kind = 1;
    e->addr = 0xfee00000;
    e->status = 0x2;
    __builtin_memcpy(e->dev, name, DEVNAME_LEN);
    rare_events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    return 0;
}
#endif
