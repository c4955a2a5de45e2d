/* ---------------------------------------------------------------- CUDA driver API (uprobes on libcuda)
 * Compiled on its own by the loader child for agent/collectors/cudacalls.py: a uprobe on the entry
 * and a uretprobe on the return of each driver entry point in the CU_ENTRY table below that the
 * library exports (the launch entries: entry only, and attached only when the launch probe is on).
 *
 * What is measured, per thread of the processes the agent tracks (cu_tgids, filled by the agent):
 *   - the time inside synchronisation calls and their number.  CUDA's default synchronisation
 *     SPINS in user space, so this is time the thread waits on the accelerator while the
 *     scheduler shows it running;
 *   - host-to-device copies (explicit H2D entry points, and the unified cuMemcpy/cuMemcpyAsync):
 *     one ring-buffer event each (source, destination, bytes, time inside), which the agent
 *     classifies against the pinned host ranges it keeps; a copy whose event found the ring full
 *     is summed here as "lost" so no byte goes uncounted;
 *   - device-to-host copies: time, bytes, calls;
 *   - kernel launches (when the launch probe is attached);
 *   - every call: a thread that calls the driver drives the accelerator.
 * Pinned host memory (cuMemHostAlloc, cuMemAllocHost_v2, cuMemHostRegister[_v2], cuMemFreeHost,
 * cuMemHostUnregister) is reported by ring-buffer event for EVERY process calling the library,
 * tracked or not: these calls are rare (allocators cache pinned blocks) and a process pins its
 * buffers before the agent may decide to track it.
 *
 * A call made from inside another probed call (a wrapper entry point calling another) is part of
 * the outer call: cu_inflight keeps the outermost call of each thread and a depth.
 * Arguments come through BCC's PT_REGS_PARM1..3 and PT_REGS_RC, which follow the calling convention
 * of the architecture it compiles for (x86_64 SysV: rdi, rsi, rdx; arm64: x0..x2); measured on x86_64 only.
 */
#include <uapi/linux/ptrace.h>

#define CU_SYNC 1
#define CU_H2D 2
#define CU_D2H 3
#define CU_UNIFIED 4
#define CU_PIN_ALLOC 5       /* (void **pp, size_t bytes): *pp read at return */
#define CU_PIN_REGISTER 6    /* (void *p, size_t bytes) */
#define CU_PIN_FREE 7        /* (void *p) */
#define CU_PIN_UNREGISTER 8  /* (void *p) */
#define CU_LAUNCH 9

#ifndef CU_TGIDS_MAX
#define CU_TGIDS_MAX 4096
#endif
#ifndef CU_THREADS_MAX
#define CU_THREADS_MAX 16384
#endif
#ifndef CU_RING_PAGES
#define CU_RING_PAGES 64
#endif
#define CU_NSYMS 32
#define CU_C_PIN_LOST 0      /* cu_counters: pinned-memory events the ring had no room for */

/* cumulative per thread; the agent takes differences between reads */
struct cu_thread {
    u64 calls;               /* probed calls that returned, and launches */
    u64 sync_ns;
    u64 sync_calls;
    u64 last_sync_start;     /* start of the latest sync call that returned */
    u64 d2h_ns;
    u64 d2h_bytes;
    u64 d2h_calls;
    u64 launches;
    u64 lost_ns;             /* H2D / unified copies whose event the ring had no room for */
    u64 lost_bytes;
    u64 lost_calls;
    u32 tgid;
    u32 pad;
};

/* the outermost probed call a thread is inside */
struct cu_call {
    u64 since;
    u64 a;                   /* host source (H2D, unified), host destination (D2H), pp or p (pinned) */
    u64 b;                   /* destination (unified) */
    u64 bytes;
    u32 kind;
    u32 sym;
    u32 depth;
    u32 tgid;
    u32 tracked;
    u32 pad;
};

struct cu_event {
    u64 start;
    u64 ns;
    u64 src;
    u64 dst;
    u64 bytes;
    u32 tgid;
    u32 tid;
    u32 kind;
    u32 sym;
};

BPF_HASH(cu_tgids, u32, u32, CU_TGIDS_MAX);
BPF_TABLE("lru_hash", u32, struct cu_thread, cu_threads, CU_THREADS_MAX);
BPF_TABLE("lru_hash", u32, struct cu_call, cu_inflight, CU_THREADS_MAX);
BPF_PERCPU_ARRAY(cu_sym_calls, u64, CU_NSYMS);
BPF_ARRAY(cu_counters, u64, 4);
BPF_RINGBUF_OUTPUT(cu_events, CU_RING_PAGES);

