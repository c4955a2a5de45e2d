/* ---------------------------------------------------------------- wait-for (docs/waitfor.md)
 * Appended to probes.bpf.c by the loader.  For the threads of the processes the agent tracks (the
 * workloads on the accelerators, and the producers they wait on), where each thread's time goes:
 * on a CPU, runnable without a CPU, blocked; and for every blocked interval, the syscall and file
 * descriptor it blocked in and **who ended it** (the waking task, or the interrupt context the
 * wakeup ran in: a softirq vector, a hardware IRQ, an hrtimer).
 *
 * Cost is what decides the shape.  Every context switch on the node enters on_wf_switch, so the
 * test for "is this task tracked" is two bits in plain arrays indexed by pid (no hashing): a
 * process bit (tgid, set by the agent) and a thread bit (set here at a tracked process's thread's
 * first switch, and by the agent for the threads it lists).  Only tracked threads go further.
 * The blocked syscall is read from the task's saved user registers at the switch
 * (bpf_task_pt_regs), so no raw_syscalls probe runs for every syscall of the node.
 *
 * Per thread, an entry holds the open interval (state, since) and cumulative totals of closed ones;
 * the agent reads it every tick and adds the open part itself.  The entry lives in the slot of the
 * wf_slots array that the thread's id picks (tid modulo WF_THREADS_MAX, the tid kept beside it to tell
 * another thread's): a plain array, no hashing on a followed thread's switch.  A thread whose slot
 * another followed thread holds keeps its entry in the wf_cur hash instead, as does a thread the agent
 * has seeded until its first switch out moves it to its slot; wf_slot_bits says which slots are held.  Each blocked interval that ends is
 * kept in its thread's entry while the next one is of the same kind {syscall, fd, waker} (the last
 * wait, with a generation number), and added to wf_wait under {thread, syscall, fd, waker} when
 * another kind takes its place; the agent reads both and drains wf_wait every tick.
 *
 * With the scheduler's structures in the kernel's BTF (WF_SCHED, offsets from btfoffsets.py), a
 * wakeup of a followed thread only stores who woke it in the thread's slot of wf_woke (no hash, no
 * clock: the untracked and the tracked wakeup cost nearly the same), and the wait is closed when the
 * thread takes a CPU, where its entry is read anyway: blocked until its wakeup, then on a run queue
 * for what the scheduler itself counted (sched_info.run_delay since it blocked, and the wait in
 * progress since last_queued).  Without them, the wakeup looks the entry up, reads the clock and
 * closes the wait there (bench waitfor: the "fallback" cost centre).
 */
#ifdef WANT_WAITFOR
#define WF_UNKNOWN 0
#define WF_ONCPU 1
#define WF_RUNNABLE 2
#define WF_BLOCKED 3

#define WF_KIND_BLOCKED 0
#define WF_KIND_RUNQ 1   /* reserved: a runnable interval by who took the CPU (not recorded: its cost, bench waitfor) */

/* where a wakeup ran when it was not a task's own doing (wf_key.ctx: kind << 24 | detail) */
#define WF_CTX_SOFTIRQ 1
#define WF_CTX_HARDIRQ 2
#define WF_CTX_HRTIMER 3
#define WF_CTX_NONE 4     /* the wait ended without a wakeup seen (switched in while marked blocked) */

struct wf_cur {
    u64 since;       /* start of the open interval (bpf_ktime_get_ns); 0: not known */
    u64 cpu_ns;      /* closed intervals, cumulative */
    u64 runq_ns;
    u64 blocked_ns;
    u64 switches;
    u32 tgid;
    u32 state;
    s32 nr;          /* blocked: the syscall, -1 none known */
    s32 fd;          /* blocked: its file descriptor argument, -1 none */
    u32 by;          /* runnable after a preemption: the thread that took the CPU */
    u32 gen;         /* the last wait's generation: +1 each time another kind of wait takes its place */
    u64 rd0;         /* blocked (WF_SCHED): the kernel's run_delay of the thread when it blocked; 0 unknown */
    /* the last wait's kind and what it gathered since it became the last one: the kernel adds a wait
       here while the next one is of the same kind (a thread mostly waits on the same thing), and
       moves it to wf_wait only when another kind follows; the agent reads both */
    u64 c_ns;
    u64 c_count;
    s32 c_nr;
    s32 c_fd;
    u32 c_waker_tgid;
    u32 c_waker_tid;
    u32 c_ctx;
    u32 clk;         /* the clock of `since`: WF_CLK_MONO (bpf_ktime_get_ns, what the agent seeds) or WF_CLK_RQ */
};
#define WF_CLK_MONO 1
#define WF_CLK_RQ 2   /* the run queue's clock (rq->clock, sched_clock): WF_SCHED; wf_clk pairs it with the other */

struct wf_key {
    u32 tid;
    u32 kind;
    s32 nr;
    s32 fd;
    u32 waker_tgid;
    u32 waker_tid;
    u32 ctx;
    u32 pad;
};

struct wf_val {
    u64 ns;
    u64 count;
};

struct wf_ctx_stack {
    u32 depth;
    u32 top[4];
    u64 at[4];       /* jiffies when each was entered: an entry older than WF_CTX_MAX_JIFFIES is stale (its exit was missed) */
};
#define WF_CTX_MAX_JIFFIES 2   /* 2-3 ticks: longer than any softirq run (netdev budget 2 ms), IRQ or hrtimer */

/* who woke a tracked thread (WF_SCHED): written by sched_waking into the slot of the thread's id,
   read and cleared when the thread next takes a CPU.  Two followed threads whose ids share a slot
   and are woken before either runs leave the first one's waker unknown (its wait is still counted). */
struct wf_woke {
    u32 tid;
    u32 waker_tgid;
    u32 waker_tid;
    u32 ctx;
};
#define WF_WOKE_SLOTS 8192

BPF_ARRAY(wf_tgid_bits, u64, WF_BITS_WORDS);
BPF_ARRAY(wf_tid_bits, u64, WF_BITS_WORDS);
BPF_HASH(wf_cur, u32, struct wf_cur, WF_THREADS_MAX);
BPF_HASH(wf_wait, struct wf_key, struct wf_val, WF_WAITS_MAX);
BPF_PERCPU_ARRAY(wf_ctxs, struct wf_ctx_stack, 1);
#ifdef WF_SCHED
BPF_ARRAY(wf_woke, struct wf_woke, WF_WOKE_SLOTS);
/* now and then (a followed thread's 1st, 65th, ... switch out, and when a seeded entry is converted)
   both clocks read on this CPU: the agent turns the run queue's clock into its own with them */
struct wf_clk {
    u64 mono;
    u64 rq;
};
BPF_PERCPU_ARRAY(wf_clk, struct wf_clk, 1);
#define WF_CLK WF_CLK_RQ
#else
#define WF_CLK WF_CLK_MONO
#endif

struct wf_slot {
    struct wf_cur c;
    u64 tid;         /* the thread whose entry this is; 0 free (64 bits: the compare-and-swap that claims it) */
};
#ifdef COUNTERS_ROWS      /* Linux 5.5+: mapped into the agent (no syscall per thread and tick) */
BPF_F_TABLE("array", u32, struct wf_slot, wf_slots, WF_THREADS_MAX, BPF_F_MMAPABLE);
BPF_F_TABLE("array", u32, u64, wf_slot_bits, WF_THREADS_MAX / 64, BPF_F_MMAPABLE);
#else
BPF_ARRAY(wf_slots, struct wf_slot, WF_THREADS_MAX);
BPF_ARRAY(wf_slot_bits, u64, WF_THREADS_MAX / 64);
#endif