static __always_inline void cu_count_sym(u32 sym) {
    u64 *n = cu_sym_calls.lookup(&sym);
    if (n)
        *n += 1;
}

static __always_inline struct cu_thread *cu_thread_of(u32 tid, u32 tgid) {
    struct cu_thread *t = cu_threads.lookup(&tid);
    if (t && t->tgid == tgid)
        return t;
    struct cu_thread z = {.tgid = tgid};      /* new, or a thread id reused by another process */
    cu_threads.update(&tid, &z);
    return cu_threads.lookup(&tid);
}

static __always_inline int cu_enter(u32 kind, u32 sym, u64 a, u64 b, u64 bytes) {
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32, tid = (u32)pt;
    u32 tracked = cu_tgids.lookup(&tgid) != 0;
    if (!tracked && kind < CU_PIN_ALLOC)
        return 0;
    if (tracked)
        cu_count_sym(sym);
    struct cu_call *c = cu_inflight.lookup(&tid);
    if (c && c->depth) {
        c->depth += 1;
        return 0;
    }
    struct cu_call n = {.since = bpf_ktime_get_ns(), .a = a, .b = b, .bytes = bytes, .kind = kind, .sym = sym,
                        .depth = 1, .tgid = tgid, .tracked = tracked};
    cu_inflight.update(&tid, &n);
    return 0;
}

static __always_inline int cu_sync_enter(struct pt_regs *ctx, u32 sym) {
    return cu_enter(CU_SYNC, sym, 0, 0, 0);
}
/* cuMemcpyHtoD*(CUdeviceptr dst, const void *src, size_t bytes[, CUstream]) */
static __always_inline int cu_h2d_enter(struct pt_regs *ctx, u32 sym) {
    return cu_enter(CU_H2D, sym, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx));
}
/* cuMemcpyDtoH*(void *dst, CUdeviceptr src, size_t bytes[, CUstream]) */
static __always_inline int cu_d2h_enter(struct pt_regs *ctx, u32 sym) {
    return cu_enter(CU_D2H, sym, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx));
}
/* cuMemcpy*(CUdeviceptr dst, CUdeviceptr src, size_t bytes[, CUstream]) */
static __always_inline int cu_unified_enter(struct pt_regs *ctx, u32 sym) {
    return cu_enter(CU_UNIFIED, sym, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx));
}
/* cuMemHostAlloc(void **pp, size_t bytes, unsigned flags), cuMemAllocHost_v2(void **pp, size_t bytes) */
static __always_inline int cu_pin_alloc_enter(struct pt_regs *ctx, u32 sym) {
    return cu_enter(CU_PIN_ALLOC, sym, PT_REGS_PARM1(ctx), 0, PT_REGS_PARM2(ctx));
}
/* cuMemHostRegister[_v2](void *p, size_t bytes, unsigned flags) */
static __always_inline int cu_pin_register_enter(struct pt_regs *ctx, u32 sym) {
    return cu_enter(CU_PIN_REGISTER, sym, PT_REGS_PARM1(ctx), 0, PT_REGS_PARM2(ctx));
}
/* cuMemFreeHost(void *p) */
static __always_inline int cu_pin_free_enter(struct pt_regs *ctx, u32 sym) {
    return cu_enter(CU_PIN_FREE, sym, PT_REGS_PARM1(ctx), 0, 0);
}
/* cuMemHostUnregister(void *p) */
static __always_inline int cu_pin_unregister_enter(struct pt_regs *ctx, u32 sym) {
    return cu_enter(CU_PIN_UNREGISTER, sym, PT_REGS_PARM1(ctx), 0, 0);
}
/* cuLaunchKernel*: entry only, counted */
static __always_inline int cu_launch_enter(struct pt_regs *ctx, u32 sym) {
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32, tid = (u32)pt;
    if (!cu_tgids.lookup(&tgid))
        return 0;
    cu_count_sym(sym);
    struct cu_thread *t = cu_thread_of(tid, tgid);
    if (t) {
        t->launches += 1;
        t->calls += 1;
    }
    return 0;
}

/* The probed entry points: CU_ENTRY(symbol id, name, entry handler).  cudacalls.py reads this
   table (the one list of what is probed); ids index cu_sym_calls. */
#define CU_ENTRY(id, name, how) \
    int on_##name(struct pt_regs *ctx) { return how(ctx, id); }