/* bit `id` of a bit array (one u64 per 64 pids); pids past the array (pid_max raised since the
   program was built) are never tracked */
static __always_inline u64 *wf_tgid_word(u32 id) {
    u32 w = id >> 6;
    return w < WF_BITS_WORDS ? wf_tgid_bits.lookup(&w) : 0;
}
static __always_inline u64 *wf_tid_word(u32 id) {
    u32 w = id >> 6;
    return w < WF_BITS_WORDS ? wf_tid_bits.lookup(&w) : 0;
}
#define WF_BIT(word, id) ((word) && ((*(word) >> ((id) & 63)) & 1))

/* a followed thread's entry where the tid picks it (switching in: the thread id alone is known) */
static __always_inline struct wf_cur *wf_get(u32 tid) {
    u32 s = tid & (WF_THREADS_MAX - 1);
    struct wf_slot *e = wf_slots.lookup(&s);
    if (e && e->tid == tid)
        return &e->c;
    return wf_cur.lookup(&tid);
}

/* the entry of a followed thread switching out, made where it has none: its slot when free, held
   by a thread no longer followed (its bit cleared by the agent), or by an earlier process's thread
   of the same id; else the hash.  An entry the agent seeded in the hash moves to the slot. */
static __always_inline struct wf_cur *wf_get_or_make(u32 tid, u32 tgid) {
    u32 s = tid & (WF_THREADS_MAX - 1);
    struct wf_slot *e = wf_slots.lookup(&s);
    if (!e)
        return 0;
    u64 holder = e->tid;
    if (holder == tid && e->c.tgid == tgid)
        return &e->c;
    struct wf_cur *h = wf_cur.lookup(&tid);
    u64 *hw = holder && holder != tid ? wf_tid_word((u32)holder) : 0;
    if (!holder || holder == tid || !WF_BIT(hw, (u32)holder)) {
        if (__sync_val_compare_and_swap(&e->tid, holder, (u64)tid) == holder) {
            if (h) {
                e->c = *h;
                wf_cur.delete(&tid);
            } else {
                __builtin_memset(&e->c, 0, sizeof(e->c));
                e->c.tgid = tgid;
                e->c.nr = -1;
                e->c.fd = -1;
                e->c.c_nr = -1;
                e->c.c_fd = -1;
                e->c.clk = WF_CLK;
            }
            u32 w = s >> 6;
            u64 *bits = wf_slot_bits.lookup(&w);
            if (bits && !((*bits >> (s & 63)) & 1))
                __sync_fetch_and_or(bits, 1ULL << (s & 63));
            return &e->c;
        }
    }
    if (h)
        return h;
    struct wf_cur z = {.tgid = tgid, .nr = -1, .fd = -1, .c_nr = -1, .c_fd = -1, .clk = WF_CLK};
    if (wf_cur.insert(&tid, &z) != 0)
        count(C_WF_LOST, 1);
    return wf_cur.lookup(&tid);
}

/* an exiting thread's entry let go */
static __always_inline void wf_drop(u32 tid) {
    u32 s = tid & (WF_THREADS_MAX - 1);
    struct wf_slot *e = wf_slots.lookup(&s);
    if (e && e->tid == tid) {
        /* its bit first: a thread claiming the slot once it is free sets it again */
        u32 w = s >> 6;
        u64 *bits = wf_slot_bits.lookup(&w);
        if (bits)
            __sync_fetch_and_and(bits, ~(1ULL << (s & 63)));
        e->tid = 0;
    } else {
        wf_cur.delete(&tid);
    }
}

static __always_inline void wf_add(struct wf_key *k, u64 ns, u64 n) {
    struct wf_val *v = wf_wait.lookup(k);
    if (v) {
        __sync_fetch_and_add(&v->ns, ns);
        __sync_fetch_and_add(&v->count, n);
        return;
    }
    struct wf_val init = {.ns = ns, .count = n};
    if (wf_wait.insert(k, &init) != 0) {
        v = wf_wait.lookup(k);   /* raced with another CPU, or the map is full */
        if (v) {
            __sync_fetch_and_add(&v->ns, ns);
            __sync_fetch_and_add(&v->count, n);
        } else {
            count(C_WF_LOST, 1);
        }
    }
}