CU_ENTRY(0, cuCtxSynchronize, cu_sync_enter)
CU_ENTRY(1, cuStreamSynchronize, cu_sync_enter)
CU_ENTRY(2, cuStreamSynchronize_ptsz, cu_sync_enter)
CU_ENTRY(3, cuEventSynchronize, cu_sync_enter)
CU_ENTRY(4, cuMemcpyHtoD_v2, cu_h2d_enter)
CU_ENTRY(5, cuMemcpyHtoD_v2_ptds, cu_h2d_enter)
CU_ENTRY(6, cuMemcpyHtoDAsync_v2, cu_h2d_enter)
CU_ENTRY(7, cuMemcpyHtoDAsync_v2_ptsz, cu_h2d_enter)
CU_ENTRY(8, cuMemcpyDtoH_v2, cu_d2h_enter)
CU_ENTRY(9, cuMemcpyDtoH_v2_ptds, cu_d2h_enter)
CU_ENTRY(10, cuMemcpyDtoHAsync_v2, cu_d2h_enter)
CU_ENTRY(11, cuMemcpyDtoHAsync_v2_ptsz, cu_d2h_enter)
CU_ENTRY(12, cuMemcpy, cu_unified_enter)
CU_ENTRY(13, cuMemcpy_ptds, cu_unified_enter)
CU_ENTRY(14, cuMemcpyAsync, cu_unified_enter)
CU_ENTRY(15, cuMemcpyAsync_ptsz, cu_unified_enter)
CU_ENTRY(16, cuMemHostAlloc, cu_pin_alloc_enter)
CU_ENTRY(17, cuMemAllocHost_v2, cu_pin_alloc_enter)
CU_ENTRY(18, cuMemHostRegister_v2, cu_pin_register_enter)
CU_ENTRY(19, cuMemHostRegister, cu_pin_register_enter)
CU_ENTRY(20, cuMemFreeHost, cu_pin_free_enter)
CU_ENTRY(21, cuMemHostUnregister, cu_pin_unregister_enter)
CU_ENTRY(22, cuLaunchKernel, cu_launch_enter)
CU_ENTRY(23, cuLaunchKernel_ptsz, cu_launch_enter)
CU_ENTRY(24, cuLaunchKernelEx, cu_launch_enter)
CU_ENTRY(25, cuLaunchKernelEx_ptsz, cu_launch_enter)

static __always_inline void cu_emit(u32 kind, struct cu_call *c, u32 tid, u64 ns, u64 src, u64 bytes,
                                    struct cu_thread *t) {
    struct cu_event *e = cu_events.ringbuf_reserve(sizeof(struct cu_event));
    if (!e) {
        if (t) {
            t->lost_ns += ns;
            t->lost_bytes += bytes;
            t->lost_calls += 1;
        } else {
            u32 k = CU_C_PIN_LOST;
            u64 *n = cu_counters.lookup(&k);
            if (n)
                __sync_fetch_and_add(n, 1);
        }
        return;
    }
    e->start = c->since;
    e->ns = ns;
    e->src = src;
    e->dst = c->b;
    e->bytes = bytes;
    e->tgid = c->tgid;
    e->tid = tid;
    e->kind = kind;
    e->sym = c->sym;
    cu_events.ringbuf_submit(e, 0);
}

/* the return of every probed entry point but the launches */
int on_cu_return(struct pt_regs *ctx) {
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct cu_call *c = cu_inflight.lookup(&tid);
    if (!c)
        return 0;                         /* entered before the probe was attached */
    if (c->depth > 1) {
        c->depth -= 1;
        return 0;
    }
    struct cu_call call = *c;
    cu_inflight.delete(&tid);
    u64 now = bpf_ktime_get_ns();
    u64 ns = now > call.since ? now - call.since : 0;
    int ok = (int)PT_REGS_RC(ctx) == 0;
    if (call.kind >= CU_PIN_ALLOC) {
        if (ok) {
            u64 p = call.a;
            if (call.kind == CU_PIN_ALLOC) {
                p = 0;
                bpf_probe_read_user(&p, sizeof(p), (void *)call.a);
            }
            if (p)
                cu_emit(call.kind, &call, tid, ns, p, call.bytes, 0);
        }
        if (!call.tracked)
            return 0;
    }
    struct cu_thread *t = cu_thread_of(tid, call.tgid);
    if (!t)
        return 0;
    t->calls += 1;
    u64 bytes = ok ? call.bytes : 0;
    switch (call.kind) {
    case CU_SYNC:
        t->sync_ns += ns;
        t->sync_calls += 1;
        t->last_sync_start = call.since;
        break;
    case CU_H2D:
    case CU_UNIFIED:
        cu_emit(call.kind, &call, tid, ns, call.a, bytes, t);
        break;
    case CU_D2H:
        t->d2h_ns += ns;
        t->d2h_bytes += bytes;
        t->d2h_calls += 1;
        break;
    default:
        break;
    }
    return 0;
}