/* a blocked interval of `tid` ended: `d` ns in syscall nr on fd, ended by the waker or ctx */
static __always_inline void wf_close(struct wf_cur *c, u32 tid, s32 nr, s32 fd, u32 wtgid, u32 wtid, u32 ctx, u64 d) {
    if (c->c_count && c->c_nr == nr && c->c_fd == fd && c->c_waker_tgid == wtgid && c->c_waker_tid == wtid
        && c->c_ctx == ctx) {
        c->c_ns += d;         /* only the thread's own switches write its entry: no other CPU at once */
        c->c_count += 1;
        return;
    }
    if (c->c_count) {
        struct wf_key k = {.tid = tid, .kind = WF_KIND_BLOCKED, .nr = c->c_nr, .fd = c->c_fd,
                           .waker_tgid = c->c_waker_tgid, .waker_tid = c->c_waker_tid, .ctx = c->c_ctx};
        wf_add(&k, c->c_ns, c->c_count);
    }
    c->gen += 1;
    c->c_nr = nr;
    c->c_fd = fd;
    c->c_waker_tgid = wtgid;
    c->c_waker_tid = wtid;
    c->c_ctx = ctx;
    c->c_ns = d;
    c->c_count = 1;
}

/* the wait a thread leaves behind when it exits: to wf_wait, as another kind of wait would */
static __always_inline void wf_flush(struct wf_cur *c, u32 tid) {
    if (c->c_count) {
        struct wf_key k = {.tid = tid, .kind = WF_KIND_BLOCKED, .nr = c->c_nr, .fd = c->c_fd,
                           .waker_tgid = c->c_waker_tgid, .waker_tid = c->c_waker_tid, .ctx = c->c_ctx};
        wf_add(&k, c->c_ns, c->c_count);
        c->c_count = 0;
    }
}

#define WF_LOAD(type, p, off) (*(type *)((char *)(p) + (off)))

/* the syscall a task blocked in and its fd argument, from its saved user registers (a BTF pointer:
   plain loads, no probe-read helper calls) */
static __always_inline void wf_blocked_in(struct wf_cur *c, struct task_struct *t) {
    c->nr = -1;
    c->fd = -1;
#if defined(__x86_64__) && !defined(WF_NO_REGS)
    struct pt_regs *r = (struct pt_regs *)bpf_task_pt_regs(t);
    long nr = r->orig_ax, a0 = r->di;
    c->nr = (s32)nr;
    switch (nr) {
    case 0: case 1: case 16: case 17: case 19: case 20: case 42: case 43: case 44: case 45: case 46: case 47:
    case 232: case 281: case 288: case 299: case 307: case 441: case 295:
        /* read write ioctl pread64 readv writev connect accept sendto recvfrom sendmsg recvmsg
           epoll_wait epoll_pwait accept4 recvmmsg sendmmsg epoll_pwait2 preadv: the fd is the first argument */
        c->fd = (s32)a0;
        break;
    case 7: case 271: {
        /* poll / ppoll: the first pollfd's descriptor (a single-socket wait is the common one) */
        long a1 = r->si;
        int fd = -1;
        if (a1 > 0 && bpf_probe_read_user(&fd, sizeof(fd), (void *)a0) == 0)
            c->fd = fd;
        break;
    }
    default:
        break;
    }
#endif
}

#ifdef WF_SCHED
/* the run-queue wait of the task switching in since it blocked (rd0: its run_delay then), as the
   scheduler counted it (sched_info: run_delay, and the wait in progress since last_queued, on this
   CPU's clock): exact, whichever CPUs it was queued on meanwhile */
static __always_inline u64 wf_runq_since(struct task_struct *prev, u64 rd0) {
    void *cfs = WF_LOAD(void *, prev, WF_OFF_TASK_CFS_RQ);
    if (!cfs)
        return 0;
    void *rq = WF_LOAD(void *, cfs, WF_OFF_CFS_RQ_RQ);
    if (!rq)
        return 0;
    void *next = WF_LOAD(void *, rq, WF_OFF_RQ_CURR);   /* set to the next task before the tracepoint */
    if (!next)
        return 0;
    u64 rd = WF_LOAD(u64, next, WF_OFF_RUN_DELAY), lq = WF_LOAD(u64, next, WF_OFF_LAST_QUEUED);
    u64 clk = WF_LOAD(u64, rq, WF_OFF_RQ_CLOCK);
    if (lq && clk > lq)
        rd += clk - lq;
    return (rd0 && rd > rd0) ? rd - rd0 : 0;
}

/* the scheduler's clock of this CPU's run queue (rq->clock, which __schedule updates just before
   sched_switch): two loads through the task leaving the CPU, where bpf_ktime_get_ns reads the clock
   source (bench waitfor: prototypes); 0 when not found */
static __always_inline u64 wf_now(struct task_struct *cur) {
    void *cfs = WF_LOAD(void *, cur, WF_OFF_TASK_CFS_RQ);
    if (!cfs)
        return 0;
    void *rq = WF_LOAD(void *, cfs, WF_OFF_CFS_RQ_RQ);
    return rq ? WF_LOAD(u64, rq, WF_OFF_RQ_CLOCK) : 0;
}

/* both clocks on this CPU, for the agent; the offset from the run queue's clock to the other */
static __always_inline s64 wf_clk_pair(u64 rq_now) {
    u64 mono = bpf_ktime_get_ns();
    u32 zero = 0;
    struct wf_clk *k = wf_clk.lookup(&zero);
    if (k) {
        k->mono = mono;
        k->rq = rq_now;
    }
    return (s64)(mono - rq_now);
}

/* an entry the agent seeded (its `since` on bpf_ktime_get_ns's clock) moved to the run queue's */
static __always_inline void wf_own_clock(struct wf_cur *c, u64 rq_now) {
    if (c->clk == WF_CLK_RQ || !rq_now)
        return;
    s64 off = wf_clk_pair(rq_now);
    if (c->since)
        c->since = (s64)c->since - off > 0 ? (u64)((s64)c->since - off) : 0;
    c->clk = WF_CLK_RQ;
}
#endif

/* who is waking a thread now: the interrupt context the wakeup runs in, else the current task */
static __always_inline void wf_waker(u32 *wtgid, u32 *wtid, u32 *ctx) {
    u32 zero = 0;
    struct wf_ctx_stack *s = wf_ctxs.lookup(&zero);
    if (s && s->depth && s->depth <= 4 && bpf_jiffies64() - s->at[(s->depth - 1) & 3] > WF_CTX_MAX_JIFFIES)
        s->depth = 0;       /* an exit was missed (a program attached between an entry and its exit): heal */
    if (s && s->depth) {
        *ctx = s->top[(s->depth - 1) & 3];
        *wtgid = 0;
        *wtid = 0;
    } else {
        u64 pt = bpf_get_current_pid_tgid();
        *wtgid = pt >> 32;
        *wtid = (u32)pt;
        *ctx = 0;
    }
}

int on_wf_switch(struct tracepoint__sched__sched_switch *args) {
    u64 now = 0;
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32, tid = (u32)pt;
    struct task_struct *prev = 0;
    /* the task leaving the CPU (the current one) */
    u64 *tw = tid ? wf_tgid_word(tgid) : 0;
    if (WF_BIT(tw, tgid)) {
        struct wf_cur *c = wf_get_or_make(tid, tgid);
        /* its thread bit: set here for a thread the agent has not listed (a new one), and again if
           the agent's read-modify-write of the word raced with it */
        u64 *w = wf_tid_word(tid);
        if (w && !((*w >> (tid & 63)) & 1))
            __sync_fetch_and_or(w, 1ULL << (tid & 63));
        if (c) {
#ifdef WF_SCHED
            prev = bpf_get_current_task_btf();
            now = wf_now(prev);
            wf_own_clock(c, now);
            if ((c->switches & 63) == 0)
                wf_clk_pair(now);
#else
            now = bpf_ktime_get_ns();
#endif
            if (c->since && now > c->since)
                c->cpu_ns += now - c->since;   /* it was on a CPU until now, whatever the entry said */
            long st = args->prev_state;
            c->since = now;
            c->switches += 1;
            c->by = 0;
            if ((st & 0xff) == 0) {            /* R or R+ (preempted): runnable */
                c->state = WF_RUNNABLE;
                c->by = args->next_pid;
            } else if (st & 0x30) {            /* X, Z: exiting */
                wf_flush(c, tid);
                wf_drop(tid);
            } else {
                c->state = WF_BLOCKED;
                if (!prev)
                    prev = bpf_get_current_task_btf();
                wf_blocked_in(c, prev);
#ifdef WF_SCHED
                c->rd0 = WF_LOAD(u64, prev, WF_OFF_RUN_DELAY);
#endif
            }
        }
    }
    /* the task taking the CPU */
    u32 ntid = args->next_pid;
    u64 *nw = ntid ? wf_tid_word(ntid) : 0;
    if (WF_BIT(nw, ntid)) {
        struct wf_cur *n = wf_get(ntid);
        if (n) {
#ifdef WF_SCHED
            if (!prev)
                prev = bpf_get_current_task_btf();
            if (!now)
                now = wf_now(prev);
            wf_own_clock(n, now);
#else
            if (!now)
                now = bpf_ktime_get_ns();
#endif
            u64 d = (n->since && now > n->since) ? now - n->since : 0;
#ifdef WF_SCHED
            /* blocked until its wakeup, then on a run queue: the waker from its slot, the run-queue
               part from the scheduler's own count */
            u32 slot = ntid & (WF_WOKE_SLOTS - 1);
            struct wf_woke *wk = wf_woke.lookup(&slot);
            int woke = wk && wk->tid == ntid;
            if (n->state == WF_BLOCKED || (n->state == WF_UNKNOWN && woke)) {
                u64 q = n->state == WF_BLOCKED ? wf_runq_since(prev, n->rd0) : 0;
                if (q > d)
                    q = d;
                s32 nr = n->state == WF_BLOCKED ? n->nr : -1, fd = n->state == WF_BLOCKED ? n->fd : -1;
                if (woke) {
                    wf_close(n, ntid, nr, fd, wk->waker_tgid, wk->waker_tid, wk->ctx, d - q);
                    wk->tid = 0;
                } else {
                    wf_close(n, ntid, nr, fd, 0, 0, WF_CTX_NONE << 24, d - q);
                }
                n->blocked_ns += d - q;
                n->runq_ns += q;
            } else {
                n->runq_ns += d;
            }
#else
            if (n->state == WF_BLOCKED) {      /* its wakeup was not seen */
                wf_close(n, ntid, n->nr, n->fd, 0, 0, WF_CTX_NONE << 24, d);
                n->blocked_ns += d;
            } else {
                /* runnable time is the thread's own total; who held the CPU meanwhile (n->by) is not
                   recorded per interval: a hash update on every preemption of a followed thread cost
                   a quarter of its programs' time (bench waitfor) and nothing read it */
                n->runq_ns += d;
            }
#endif
            n->state = WF_ONCPU;
            n->since = now;
            n->by = 0;
        }
    }
    return 0;
}

#ifdef WF_SCHED
/* a followed thread is woken: only who woke it is noted (a plain store in its slot); the wait is
   closed when it takes a CPU, where its entry is read anyway */
int on_wf_waking(struct tracepoint__sched__sched_waking *args) {
    u32 tid = args->pid;
    u64 *w = wf_tid_word(tid);
    if (!WF_BIT(w, tid))
        return 0;
    u32 slot = tid & (WF_WOKE_SLOTS - 1);
    struct wf_woke *s = wf_woke.lookup(&slot);
    if (!s)
        return 0;
    u32 wtgid, wtid, wctx;
    wf_waker(&wtgid, &wtid, &wctx);
    s->waker_tgid = wtgid;
    s->waker_tid = wtid;
    s->ctx = wctx;
    s->tid = tid;
    return 0;
}
#else
int on_wf_waking(struct tracepoint__sched__sched_waking *args) {
    u32 tid = args->pid;
    u64 *w = wf_tid_word(tid);
    if (!WF_BIT(w, tid))
        return 0;
    struct wf_cur *c = wf_get(tid);
    if (!c || (c->state != WF_BLOCKED && c->state != WF_UNKNOWN))
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 d = (c->since && now > c->since) ? now - c->since : 0;
    s32 nr = c->state == WF_UNKNOWN ? -1 : c->nr, fd = c->state == WF_UNKNOWN ? -1 : c->fd;
    u32 wtgid, wtid, wctx;
    wf_waker(&wtgid, &wtid, &wctx);
    wf_close(c, tid, nr, fd, wtgid, wtid, wctx, d);
    c->blocked_ns += d;
    c->state = WF_RUNNABLE;
    c->since = now;
    c->by = 0;
    return 0;
}
#endif

/* interrupt contexts: a wakeup inside one is the interrupt's, never the interrupted task's */
static __always_inline void wf_push(u32 v) {
    u32 zero = 0;
    struct wf_ctx_stack *s = wf_ctxs.lookup(&zero);
    if (!s)
        return;
    u32 d = s->depth;
    if (d >= 4) {          /* deeper than any real nesting: entries were missed, start again */
        d = 0;
    }
    s->top[d & 3] = v;
    s->at[d & 3] = bpf_jiffies64();      /* inlined by the verifier: no clock read */
    s->depth = d + 1;
}

static __always_inline void wf_pop(void) {
    u32 zero = 0;
    struct wf_ctx_stack *s = wf_ctxs.lookup(&zero);
    if (s && s->depth)
        s->depth -= 1;
}

/* on raw tracepoints: a classic one builds the event's record in a buffer before it calls the
   program, on every softirq, device IRQ and hrtimer of the node whoever they interrupt (bench waitfor:
   interrupt markers).  Arguments: softirq_entry (vec_nr), irq_handler_entry (irq, action). */
int on_wf_softirq_entry(struct bpf_raw_tracepoint_args *ctx) {
    wf_push((WF_CTX_SOFTIRQ << 24) | ((u32)ctx->args[0] & 0xffffff));
    return 0;
}
int on_wf_softirq_exit(struct bpf_raw_tracepoint_args *ctx) {
    wf_pop();
    return 0;
}
int on_wf_irq_entry(struct bpf_raw_tracepoint_args *ctx) {
    wf_push((WF_CTX_HARDIRQ << 24) | ((u32)ctx->args[0] & 0xffffff));
    return 0;
}
int on_wf_irq_exit(struct bpf_raw_tracepoint_args *ctx) {
    wf_pop();
    return 0;
}
int on_wf_hrtimer_entry(struct bpf_raw_tracepoint_args *ctx) {
    wf_push(WF_CTX_HRTIMER << 24);
    return 0;
}
int on_wf_hrtimer_exit(struct bpf_raw_tracepoint_args *ctx) {
    wf_pop();
    return 0;
}
#endif
